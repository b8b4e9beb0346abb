"""The package layering of DESIGN.md ("Package layout", "Layering"), checked on the source with `ast`.

The import graph has an arrow for every `import` / `from ... import` of a tvm_dpu module anywhere in a file
(module level, inside functions, under `if TYPE_CHECKING:`), relative imports resolved. Three checks:

* no cycle among tvm_dpu modules, lazy imports included (an import of a.b.c also runs the package a.b's
  __init__, so that arrow counts for cycles unless the importer lives inside a.b: Python has that package
  half-initialised already). Imports under `if TYPE_CHECKING:` never run, so they cannot close a cycle and
  are left out of this check only;
* every arrow is allowed by LAYERS (data: layer -> the layers it may import);
* no module imports another module's private name (`from x import _name`).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "tvm_dpu"

#: Leaf modules: plain data types, errors and file formats, importable by every layer (they import only leaves).
LEAVES = frozenset({"tvm_dpu.errors", "tvm_dpu.types", "tvm_dpu.schema", "tvm_dpu.onnx_inputs",
                    # what a user loads and whether to trust it; utilities (whole packages of leaves)
                    "tvm_dpu.security", "tvm_dpu.util",
                    "tvm_dpu.serving.feeds",
                    # the op registry: data naming each stage's hook by module path; it imports only the errors,
                    # and a stage resolves only its own hooks (tests/test_ops_registry.py checks where they live)
                    "tvm_dpu.ops",
                    # the fusion-template registry, the same for templates (tests/test_templates.py)
                    "tvm_dpu.templates"})
#: The fixed-point arithmetic and DPU quantization rules (a leaf above arch).
QUANT_ARITH = frozenset({"tvm_dpu.quant.fixpoint", "tvm_dpu.quant.rules"})

#: Layer (a package or module; a module belongs to the longest layer that names it or a package above it) ->
#: what it may import besides itself and the leaves. None: anything (the top-level entry points).
LAYERS: dict[str, frozenset[str] | None] = {
    "tvm_dpu": None,  # only tvm_dpu/__init__.py itself (see layer_of): the public API, imported lazily
    "tvm_dpu.builder": None,
    "tvm_dpu.cli": None,
    # the VART-style runner and the benchmark run .tvmdpu artifacts and .xmodels alike (entry points)
    "tvm_dpu.serving.runner": None,
    "tvm_dpu.serving.benchmark": None,
    "tvm_dpu.report_html": None,
    "tvm_dpu.zoo": None,
    # leaves: nothing of the project but the errors
    "tvm_dpu.serving": frozenset(),  # the serving front's package itself (its modules have layers of their own)
    "tvm_dpu.errors": frozenset(),
    "tvm_dpu.types": frozenset(),
    "tvm_dpu.schema": frozenset(),
    # what a user loads and whether to trust it: the artifact container, the bytes of a compiled subgraph (written by
    # passes, read by runtime), bounded reads of regular files, signing and the trust policy (signing plus the user's
    # config)
    "tvm_dpu.security": frozenset(),
    "tvm_dpu.serving.feeds": frozenset(),
    # utilities: toolchains, post-import hooks (tvm-dpu registers with TVM once TVM is imported), progress bars
    # (only on a terminal), wall and process seconds per compile phase, protobuf wire framing (ONNX and XIR files)
    "tvm_dpu.util": frozenset(),
    "tvm_dpu.onnx_inputs": frozenset(),  # an ONNX file's graph inputs over protowire: the CLI's checks, frontend
    "tvm_dpu.ops": frozenset(),
    "tvm_dpu.templates": frozenset(),
    # arch imports nothing of the project
    "tvm_dpu.arch": frozenset(),
    # quant's arithmetic imports only arch; calibration / quantization / QDQ import sit above xgraph
    "tvm_dpu.quant.fixpoint": frozenset({"tvm_dpu.arch"}) | QUANT_ARITH,
    # the rules take the act_type codes from the ISA table (codegen.isa imports only the errors)
    "tvm_dpu.quant.rules": frozenset({"tvm_dpu.arch", "tvm_dpu.codegen.isa"}) | QUANT_ARITH,
    "tvm_dpu.quant": frozenset({"tvm_dpu.arch", "tvm_dpu.xgraph"}) | QUANT_ARITH,
    # xgraph never imports passes, frontend or runtime (nor anything above it)
    "tvm_dpu.xgraph": frozenset({"tvm_dpu.arch"}) | QUANT_ARITH,
    # frontend may use the DPU's arithmetic (e.g. the avg-pool factor) to recognise quantizers' models of it
    "tvm_dpu.frontend": frozenset({"tvm_dpu.arch"}) | QUANT_ARITH,
    # Relax-facing: the pattern table, partitioning and its report, Relax -> XGraph, tensors -> ONNX names
    "tvm_dpu.passes": frozenset({"tvm_dpu.arch", "tvm_dpu.frontend", "tvm_dpu.quant", "tvm_dpu.xgraph"})
    | QUANT_ARITH,
    # the backend: the "dpu" Relax pipeline, relax.ext.dpu (codegen entry, native modules), multicore
    # segments: it reaches every compiler stage; not the runtime (the codegen embeds programs whose format is a leaf)
    "tvm_dpu.backend": frozenset({"tvm_dpu.arch", "tvm_dpu.frontend", "tvm_dpu.quant", "tvm_dpu.xgraph",
                                  "tvm_dpu.passes", "tvm_dpu.fusion", "tvm_dpu.codegen", "tvm_dpu.timing"}),
    # codegen never imports runtime (the emulator is not the compiler) nor fusion's search; the plan it follows
    # is a leaf type, the templates are data
    "tvm_dpu.codegen": frozenset({"tvm_dpu.arch", "tvm_dpu.xgraph", "tvm_dpu.fusion.templates"}) | QUANT_ARITH,
    # fusion searches over codegen's feasibility and takes costs from timing
    "tvm_dpu.fusion": frozenset({"tvm_dpu.arch", "tvm_dpu.xgraph", "tvm_dpu.codegen", "tvm_dpu.timing"})
    | QUANT_ARITH,
    # timing imports only the ISA (codegen.isa and codegen.tiling, the bank-geometry rule of the row fetch and
    # the 10-bit fields), arch and leaf data types
    "tvm_dpu.timing": frozenset({"tvm_dpu.arch", "tvm_dpu.codegen.isa", "tvm_dpu.codegen.tiling"}),
    # runtime never imports frontend, passes, the builder or the CLI (nor the compiler: it runs what codegen
    # produced, decoding it with the ISA table)
    "tvm_dpu.runtime": frozenset({"tvm_dpu.arch", "tvm_dpu.xgraph", "tvm_dpu.codegen.isa", "tvm_dpu.timing",
                                  "tvm_dpu.emulator"}) | QUANT_ARITH,
    # the instruction emulators: they decode with the ISA table and record accesses for the dependency checker
    "tvm_dpu.emulator": frozenset({"tvm_dpu.arch", "tvm_dpu.codegen.isa", "tvm_dpu.codegen.dpuv3e_fields",
                                   "tvm_dpu.timing.depcheck"}) | QUANT_ARITH,
    # multi-board pipelines and custom-IP plugins sit above runtime (below the builder and the CLI)
    "tvm_dpu.pipeline": frozenset({"tvm_dpu.arch", "tvm_dpu.frontend", "tvm_dpu.quant", "tvm_dpu.xgraph",
                                   "tvm_dpu.passes", "tvm_dpu.backend", "tvm_dpu.fusion", "tvm_dpu.codegen",
                                   "tvm_dpu.timing", "tvm_dpu.runtime"}),
    "tvm_dpu.plugins": frozenset({"tvm_dpu.arch", "tvm_dpu.frontend", "tvm_dpu.quant", "tvm_dpu.xgraph",
                                  "tvm_dpu.passes", "tvm_dpu.backend", "tvm_dpu.fusion", "tvm_dpu.codegen",
                                  "tvm_dpu.timing", "tvm_dpu.runtime"}),
    # AMD's .xmodel files: read (schema tables over protowire), run on the runtime's emulator / device with
    # plugins' CPU runners, inspected with the disassembler and the timing model; written from a CompiledModel
    # (xmodel.commands is the CLI's code for .xmodel files: it renders with report_html)
    "tvm_dpu.xmodel": frozenset({"tvm_dpu.arch", "tvm_dpu.xgraph", "tvm_dpu.codegen", "tvm_dpu.timing",
                                 "tvm_dpu.runtime", "tvm_dpu.emulator", "tvm_dpu.plugins", "tvm_dpu.report_html"})
    | QUANT_ARITH,
}

#: Arrows allowed against LAYERS and left out of the cycle check, each with its reason (all lazy imports).
EXEMPT: dict[tuple[str, str], str] = {
    ("tvm_dpu.runtime.compiled_model", "tvm_dpu.xmodel.write"): "CompiledModel.export('m.xmodel') convenience",
    # compare compiles the network it rebuilt from an xmodel through the public entry point tvm_dpu.build.
    ("tvm_dpu.xmodel.compare", "tvm_dpu"): "compare compiles its QDQ rebuild with tvm_dpu.build",
    ("tvm_dpu.xmodel.write", "tvm_dpu"): "the writer records the package's __version__ in libs_info",
    # Only an artifact that names plugins reaches for their registry, to refuse a missing one at load.
    ("tvm_dpu.runtime.artifact", "tvm_dpu.plugins.registry"): "load checks the artifact's plugins are installed",
    # relax.get_pipeline("dpu", plugins=[...]) resolves plugins by name; only when plugins are asked for.
    ("tvm_dpu.backend.relax_pipeline", "tvm_dpu.plugins.glue"): "the dpu pipeline's plugins= option",
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """tvm_dpu module name -> (file, is a package __init__)."""
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module `name` denotes (a dotted name may end in an attribute: drop it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of `tree` and whether it sits under `if TYPE_CHECKING:` (never executed)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, typing_only))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return out


def _imports(module: str) -> list[tuple[str, str | None, int, bool]]:
    """(imported module, imported name or None, line, typing only) for every tvm_dpu import in `module`."""
    path, is_pkg = MODULES[module]
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node, typing_only in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(_resolve(a.name), None, node.lineno, typing_only) for a in node.names
                    if a.name.split(".")[0] == PKG]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source.split(".")[0] != PKG:
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in MODULES:  # `from pkg import submodule` (pkg's __init__ counts for cycles only)
                    out.append((sub, None, node.lineno, typing_only))
                else:
                    out.append((_resolve(source), a.name, node.lineno, typing_only))
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _hook_imports() -> None:
    """The hooks of the op registry (tvm_dpu/ops/) and of the fusion-template registry (tvm_dpu/templates/) are
    imports by name: each one counts as an import of the hook's module by the module that resolves it
    (`HOOK_USERS`), line 0."""
    from tvm_dpu import ops, templates

    for reg in (ops, templates):
        for d in reg.registry().values():
            for hook, user in reg.HOOK_USERS.items():
                ref = getattr(d, hook)
                if ref is not None:
                    IMPORTS[user].append((_resolve(reg.hook_module(hook, ref)), ref.rpartition(":")[2], 0, False))
    from tvm_dpu.codegen.compiler import ISA_COMPILERS

    for d in ops.registry().values():
        for isa, ref in d.isa_emitters:  # the emitters of further instruction sets: their set's compiler uses them
            user = ISA_COMPILERS[isa][0]
            IMPORTS[user].append((_resolve(ops.hook_module("emitter", ref)), ref.rpartition(":")[2], 0, False))


_hook_imports()


def layer_of(module: str) -> str | None:
    """The LAYERS key `module` belongs to: the longest naming it or a package above it ("tvm_dpu" itself only
    for tvm_dpu/__init__.py, so that a new top-level module must be given a layer)."""
    best = None
    for key in LAYERS:
        if module == key or (key != PKG and module.startswith(key + ".")):
            if best is None or len(key) > len(best):
                best = key
    return best


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"modules with no layer in LAYERS (add one): {missing}"


def _cycle_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, imports in IMPORTS.items():
        for target, _, _, typing_only in imports:
            if typing_only or target == m or (m, target) in EXEMPT:
                continue
            edges[m].add(target)
            # importing a.b.c runs a.b's __init__ first, unless m is inside a.b (then it is already running)
            parent = target.rpartition(".")[0]
            while parent and parent != PKG and m != parent and not m.startswith(parent + "."):
                edges[m].add(parent)
                parent = parent.rpartition(".")[0]
    return edges


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (a list of modules, first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _find_cycle(_cycle_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_reports_one():
    """The checker itself: a planted cycle is found and spelled out."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_layering():
    bad = []
    for m, imports in IMPORTS.items():
        allowed = LAYERS[layer_of(m)]
        if allowed is None:
            continue
        own = layer_of(m)
        for target, _, line, _ in imports:
            if target == m or (target != PKG and layer_of(target) == own) or _within(target, LEAVES):
                continue
            if _within(target, allowed) or (m, target) in EXEMPT:
                continue
            bad.append(f"{MODULES[m][0].relative_to(ROOT)}:{line}: {m} -> {target} (layer {own!r} may import "
                       f"{sorted(allowed | LEAVES)})")
    assert not bad, "layering violations:\n" + "\n".join(sorted(set(bad)))


