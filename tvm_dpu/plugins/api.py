"""The plugin API for custom IP beside the DPU, after the Vitis AI compiler's (shared/seeds/001, "Compiling for
Customized Accelerator"): plugins run in order before DPU partitioning; each picks the operators its IP accelerates
(`partition`), compiles every subgraph it got (`compile`), and names the runners that execute them: "ref" (a
numpy reference), "sim" (an emulator of the IP) and "run" (the board, through pynq).

A plugin is a subclass of `Plugin`:

    @tvm_dpu.plugins.register_plugin
    class MyIP(Plugin):
        name = "my_ip"                # identifier: the Relax codegen is relax.ext.<name>
        device = "my_ip"              # shown in reports
        version = "1"                 # checked at load: an artifact runs only with the same plugin version
        def partition(self, graph):   # -> the ops (or op names) the IP takes
            return graph.filter_by_type("Sigmoid")
        def float_reference(self, subgraph, inputs): ...   # float outputs (calibration runs it)
        def compile(self, subgraph, calibration): ...       # -> bytes for the runners (data only)
        def ref(self, payload, inputs): ...                 # float inputs -> float outputs
        def sim(self, payload, inputs): ...
        def run(self, payload, inputs): ...                 # on the board (optional)

Nothing a plugin compiles is code: `compile` returns bytes that travel inside TVM's module (and the artifact);
at run time the installed plugin of that name and version interprets them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from tvm_dpu.errors import DPUError


class PluginError(DPUError):
    """A plugin that is missing, of another version, or that claimed or returned something invalid."""


@dataclass(eq=False)
class PluginOp:
    """One operator of the model as plugins see it (a Relax op call of main, with its ONNX provenance)."""

    tag: int
    name: str  # the ONNX node name(s) it came from ("+"-joined), else the Relax variable name
    type: str  # ONNX op type when known (e.g. "Softmax"), else the Relax op name without "relax." (e.g. "nn.softmax")
    relax_op: str  # e.g. "relax.nn.softmax"
    attrs: dict
    inputs: list["PluginOp"] = field(default_factory=list)  # producer ops (model inputs and constants omitted)
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_shape: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"PluginOp({self.name!r}, {self.type})"


@dataclass
class PluginGraph:
    """The operators still unclaimed when a plugin runs, with Vitis AI's filter helpers."""

    ops: list[PluginOp]

    def filter_by_name(self, name: str) -> list[PluginOp]:
        """The op(s) of this ONNX node / variable name."""
        return [o for o in self.ops if o.name == name or name in o.name.split("+")]

    def filter_by_type(self, *types: str) -> list[PluginOp]:
        """Ops of these types (ONNX op types like "Softmax", or Relax op names like "relax.nn.softmax")."""
        return [o for o in self.ops if o.type in types or o.relax_op in types]

    def filter_by_template(self, types: list[str]) -> list[list[PluginOp]]:
        """Chains o1 -> o2 -> ... whose types are `types` in order, each op consuming the previous one."""
        out = []
        for first in self.filter_by_type(types[0]):
            chain = [first]
            for t in types[1:]:
                nxt = [o for o in self.ops if (o.type == t or o.relax_op == t) and chain[-1] in o.inputs]
                if len(nxt) != 1:
                    break
                chain.append(nxt[0])
            if len(chain) == len(types):
                out.append(chain)
        return out

    def filter(self, predicate: Callable[[PluginOp], bool]) -> list[PluginOp]:
        """Ops for which `predicate(op)` is true."""
        return [o for o in self.ops if predicate(o)]


@dataclass
class SubgraphOp:
    """One Relax op of a plugin subgraph: `inputs` name subgraph inputs ("in0", ...) or earlier op outputs."""

    op: str  # Relax op name
    attrs: dict
    inputs: list[str]
    output: str
    consts: dict[int, np.ndarray] = field(default_factory=dict)  # argument index -> constant value


@dataclass
class PluginSubgraph:
    """What `compile` and `float_reference` get: the subgraph's ops in order, its inputs and outputs."""

    symbol: str
    ops: list[SubgraphOp]
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    outputs: list[str]
    node_names: list[str] = field(default_factory=list)  # ONNX nodes it computes


