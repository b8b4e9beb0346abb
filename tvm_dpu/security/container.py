"""A safe, versioned, checksummed binary container: a canonical JSON header plus named raw byte sections.

Used by the compiled-model artifact (runtime/artifact.py). Reading never executes anything from the file: the
header is JSON, the sections are raw bytes the caller interprets (arrays with a declared dtype and shape).

Layout (little-endian)::

    offset  size  field
    0       8     magic (caller-defined)
    8       4     format version (uint32)
    12      8     header length H (uint64)
    20      8     section area length B (uint64)
    28      32    sha256 of bytes 60 .. 60+H+B
    60      H     header: UTF-8 JSON, sorted keys; header["sections"][name] = {offset, nbytes, sha256}
    60+H    B     sections, each 16-byte aligned (zero filled), offsets relative to the section area
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from tvm_dpu.errors import ArtifactError
from tvm_dpu.schema import SchemaError, parse_json

_FIXED = struct.Struct("<8sIQQ32s")
#: The header is in memory already (the whole file is); this bound keeps a forged length from making the JSON
#: parser build a huge object tree.
MAX_HEADER_BYTES = 64 << 20
FIXED_SIZE = _FIXED.size
_ALIGN = 16


def parts(magic: bytes, version: int, header: dict[str, Any], sections: dict[str, Any]) -> list[Any]:
    """The container as a list of buffers (fixed part, header, sections with their zero padding), in file order.
    Sections (bytes or any contiguous buffer, e.g. a numpy array) are referenced, not copied, and the checksums
    are computed piece by piece: a 300 MB artifact is never held twice."""
    views = {name: memoryview(sections[name]).cast("B") for name in sorted(sections)}
    table = {}
    offset = 0
    for name, raw in views.items():
        offset += -offset % _ALIGN
        table[name] = {"offset": offset, "nbytes": raw.nbytes, "sha256": hashlib.sha256(raw).hexdigest()}
        offset += raw.nbytes
    head = dict(header)
    head["sections"] = table
    hbytes = json.dumps(head, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    digest = hashlib.sha256(hbytes)
    parts: list[Any] = [hbytes]
    pos = 0
    for name, raw in views.items():
        pad = table[name]["offset"] - pos
        if pad:
            parts.append(b"\0" * pad)
            digest.update(parts[-1])
        parts.append(raw)
        digest.update(raw)
        pos = table[name]["offset"] + raw.nbytes
    return [_FIXED.pack(magic, version, len(hbytes), offset, digest.digest())] + parts


def pack(magic: bytes, version: int, header: dict[str, Any], sections: dict[str, bytes]) -> bytes:
    """Bytes of a container; section order is the sorted name order, so equal inputs give identical bytes.
    `header` should carry a "format" tag, which `unpack` checks."""
    return b"".join(parts(magic, version, header, sections))


def write(path: Any, magic: bytes, version: int, header: dict[str, Any], sections: dict[str, bytes]) -> None:
    """Write the bytes `pack` gives to the open binary file or path `path`, without building them in memory."""
    pieces = parts(magic, version, header, sections)
    if hasattr(path, "write"):
        for p in pieces:
            path.write(p)
        return
    with open(path, "wb") as f:
        for p in pieces:
            f.write(p)


def section_span(data: Any, name: str) -> tuple[int, int]:
    """(offset from the container's start, nbytes) of section `name` in the container bytes `data` (any buffer),
    read from the header alone: no checksum is verified and no section is copied. For the writer's own, freshly
    packed bytes (to keep a view of a section); a container read from a file goes through `unpack`."""
    view = memoryview(data).cast("B")
    hlen = _FIXED.unpack_from(view, 0)[2]
    entry = json.loads(bytes(view[FIXED_SIZE:FIXED_SIZE + hlen]).decode())["sections"][name]
    return FIXED_SIZE + hlen + int(entry["offset"]), int(entry["nbytes"])


class Container:
    """A parsed, verified container: `header` (dict) and `section(name) -> bytes`."""

    def __init__(self, header: dict[str, Any], area: memoryview, area_start: int, source: str):
        self.header = header
        self._area = area
        self._start = area_start
        self.source = source
        self._verified: set[str] = set()

    def section(self, name: str) -> bytes:
        """The bytes of section `name`, checked against its own entry (place inside the file, sha256)."""
        return bytes(self.view(name))

    def view(self, name: str) -> memoryview:
        """Section `name` as a read-only view of the container's bytes (no copy), checked like `section`."""
        entry = self.header["sections"].get(name)
        if entry is None:
            raise ArtifactError(f"{self.source}: section {name!r} is missing")
        try:
            off, n, digest = entry["offset"], entry["nbytes"], entry["sha256"]
            if not (isinstance(off, int) and isinstance(n, int) and isinstance(digest, str)) or \
                    isinstance(off, bool) or isinstance(n, bool):
                raise TypeError
        except (KeyError, TypeError):
            raise ArtifactError(f"{self.source}: section table entry {name!r} is malformed: {entry!r:.120}") from None
        if off < 0 or n < 0 or off + n > len(self._area):
            raise ArtifactError(f"{self.source}: section {name!r} at offset {self._start + off} (+{n}) lies outside "
                                f"the file")
        raw = self._area[off: off + n]
        if name not in self._verified:
            if hashlib.sha256(raw).hexdigest() != digest:
                raise ArtifactError(f"{self.source}: section {name!r} (bytes {self._start + off}.."
                                    f"{self._start + off + n - 1}) does not match its own sha256 in the section table")
            self._verified.add(name)
        return raw

    def area_offset(self, name: str) -> int:
        """Offset of section `name` from the start of the container."""
        self.view(name)  # bounds-checked
        return self._start + int(self.header["sections"][name]["offset"])

    def has(self, name: str) -> bool:
        return name in self.header["sections"]


def unpack(data: Any, magic: bytes, version: int, source: str, kind: str, fmt: str, *, article: str = "a",
           label: str = "section {!r}") -> Container:
    """Parse and verify; one ArtifactError per defect, naming the file offset: wrong magic, unknown version,
    truncation, trailing bytes, checksum mismatch (naming the damaged section with `label`), malformed header or
    a format tag other than `fmt`. `kind` names the file type in messages ("XGraph", "tvm-dpu artifact")."""
    # Read through a view: the payload and section area are not copied (a 300 MB artifact is held once).
    data = memoryview(data).cast("B").toreadonly()
    if bytes(data[: len(magic)]) != magic:
        raise ArtifactError(f"{source}: not {article} {kind} file (magic at offset 0 is {bytes(data[:8])!r}, expected "
                            f"{magic!r})")
    if len(data) < FIXED_SIZE:
        raise ArtifactError(f"{source}: truncated: {len(data)} bytes, the fixed header needs {FIXED_SIZE}")
    _, ver, hlen, blen, digest = _FIXED.unpack_from(data, 0)
    if ver != version:
        raise ArtifactError(f"{source}: unknown {kind} format version {ver} at offset 8 (this reader knows version "
                            f"{version}; rebuild the file with this tvm-dpu)")
    end = FIXED_SIZE + hlen + blen
    if len(data) < end:
        raise ArtifactError(f"{source}: truncated: {len(data)} bytes, header (offset 12) and section (offset 20) "
                            f"lengths need {end}; data ends at offset {len(data)}")
    if len(data) > end:
        raise ArtifactError(f"{source}: {len(data) - end} unexpected trailing bytes from offset {end}")
    payload = data[FIXED_SIZE:end]
    if hashlib.sha256(payload).digest() != digest:
        raise ArtifactError(f"{source}: checksum mismatch (sha256 stored at offset 28): the file is corrupt, "
                            f"{_locate(payload, hlen, label)}")
    try:
        header = parse_json(bytes(payload[:hlen]), MAX_HEADER_BYTES)
        if not isinstance(header, dict):
            raise SchemaError("the header is not a JSON object")
    except SchemaError as e:
        raise ArtifactError(f"{source}: malformed header at offset {FIXED_SIZE}: {e}") from None
    if header.get("format") != fmt:
        raise ArtifactError(f"{source}: header at offset {FIXED_SIZE}: format tag {header.get('format')!r} is not "
                            f"{fmt!r}")
    if not isinstance(header.get("sections"), dict):
        raise ArtifactError(f"{source}: malformed header at offset {FIXED_SIZE}: no section table")
    return Container(header, payload[hlen:], FIXED_SIZE + hlen, source)


def _locate(payload: bytes, hlen: int, label: str) -> str:
    try:
        header = parse_json(bytes(payload[:hlen]), MAX_HEADER_BYTES)
        area = payload[hlen:]
        for name, e in sorted(header["sections"].items()):
            raw = area[e["offset"]: e["offset"] + e["nbytes"]]
            if hashlib.sha256(raw).hexdigest() != e["sha256"]:
                lo = FIXED_SIZE + hlen + e["offset"]
                return f"in {label.format(name)} (bytes {lo}..{lo + e['nbytes'] - 1})"
        return f"in the header or section padding (header bytes {FIXED_SIZE}..{FIXED_SIZE + hlen - 1})"
    except Exception:  # the header itself is damaged
        return f"in the JSON header (bytes {FIXED_SIZE}..{FIXED_SIZE + hlen - 1})"
