"""Generated blocks in Markdown files: the text between a begin and an end marker, rewritten from benchmark JSON."""
from __future__ import annotations

from pathlib import Path


def read_block(text: str, begin: str, end: str) -> str:
    """The block between the markers (without its surrounding newlines)."""
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace_block(text: str, begin: str, end: str, body: str) -> str:
    """`text` with the block between the markers replaced by `body`."""
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_block(path: Path, begin: str, end: str, body: str) -> None:
    path.write_text(replace_block(path.read_text(), begin, end, body))