class Plugin:
    """Base class of custom-IP plugins (see the module docstring)."""

    name: str = ""
    device: str = ""
    version: str = "0"

    def partition(self, graph: PluginGraph) -> Iterable[Any]:
        """The ops this plugin's IP takes: PluginOp objects, op names, or groups (lists) of them. Adjacent claimed
        ops merge into one subgraph as far as possible without creating a cycle (Vitis AI's merge_subgraph).
        A plugin that only supplies XIR CPU ops (`cpu_ops`) claims nothing by default."""
        if self.cpu_ops:
            return []
        raise NotImplementedError

    def float_reference(self, subgraph: PluginSubgraph, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Float outputs of the subgraph (the calibration run computes the model with it)."""
        raise NotImplementedError

    def compile(self, subgraph: PluginSubgraph, calibration: list[list[np.ndarray]]) -> bytes:
        """Bytes the runners need (e.g. fixed-point parameters and tables), given the subgraph's recorded float
        inputs during calibration (one list of arrays per calibration sample)."""
        raise NotImplementedError

    def ref(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def sim(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def run(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise PluginError(f"plugin {self.name!r} has no board runner")

    #: XIR op types (Vitis AI custom ops, e.g. "Mylayer") this plugin computes on the host when a vai_c .xmodel's
    #: CPU subgraph holds them: `tvm_dpu.load("m.xmodel")` calls `cpu` for each such op.
    cpu_ops: tuple[str, ...] = ()

    def cpu(self, op_type: str, name: str, attrs: dict, inputs: list[np.ndarray],
            output_shape: tuple[int, ...]) -> np.ndarray:
        """The output of the XIR op `name` of type `op_type` (one of `cpu_ops`) from its inputs' values (int8 for
        fixed-point tensors, float32 otherwise, in the op's argument order), with the op's XIR attributes."""
        raise PluginError(f"plugin {self.name!r} lists cpu_ops but has no cpu runner")

    def runner(self, mode: str) -> Callable[[bytes, list[np.ndarray]], list[np.ndarray]]:
        if mode not in ("ref", "sim", "run"):
            raise PluginError(f"runner {mode!r}: choose 'ref', 'sim' or 'run'")
        return getattr(self, mode)


def call_plugin(plugin: Any, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, a plugin's own code, with anything it raises turned into one PluginError naming the plugin and
    the stage (partition, float_reference, compile, or a runner): a plugin's bug is reported as the plugin's."""
    try:
        return fn(*args)
    except DPUError:
        raise
    except Exception as e:  # noqa: BLE001 - third-party code: every failure is reported with its origin
        raise PluginError(f"plugin {plugin.name!r} failed in {stage}: {type(e).__name__}: {e}") from e


def checked_outputs(plugin: Any, stage: str, outs: Any, shapes: list[tuple[int, ...]] | None = None
                    ) -> list[np.ndarray]:
    """A plugin's outputs as float32 arrays, refused (PluginError naming plugin and stage) when they are not a
    list of numeric arrays, have the wrong count or shapes, or hold NaN/Inf (which the DPU side would silently
    turn into finite numbers, like non-finite model inputs)."""
    if outs is None or isinstance(outs, (str, bytes)) or not hasattr(outs, "__len__"):
        raise PluginError(f"plugin {plugin.name!r}: {stage} must return a list of arrays, got {type(outs).__name__}")
    out = []
    for i, o in enumerate(outs):
        try:
            a = np.asarray(o, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise PluginError(f"plugin {plugin.name!r}: {stage} output {i} is not a numeric array ({e})") from None
        if shapes is not None and i < len(shapes) and a.size != int(np.prod(shapes[i])):
            raise PluginError(f"plugin {plugin.name!r}: {stage} output {i} has shape {a.shape}, expected "
                              f"{tuple(shapes[i])}")
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        if bad:
            raise PluginError(f"plugin {plugin.name!r}: {stage} output {i} has {bad} NaN/Inf value(s) of {a.size}")
        out.append(a)
    if shapes is not None and len(out) != len(shapes):
        raise PluginError(f"plugin {plugin.name!r}: {stage} returned {len(out)} outputs, expected {len(shapes)}")
    return out
