"""The CLI starts without TVM, numpy or onnx (`--version` and every `--help` import none of them); tvm-dpu still
registers with TVM as soon as TVM is imported; the code stays Python 3.10-compatible (pyproject: 3.10 to 3.13)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Imports that cost seconds (TVM, and torch through tvm_ffi) or at least tens of milliseconds each.
HEAVY = ("tvm", "tvm_ffi", "numpy", "onnx", "onnxruntime", "torch", "tqdm", "matplotlib", "cryptography")


def _run(code: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def _commands() -> list[str]:
    from tvm_dpu.cli import COMMANDS

    return list(COMMANDS)


def test_cli_import_version_and_help_load_no_heavy_module():
    code = f"""
import sys
from tvm_dpu.cli import main
heavy = {HEAVY!r}
loaded = {{}}
for argv in [["--version"], ["--help"]] + [[c, "--help"] for c in {_commands()!r}]:
    try:
        main(argv)
    except SystemExit:
        pass
    loaded[" ".join(argv)] = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(repr(loaded), file=sys.stderr)
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    loaded = eval(r.stderr.strip().splitlines()[-1])  # noqa: S307 - our own repr of a dict of lists
    assert len(loaded) == len(_commands()) + 2
    assert all(not mods for mods in loaded.values()), {k: v[:5] for k, v in loaded.items() if v}


def test_running_an_xmodel_imports_no_tvm():
    """`tvm-dpu run` of vai_c's MNIST xmodel (CONVs on the emulator, CPU ops on numpy) never imports TVM: the
    emulator's int8 GEMM kernel is only built where TVM is already loaded (emu_gemm), so a cold run does not pay
    the import. The outputs are those of a run with TVM loaded (both GEMM paths are exact)."""
    code = """
import sys
import numpy as np
from tvm_dpu.xmodel.runner import load_xmodel
r = load_xmodel({path!r})
x = np.random.default_rng(0).standard_normal(r.inputs[0].shape).astype(np.float32)
out = r.run({{r.inputs[0].name: x}})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tvm", "tvm_ffi")), file=sys.stderr)
np.save({out!r}, np.concatenate([np.asarray(o).ravel() for o in out]))
"""
    xmodel = ROOT / "tests" / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
    with tempfile.TemporaryDirectory() as tmp:
        cold, warm = Path(tmp) / "cold.npy", Path(tmp) / "warm.npy"
        r = _run(code.format(path=str(xmodel), out=str(cold)))
        assert r.returncode == 0, r.stderr
        assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr[-2000:]
        r = _run("import tvm\n" + code.format(path=str(xmodel), out=str(warm)))
        assert r.returncode == 0, r.stderr
        assert "'tvm'" in r.stderr.strip().splitlines()[-1]
        assert np.array_equal(np.load(cold), np.load(warm))


def test_tvm_registration_after_a_late_import_of_tvm():
    """`import tvm_dpu` first (no TVM yet), then `import tvm`: the target, pipeline and runtime are registered,
    and errors still cross TVM's FFI with their own type."""
    r = _run("""
import sys, tvm_dpu
assert "tvm" not in sys.modules
import tvm
from tvm import relax
assert "dpu" in tvm.target.Target("dpu").keys
relax.get_pipeline("dpu")
assert tvm.get_global_func("tvm_dpu.runtime.dispatch", allow_missing=True) is not None
from tvm_dpu.errors import ArtifactError
import tvm_ffi
f = tvm_ffi.convert(lambda: (_ for _ in ()).throw(ArtifactError("bad file")))
try:
    f()
except ArtifactError as e:
    print("typed", e)
""")
    assert r.returncode == 0, r.stderr
    assert "typed bad file" in r.stdout


def _interpreters() -> list[tuple[str, str]]:
    """(version, path) of other CPython interpreters on this machine that tvm-dpu supports."""
    text = (ROOT / "pyproject.toml").read_text()
    lo, hi = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', text).groups()
    found = []
    roots = [Path.home() / ".pyenv" / "versions", Path("/usr/bin"), Path("/usr/local/bin")]
    for minor in range(int(lo), int(hi)):
        for root in roots:
            cands = sorted(root.glob(f"3.{minor}.*/bin/python3.{minor}")) + [root / f"python3.{minor}"]
            ok = [c for c in cands if c.is_file() and os.access(c, os.X_OK)]
            if ok:
                found.append((f"3.{minor}", str(ok[-1])))
                break
    return found


def test_pyproject_allows_310_to_313():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10,<3.14"' in text


