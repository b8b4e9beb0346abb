"""Multi-board pipelines (the PYNQ-cluster paper, shared/seeds/002): stage planning on the timing model's per-op
times with link models as data (`plan`), per-stage compilation (`stages`; `multi` for models with several DPU
subgraphs and CPU ops between them), the `PipelineModel` runtime with a
local and a Ray executor (`model`, `local`, `ray_executor`) and DPU design-space exploration (`dse`)."""
from tvm_dpu.pipeline.plan import Board, Link, OpCost, Plan, PlanError, Stage, load_link, plan_chain
from tvm_dpu.pipeline.stages import PipelineError, StageSpec

__all__ = ["Board", "Link", "OpCost", "Plan", "PlanError", "PipelineError", "Stage", "StageSpec", "load_link",
           "plan_chain", "PipelineModel"]


def __getattr__(name: str):
    if name == "PipelineModel":  # lazily: it pulls in the runtime and TVM
        from tvm_dpu.pipeline.model import PipelineModel

        return PipelineModel
    raise AttributeError(name)