def test_exemptions_are_still_needed():
    """An exemption whose import is gone must go too."""
    arrows = {(m, t) for m, imports in IMPORTS.items() for t, _, _, _ in imports}
    stale = [e for e in EXEMPT if e not in arrows]
    assert not stale, f"stale EXEMPT entries: {stale}"


def test_no_private_imports_across_modules():
    bad = [f"{MODULES[m][0].relative_to(ROOT)}:{line}: from {target} import {name}"
           for m, imports in IMPORTS.items() for target, name, line, _ in imports
           if name and name.startswith("_") and not name.startswith("__") and target != m]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("from tvm_dpu.codegen.conv import emit_conv", ("tvm_dpu.codegen.conv", "emit_conv")),
    ("from tvm_dpu.xgraph import ops", ("tvm_dpu.xgraph.ops", None)),
    ("import tvm_dpu.arch.arch", ("tvm_dpu.arch.arch", None)),
])
def test_resolution(source, expected, monkeypatch, tmp_path):
    """The checker itself: absolute, submodule and attribute imports land on the right module."""
    f = tmp_path / "probe.py"
    f.write_text(f"def f():\n    {source}\n")
    monkeypatch.setitem(MODULES, "tvm_dpu.probe", (f, False))
    assert _imports("tvm_dpu.probe")[0][:2] == expected


def test_type_checking_imports_are_marked(monkeypatch, tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tvm_dpu.errors import DPUError\n"
                 "from tvm_dpu.types import FMap\n")
    monkeypatch.setitem(MODULES, "tvm_dpu.probe", (f, False))
    assert [(t, typing_only) for t, _, _, typing_only in _imports("tvm_dpu.probe")] == \
        [("tvm_dpu.errors", True), ("tvm_dpu.types", False)]


#: Packages used from outside only through their package (their __init__ is the entry point).
ENTRY_ONLY = ("tvm_dpu.emulator",)


def test_entry_only_packages_are_imported_through_their_entry_point():
    bad = [f"{MODULES[m][0].relative_to(ROOT)}:{line}: {m} -> {target}"
           for m, imports in IMPORTS.items() for target, _name, line, _typing in imports
           for pkg in ENTRY_ONLY
           if target.startswith(pkg + ".") and not (m == pkg or m.startswith(pkg + "."))]
    assert not bad, "import these packages themselves, not their modules:\n" + "\n".join(bad)
