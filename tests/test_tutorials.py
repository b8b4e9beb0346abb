"""Every tutorial runs to completion with small inputs (TVM_DPU_TUTORIAL_SMALL=1), each in a fresh process."""
from __future__ import annotations

import os
import subprocess
import sys
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
    env = dict(os.environ, TVM_DPU_TUTORIAL_SMALL="1")
    r = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{path.name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"{path.name} printed nothing"
