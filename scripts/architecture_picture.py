"""Draw docs/architecture.png: tvm-dpu's packages and the imports between them, from the import graph that
tests/test_layering.py checks (so the picture is the tested layering, not a drawing of it).

Each box is a package (or a top-level module); an arrow A -> B means modules of A import modules of B, its width
growing with the number of import statements. The foundation row (arch, the op and template registries,
security, util and the leaf types) is imported from everywhere: those arrows are left out and the row says so.

    python scripts/architecture_picture.py [-o docs/architecture.png]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Rows, bottom to top, and the boxes in each, left to right (the compiler row in pipeline order).
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("arch", "ops", "templates", "security", "util", "errors", "types", "schema", "onnx_inputs")),
    ("compiler", ("frontend", "quant", "passes", "xgraph", "fusion", "codegen", "timing")),
    ("backend / runtime", ("backend", "runtime", "emulator")),
    ("above the runtime", ("pipeline", "plugins", "xmodel")),
    ("entry points", ("tvm_dpu", "builder", "cli", "serving", "report_html", "zoo")),
)


def node_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tvm_dpu"


def edges() -> Counter:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_layering  # the import graph the layering test checks

    out: Counter = Counter()
    for module, imports in test_layering.IMPORTS.items():
        for target, _name, _line, typing_only in imports:
            a, b = node_of(module), node_of(target)
            if not typing_only and a != b:
                out[(a, b)] += 1
    return out


def draw(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    pos = {}
    for y, (_, boxes) in enumerate(ROWS):
        for x, name in enumerate(boxes):
            pos[name] = ((x + 0.5) * 10.0 / len(boxes), y * 1.6)
    foundation = set(ROWS[0][1])
    fig, ax = plt.subplots(figsize=(13, 7.5), dpi=110)
    for (a, b), n in sorted(edges().items()):
        if a not in pos or b not in pos or b in foundation:
            continue
        (x0, y0), (x1, y1) = pos[a], pos[b]
        same_row = y0 == y1  # drawn as an arc under the row, from bottom edge to bottom edge
        ax.add_patch(FancyArrowPatch((x0, y0 - 0.22), (x1, y1 - 0.22 if same_row else y1 + 0.22), arrowstyle="-|>",
                                     mutation_scale=10, lw=0.4 + min(n, 40) / 12, color="#5b7fa6", alpha=0.55,
                                     connectionstyle=f"arc3,rad={0.3 if x1 > x0 else -0.3}" if same_row
                                     else "arc3,rad=0.08"))
    for y, (label, boxes) in enumerate(ROWS):
        ax.text(-0.25, y * 1.6, label, ha="right", va="center", fontsize=10, style="italic", color="#444")
        for name in boxes:
            x, yy = pos[name]
            ax.add_patch(FancyBboxPatch((x - 0.55, yy - 0.22), 1.1, 0.44, boxstyle="round,pad=0.02",
                                        fc="#f3efe2" if y == 0 else "#dfe9f5", ec="#333", lw=0.8))
            ax.text(x, yy, name if name != "tvm_dpu" else "tvm_dpu\n(public API)", ha="center", va="center",
                    fontsize=9)
    ax.text(5, -0.62, "the foundation row is imported from every layer (arrows into it not drawn)", ha="center",
            fontsize=9, color="#444")
    ax.set_xlim(-2.4, 10.2)
    ax.set_ylim(-0.9, (len(ROWS) - 1) * 1.6 + 0.5)
    ax.axis("off")
    ax.set_title("tvm-dpu packages and their imports (arrow: importer -> imported; width: import statements)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(ROOT / "docs" / "architecture.png"))
    args = ap.parse_args(argv)
    draw(Path(args.output))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
