"""AMD's published DPUCZDX8G figures (benchmarks/data/published_figures.json, issue 35) and DPUCAHX8H (Alveo U50 /
U50LV / U280) figures (issue 39): load, validate, select.

Each row is one figure of one Vitis AI model-zoo table (or another AMD source): a model on a board, in a release,
with the DPU configuration the table states, a metric (latency_ms, fps, or dpu_ms: a DPU task time a driver
measured), single or multi thread, and the bound that figure gives on one core's DPU time per frame
(`dpu_ms_upper`, explained by the file's `bounds`). A row's
`network` is the tvm_dpu key of the network where we have it, and `vaic_xmodel` lists the public vai_c programs of
that network for that board (tests/data/xmodel/PUBLIC_NETWORKS.txt).

    from published import load_published, select
    rows = select(load_published(), network="mobilenetv2", board="kv260", threads="multi")
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from tvm_dpu.errors import ArtifactError
from tvm_dpu.schema import SchemaError, need_dict, need_int, need_list, need_str, parse_json

PUBLISHED = Path(__file__).resolve().parent / "data" / "published_figures.json"
#: The file is about 2 MB; the bound only keeps a wrong path (a huge file) from being parsed.
MAX_BYTES = 16 << 20
METRICS = ("latency_ms", "fps", "dpu_ms")
THREADS = ("single", "multi")
MATCHES = ("same", "family")
#: Most cores a row's configuration has: 4 DPUCZDX8G cores (PG338), 14 DPUCAHX8H engines on a U280 (PG367).
MAX_CORES = 16


class PublishedFiguresError(ArtifactError):
    """The published-figures file is malformed; the message names the file, the row and the field."""


@dataclass(frozen=True)
class PublishedRow:
    """One published figure (fields as in the JSON file; see its `_doc`)."""

    zoo_name: str
    model: str
    network: str | None
    match: str | None
    release: str
    board: str
    board_rev: str | None
    dpu: str
    arch: str
    cores: int
    freq_mhz: float
    isa: str | None
    metric: str
    threads: str
    value: float
    dpu_ms_upper: float
    bound: str
    source: str
    vaic_xmodel: tuple[str, ...] | None

    @property
    def key(self) -> tuple:
        """What makes a row unique: the same figure twice would weigh twice in a fit."""
        return (self.release, self.board, self.board_rev, self.zoo_name, self.metric, self.threads)


_FIELDS = tuple(f.name for f in fields(PublishedRow))
_OPTIONAL_STR = ("network", "match", "board_rev", "isa")


def _positive(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise SchemaError(f"{what} must be a positive number, got {v!r:.40}")
    return float(v)


def _row(raw, bounds: dict) -> PublishedRow:
    need_dict(raw, "row")
    missing = [f for f in _FIELDS if f not in raw]
    extra = sorted(set(raw) - set(_FIELDS))
    if missing or extra:
        raise SchemaError(f"fields missing {missing} / unknown {extra}")
    for f in _OPTIONAL_STR:
        if raw[f] is not None:
            need_str(raw[f], f)
    for f in ("zoo_name", "model", "release", "board", "dpu", "arch", "source"):
        need_str(raw[f], f)
    if raw["metric"] not in METRICS or raw["threads"] not in THREADS:
        raise SchemaError(f"metric/threads {raw['metric']!r}/{raw['threads']!r} not in {METRICS} x {THREADS}")
    if raw["match"] is not None and raw["match"] not in MATCHES:
        raise SchemaError(f"match {raw['match']!r} not in {MATCHES}")
    if (raw["network"] is None) != (raw["match"] is None):
        raise SchemaError("network and match must be both set or both null")
    if raw["bound"] not in bounds:
        raise SchemaError(f"bound {raw['bound']!r} is not one of the file's bounds {sorted(bounds)}")
    xm = raw["vaic_xmodel"]
    if xm is not None:
        xm = tuple(need_str(x, "vaic_xmodel[]") for x in need_list(xm, "vaic_xmodel"))
    return PublishedRow(**{**raw, "cores": need_int(raw["cores"], "cores", 1, MAX_CORES),
                           "freq_mhz": _positive(raw["freq_mhz"], "freq_mhz"),
                           "value": _positive(raw["value"], "value"),
                           "dpu_ms_upper": _positive(raw["dpu_ms_upper"], "dpu_ms_upper"), "vaic_xmodel": xm})


def expected_upper(row: PublishedRow) -> float:
    """The bound on one core's DPU ms per frame a figure gives: a latency or a measured DPU task time itself;
    1/fps single thread or on a single-core board; cores/fps multi-thread on a multi-core board (all cores busy,
    sharing the DDR)."""
    if row.metric in ("latency_ms", "dpu_ms"):
        return row.value
    return (row.cores if row.threads == "multi" else 1) * 1e3 / row.value


def load_published(path: Path | str = PUBLISHED) -> list[PublishedRow]:
    """Every row of the file, validated: all fields present and typed, values positive, dpu_ms_upper consistent
    with value (to its 4 printed decimals), a known bound, no row twice. PublishedFiguresError names the row."""
    path = Path(path)
    try:
        doc = need_dict(parse_json(path.read_bytes(), MAX_BYTES), "document")
        bounds = need_dict(doc.get("bounds"), "bounds")
        raw_rows = need_list(doc.get("rows"), "rows")
    except (SchemaError, OSError) as e:
        raise PublishedFiguresError(f"{path}: {e}") from None
    rows: list[PublishedRow] = []
    seen: dict[tuple, int] = {}
    for i, raw in enumerate(raw_rows):
        where = f"{path}: rows[{i}] ({raw.get('zoo_name') if isinstance(raw, dict) else raw!r:.40})"
        try:
            row = _row(raw, bounds)
        except SchemaError as e:
            raise PublishedFiguresError(f"{where}: {e}") from None
        if abs(row.dpu_ms_upper - expected_upper(row)) > 1e-4 * max(1.0, row.dpu_ms_upper):
            raise PublishedFiguresError(f"{where}: dpu_ms_upper {row.dpu_ms_upper} is not the bound of "
                                        f"{row.value} {row.metric} ({expected_upper(row):.4f})")
        if row.key in seen:
            raise PublishedFiguresError(f"{where}: the same figure as rows[{seen[row.key]}] {row.key}")
        seen[row.key] = i
        rows.append(row)
    return rows


def select(rows: Iterable[PublishedRow], **where) -> list[PublishedRow]:
    """The rows whose fields equal every keyword given (e.g. network="resnet50", board="kv260", release="2.5");
    a list or tuple value matches any of its members."""
    unknown = set(where) - set(_FIELDS)
    if unknown:
        raise ValueError(f"select: no field {sorted(unknown)}; fields are {', '.join(_FIELDS)}")

    def ok(r: PublishedRow) -> bool:
        return all(getattr(r, k) in v if isinstance(v, (list, tuple)) else getattr(r, k) == v
                   for k, v in where.items())
    return [r for r in rows if ok(r)]


__all__ = ["PUBLISHED", "PublishedFiguresError", "PublishedRow", "expected_upper", "load_published", "select"]
