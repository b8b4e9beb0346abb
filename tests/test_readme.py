"""The README stands on its own: every repository path it names exists (nothing outside the repository), its
picture is there, its command table lists every command, and it states the prerequisites and the limits."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TOP = ("docs/", "benchmarks/", "tutorials/", "examples/", "scripts/", "tvm_dpu/", "tests/")


def test_every_path_the_readme_names_is_in_the_repository():
    named = set(re.findall(r"[`(]((?:%s)[\w./{},-]*\w)" % "|".join(re.escape(t) for t in TOP), README))
    named |= set(re.findall(r"\]\(([\w./-]+\.\w+)\)", README))  # links and images (not code: `f(x)`)
    assert named
    missing = []
    for path in named:
        if "{" in path:  # tvm_dpu/{arch,frontend,...}
            head, rest = path.split("{", 1)
            paths = [head + p for p in rest.rstrip("}").split(",")]
        else:
            paths = [path]
        missing += [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing
    assert "shared/" not in README


def test_the_readme_has_its_picture_prerequisites_limits_and_every_command():
    from tvm_dpu.cli import COMMANDS

    picture = re.search(r"!\[[^]]+\]\(([^)]+\.png)\)", README)
    assert picture and (ROOT / picture.group(1)).stat().st_size > 10_000
    assert README.index("## Limits") < README.index("## Using it from Python")
    assert "C compiler" in README[:README.index("    $ ")]
    table = README[README.index("## Command line"):]
    table = table[:table.index("\n\n", table.index("| command"))]
    assert {c for c in COMMANDS if f"`tvm-dpu {c} " not in table} == set()
