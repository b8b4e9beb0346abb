"""Design-space exploration on a fixed-bitstream Alveo card (u50, u50lv, u280: presets.json "family_boards").

A Zynq part is a budget the DPUCZDX8G configurations are fitted into (dse.py); an Alveo card is not: AMD ships its
DPUCAHX8H overlays built (PG367: 2-3 cores of 3-5 engines, one image per engine, each engine on its own HBM pseudo
channel). What is left to choose there is which overlay (the card's name and its variants, e.g. u50lv with
DPUCAHX8H_ISA2 on 10 engines or u50lv-dwc with DPUCAHX8H_ISA2_DWC on 8), how many of its engines to use and how many
frames to send at once (the batch). The model is compiled for each overlay's target and timed on one engine of it
(timing/params_dpucahx8h.json); k engines run k frames side by side, so a batch of B frames takes ceil(B / k)
engine times and the card's frames/s is B over that, capped by the model's CPU ops on the host. Engines are taken
as independent (their own feature-map port and pseudo channel); the weight and instruction ports a core's engines
share are not modelled (docs/timing-model.md, DPUCAHX8H).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tvm_dpu.arch.arch import Arch, family_boards
from tvm_dpu.pipeline.plan import PlanError


@dataclass
class CardCandidate:
    """One way to run the model on a card: the overlay, the engines used, the batch and its predicted timing."""

    card: str
    overlay: str  # the board preset (u50lv, u50lv-dwc, ...)
    target: str  # its DPU target (DPUCAHX8H_ISA2, ...)
    engines: int
    batch: int
    freq_mhz: float
    latency_ms: float  # one frame on one engine
    batch_ms: float  # the whole batch over `engines` engines
    fps: float
    host_bound: bool  # throughput limited by the CPU ops, not by the engines
    cpu_ms: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def is_card(name: str) -> bool:
    return any(a.name == name.strip().lower() for a in family_boards())


def card_overlays(card: str) -> list[Arch]:
    """The overlays AMD ships for `card`: its preset and its variants (`card`-suffix, e.g. u50lv-dwc)."""
    key = card.strip().lower()
    found = [a for a in family_boards() if a.name == key or a.name.startswith(key + "-")]
    if not found:
        raise PlanError(f"{card!r} is not an Alveo card preset; cards: {sorted(a.name for a in family_boards())}")
    return sorted(found, key=lambda a: a.name)


def card_candidates(card: str, overlay: Arch, cycles: float, cpu_ms: float, batches: Sequence[int] | None = None,
                    clocks_mhz: Sequence[float] | None = None) -> list[CardCandidate]:
    """Every (engines, batch, clock) of one overlay for a model taking `cycles` on one engine (at the overlay's
    clock; another clock moves the HBM's bytes per cycle, which this rescaling ignores). Default batches: 1 and the
    overlay's engine count; default clock: the overlay's. Engine counts that would leave an engine idle for the
    whole batch are not listed (the fewer engines give the same time)."""
    out = []
    host_fps = 1e3 / cpu_ms if cpu_ms > 0 else math.inf
    for mhz in clocks_mhz or (overlay.freq_mhz,):
        lat = cycles / (mhz * 1e3)
        for b in sorted(set(batches or (1, overlay.cores))):
            # only the fewest engines that finish the batch in each number of rounds: more would sit idle
            for k in sorted({math.ceil(b / r) for r in range(1, b + 1) if math.ceil(b / r) <= overlay.cores}):
                batch_ms = math.ceil(b / k) * lat
                engine_fps = b * 1e3 / batch_ms
                out.append(CardCandidate(card, overlay.name, overlay.dpu_name, k, b, float(mhz), lat, batch_ms,
                                         min(engine_fps, host_fps), host_fps < engine_fps, cpu_ms))
    return out


def explore_card(card: str, build: Callable[[str], Any], batches: Sequence[int] | None = None,
                 clocks_mhz: Sequence[float] | None = None) -> tuple[list[CardCandidate], dict[str, str]]:
    """Rank every overlay x engines x batch of `card` for the model `build(overlay_name)` compiles (a CompiledModel).
    Returns (candidates best first: frames/s, then batch time, then fewer engines; {overlay: why skipped}) for the
    overlays the model does not compile for."""
    from tvm_dpu.pipeline.dse import model_cpu_seconds
    from tvm_dpu.runtime.model_timing import simulate_model

    out: list[CardCandidate] = []
    skipped: dict[str, str] = {}
    for ov in card_overlays(card):
        try:
            model = build(ov.name)
        except Exception as e:  # noqa: BLE001  (an overlay the model cannot use is reported, the others ranked)
            skipped[ov.name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        if not model.runners:
            skipped[ov.name] = "no DPU subgraph: every op stays on the CPU for this target"
            continue
        t = simulate_model(model, arch=ov)
        out += card_candidates(card, ov, t.cycles, model_cpu_seconds(model) * 1e3, batches, clocks_mhz)
    if not out:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise PlanError(f"{card}: the model runs on none of its overlays ({why})")
    out.sort(key=lambda c: (-c.fps, c.batch_ms, c.engines, c.overlay))
    return out, skipped


def card_table(cands: Sequence[CardCandidate], limit: int = 20) -> str:
    rows = [f"{'rank':>4} {'overlay':<10} {'target':<19} {'engines':>7} {'batch':>5} {'MHz':>6} {'frame ms':>9} "
            f"{'batch ms':>9} {'frames/s':>9}  bound"]
    for i, c in enumerate(cands[:limit]):
        rows.append(f"{i + 1:>4} {c.overlay:<10} {c.target:<19} {c.engines:>7} {c.batch:>5} {c.freq_mhz:>6g} "
                    f"{c.latency_ms:>9.3f} {c.batch_ms:>9.3f} {c.fps:>9.1f}  {'host' if c.host_bound else 'engines'}")
    cpu = max((c.cpu_ms for c in cands), default=0.0)
    if cpu > 0:
        rows.append(f"CPU ops on the host: {cpu:.3f} ms per frame (host cost model, every overlay)")
    return "\n".join(rows)


def card_summary(card: str) -> str:
    ovs = card_overlays(card)
    return (f"{card}: fixed overlays " + ", ".join(f"{a.name} ({a.cores} x {a.dpu_name} engines at "
                                                   f"{a.freq_mhz:g} MHz)" for a in ovs)
            + "; one frame per engine, each engine on its own HBM pseudo channel")
