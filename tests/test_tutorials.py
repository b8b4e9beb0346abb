"""Every tutorial runs to completion with small inputs (TVM_DPU_TUTORIAL_SMALL=1), each in a fresh process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.py"))


def test_there_are_tutorials_in_gallery_style():
    assert len(TUTORIALS) >= 4
    for t in TUTORIALS:
        text = t.read_text()
        title = text.split('"""')[1].strip().splitlines()
        assert len(title) >= 2 and set(title[1]) == {"="} and len(title[1]) >= len(title[0]), t.name
        assert "#" * 70 in text, t.name  # sphinx-gallery text blocks
        assert "TVM_DPU_TUTORIAL_SMALL" in text, t.name


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(path, tmp_path):
    # The tutorial's temporary files go here and must be gone when it ends. A short path: Ray puts sockets in it.
    scratch = Path(tempfile.mkdtemp(prefix="tt", dir="/tmp"))
    try:
        env = dict(os.environ, TVM_DPU_TUTORIAL_SMALL="1", TMPDIR=str(scratch))
        r = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"{path.name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        assert r.stdout.strip(), f"{path.name} printed nothing"
        # Ray's session directory and hidden files of libraries (onnxruntime's) are theirs to keep.
        left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith(("ray", ".")))
        assert not left, f"{path.name} left temporary files behind: {left}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
