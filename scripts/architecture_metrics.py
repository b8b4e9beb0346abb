"""The package-shape counts issue 37 tracks, measured on the tree (not estimated):

* functions longer than 80 lines (whole definition, docstring included; nested functions count inside their
  parent), listed longest first;
* places that compare a fusion group's template by name (`.template == "conv_add"`, `template in RESIDENTS`, a
  registry lookup by a name literal, ...): callers should ask the template (tvm_dpu/templates/), not its name;
* modules at the top level of the package (tvm_dpu/*.py).

    python scripts/architecture_metrics.py [--json out.json] [--list]
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tvm_dpu"
LONG = 80
#: A comparison of a template by name: `x.template == ...`, `template != ...`, `x.template in ...`, a bare
#: `template` compared with a string or a constant name, or a template registry lookup by a name literal
#: (`tpl.get("conv_add")`, `hook("dw_pw", ...)`: a dict lookup by name is a comparison too).
_TEMPLATE_CMP = re.compile(r"\.template\s*(==|!=|in\b|not in\b)|\btemplate\s*(==|!=)\s*[\"A-Z]"
                           r"|\btemplate in (\(|[A-Z_]+)|\b(tpl|templates)\.(get|hook)\(\s*[\"']")


def long_functions(root: Path = PACKAGE, limit: int = LONG) -> list[tuple[int, str, str]]:
    out = []
    for p in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit:
                out.append((n.end_lineno - n.lineno + 1, str(p.relative_to(root.parent)), n.name))
    return sorted(out, key=lambda x: (-x[0], x[1], x[2]))


def template_name_comparisons(root: Path = PACKAGE) -> list[str]:
    out = []
    for p in sorted(root.rglob("*.py")):
        for k, line in enumerate(p.read_text().splitlines(), 1):
            if _TEMPLATE_CMP.search(line.split("#", 1)[0]):
                out.append(f"{p.relative_to(root.parent)}:{k}: {line.strip()}")
    return out


def top_level_modules(root: Path = PACKAGE) -> list[str]:
    return sorted(p.name for p in root.glob("*.py"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the counts and lists here")
    ap.add_argument("--list", action="store_true", help="print every long function, comparison and module")
    args = ap.parse_args(argv)
    longf, cmps, mods = long_functions(), template_name_comparisons(), top_level_modules()
    print(f"functions over {LONG} lines: {len(longf)}")
    print(f"template-name comparisons: {len(cmps)}")
    print(f"top-level modules: {len(mods)}")
    if args.list:
        print("\n".join(f"  {n:4d}  {p}:{f}" for n, p, f in longf))
        print("\n".join(f"  {c}" for c in cmps))
        print("  " + " ".join(mods))
    if args.json:
        Path(args.json).write_text(json.dumps({"long_functions": longf, "template_name_comparisons": cmps,
                                               "top_level_modules": mods}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