@pytest.mark.parametrize("version,python", _interpreters() or [pytest.param("-", "-", marks=pytest.mark.skip(
    reason="no other Python interpreter on this machine"))])
def test_code_compiles_and_cli_starts_on(version, python):
    """Every module compiles under that interpreter's grammar, and the CLI (stdlib only until a command runs)
    prints its version and help there."""
    r = _run("""
import pathlib, sys
bad = []
for f in sorted(pathlib.Path("tvm_dpu").rglob("*.py")):
    try:
        compile(f.read_text(), str(f), "exec", dont_inherit=True)
    except SyntaxError as e:
        bad.append(f"{f}:{e.lineno}: {e.msg}")
print(bad)
from tvm_dpu.cli import main
for argv in (["--version"], ["benchmark", "--help"]):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code == 0, argv
""".replace('pathlib.Path("tvm_dpu")', f'pathlib.Path({str(ROOT / "tvm_dpu")!r})'), python)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "[]", r.stdout
    assert "tvm-dpu 0.1.0" in r.stdout


@pytest.mark.parametrize("first", ["tvm_dpu.backend.dpu_compile", "tvm_dpu.backend.relax_pipeline",
                                   "tvm_dpu.backend.ext_module"])
def test_a_module_that_imports_tvm_first_does_not_break_registration(first):
    """TVM's first import can come from the top of a tvm_dpu module that registration itself needs (a benchmark
    importing backend.dpu_compile first): the post-import hook must not import that module half made (an
    ImportError before), and the plugin is registered once it has finished."""
    r = _run(f"""
import importlib
importlib.import_module({first!r})
import tvm_dpu.builder  # any later import lets the deferred registration run
from tvm import relax
print("dpu" in relax.pipeline.PIPELINE_MAP)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "True", r.stdout


def _probe_command(monkeypatch, run) -> None:
    """Replace the `inspect` command's function with `run` (its parser stays: one positional path)."""
    import dataclasses

    from tvm_dpu import cli

    monkeypatch.setitem(cli.COMMANDS, "inspect", dataclasses.replace(cli.COMMANDS["inspect"], run=run))


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_command_runs_with_fewer_collections_and_the_thresholds_come_back(monkeypatch, outcome):
    """While a command runs, generation 0 collects every GC_GEN0_THRESHOLD allocations, not CPython's 700 (a
    compile spent about 1 s of CPU in full collections); the caller's thresholds return afterwards, also when the
    command fails (tests and tools run commands in-process)."""
    import gc

    from tvm_dpu import cli
    from tvm_dpu.errors import ArtifactError

    seen = []

    def run(args):
        seen.append(gc.get_threshold())
        if outcome == "raises":
            raise ArtifactError("probe failed")
        return 0

    _probe_command(monkeypatch, run)
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        rc = cli.main(["inspect", str(ROOT / "README.md")])  # a file that exists: the CLI checks that first
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
    assert rc == (0 if outcome == "returns" else cli.EXIT_USER_ERROR)
    assert seen == [(cli.GC_GEN0_THRESHOLD, 10, 10)]


def test_the_cli_process_freezes_its_heap_at_exit():
    """After a command, the interpreter's exit does not scan the heap again: an atexit handler freezes it. The handler registered here first runs after tvm-dpu's (atexit runs them last in, first
    out) and sees the frozen heap; one registration however many commands run."""
    r = _run(f"""
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
import dataclasses
from tvm_dpu import cli
cli.COMMANDS["inspect"] = dataclasses.replace(cli.COMMANDS["inspect"], run=lambda args: 0)
codes = [cli.main(["inspect", {str(ROOT / "README.md")!r}]) for _ in range(3)]
print("frozen before exit:", gc.get_freeze_count() > 0, codes)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["frozen before exit: False [0, 0, 0]", "frozen at exit: True"], r.stdout


def test_cli_lets_openblas_workers_sleep_unless_the_user_chose():
    # OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when numpy loads it: the CLI sets it before any import of numpy (its
    # idle workers' default spin held a core through calibration), and keeps a value the user set.
    code = """
import os, sys
from tvm_dpu.cli import BLAS_THREAD_TIMEOUT, main
try:
    main(["--version"])
except SystemExit:
    pass
import numpy
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), BLAS_THREAD_TIMEOUT)
"""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    for given in (None, "7"):
        if given is not None:
            env["OPENBLAS_THREAD_TIMEOUT"] = given
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env=dict(env, PYTHONPATH=str(ROOT)))
        assert out.returncode == 0, out.stderr
        got, default = out.stdout.splitlines()[-1].split()
        assert got == (given or default) and int(default) < 28  # shorter than OpenBLAS's own spin
