"""Multi-board pipelines (the PYNQ-cluster paper, shared/seeds/002): stage planning on the timing model's per-op
times, link models as data. See `tvm_dpu.pipeline.plan`."""
from tvm_dpu.pipeline.plan import Board, Link, OpCost, Plan, PlanError, Stage, load_link, plan_chain

__all__ = ["Board", "Link", "OpCost", "Plan", "PlanError", "Stage", "load_link", "plan_chain"]
