"""sha256 of every reduced zoo model's exported artifact and of each DPU subgraph's program, per arch and fusion
mode: a behaviour-preserving refactor must leave this table unchanged (`--compare old.json` lists what moved).

    python scripts/zoo_digests.py -o digests.json [--models a,b] [--archs X,Y] [--compare old.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path

ARCHS = ("DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152", "dnnvm-zu2")
FUSIONS = ("none", "optimal")


def digests(name: str, arch: str, fusion: str) -> dict:
    import tvm_dpu
    from tvm_dpu import zoo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch, fusion=fusion,
                              calibration=[zoo.random_input(name, reduced=True, seed=s) for s in range(2)],
                              progress=False)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.tvmdpu"
        model.export(path)
        artifact = hashlib.sha256(path.read_bytes()).hexdigest()
    programs = {sym: bytes(r.program_digest).hex() for sym, r in sorted(model.runners.items())}
    return {"artifact": artifact, "programs": programs}


def main(argv: list[str] | None = None) -> int:
    from tvm_dpu import zoo
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output")
    ap.add_argument("--models", default=",".join(zoo.MODELS))
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--fusions", default=",".join(FUSIONS))
    ap.add_argument("--compare")
    a = ap.parse_args(argv)
    table = {}
    for name in a.models.split(","):
        for arch in a.archs.split(","):
            for fusion in a.fusions.split(","):
                key = f"{name}/{arch}/{fusion}"
                try:
                    table[key] = digests(name, arch, fusion)
                except Exception as e:  # noqa: BLE001 - a model an arch cannot compile is a row, not a stop
                    table[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(key, table[key].get("artifact", table[key].get("error"))[:16], flush=True)
    if a.output:
        Path(a.output).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        moved = [k for k in sorted(set(old) | set(table)) if old.get(k) != table.get(k)]
        for k in moved:
            print("DIFFERS", k)
        print(f"{len(table) - len(moved)} of {len(table)} rows identical")
        return 1 if moved else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
