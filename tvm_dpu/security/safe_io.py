"""Reading the files the tools are given: regular files only, each kind up to its own size limit.

A path naming a FIFO, a device (/dev/zero, a terminal), a socket or a directory is refused before a byte is read: an
endless stream would otherwise be read until memory runs out, and opening a FIFO waits for a writer forever (so
files are opened non-blocking and checked with fstat on the descriptor, the object actually read). A file larger
than its kind's limit is refused by its size, and at most limit + 1 bytes are ever read (the file may grow between
the check and the read).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from tvm_dpu.errors import ArtifactError, DPUError

#: The largest file of each kind the tools read (bytes). Artifacts, libraries and pipeline stages carry weights
#: (tens of MiB for the zoo; 2 GiB is protobuf's and most loaders' bound); the rest are small text or key files.
LIMITS: dict[str, int] = {
    "artifact": 2 << 30,
    "library": 2 << 30,
    "xmodel": (1 << 31) - 1,
    "key": 64 << 10,
    "signature": 64 << 10,
    "trusted-keys file": 1 << 20,
    "build record": 4 << 20,
    "pipeline manifest": 64 << 20,
    "JSON file": 64 << 20,
}


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str | os.PathLike[str], kind: str, error: type[DPUError] = ArtifactError,
                 private: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most LIMITS[kind]; `error` naming the file and why otherwise (not
    found, unreadable, not a regular file, too large). `private`: the file vouches for something (the trust
    policy's build record and trusted-keys file), so it and its directory must be this user's alone
    (not_private); a missing file then raises FileNotFoundError, which has a meaning to those callers."""
    limit = LIMITS[kind]
    if private:
        _check_private_dir(Path(path), kind, error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if private:
            raise
        raise error(f"{path}: cannot read the {kind}: no such file") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {kind}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{path}: the {kind} is {_kind_of(st.st_mode)}, not a regular file: refused")
    with os.fdopen(fd, "rb") as f:
        why = not_private(st) if private else None
        if why:
            raise error(f"{path}: the {kind} is not honoured: it is {why}; anyone who can write it could vouch for "
                        f"any artifact (chmod go-w {path}, or remove it)")
        if st.st_size > limit:
            raise error(f"{path}: the {kind} has {st.st_size} bytes, more than the {limit} a {kind} may have")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{path}: cannot read the {kind}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{path}: the {kind} grew past the {limit} bytes a {kind} may have while it was read")
    return data


def read_text(path: str | os.PathLike[str], kind: str, error: type[DPUError] = ArtifactError,
              private: bool = False) -> str:
    """read_regular decoded as UTF-8 (`error` if it is not)."""
    data = read_regular(path, kind, error, private)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{Path(path)}: the {kind} is not UTF-8 text (byte {e.start})") from None


def not_private(st: os.stat_result) -> str | None:
    """Why a file or directory with status `st` could hold another user's words (as ssh judges its files): owned by
    someone other than this user or root, or writable by its group or by others. None when it is safe."""
    if st.st_uid not in (os.getuid(), 0):
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {st.st_mode & 0o7777:04o})"
    return None


def _check_private_dir(path: Path, kind: str, error: type[DPUError]) -> None:
    if not os.path.lexists(path):  # nothing there vouches for anything, whoever may write the directory
        raise FileNotFoundError(path)
    try:
        st = os.stat(path.parent)
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    except OSError as e:
        raise error(f"{path.parent}: cannot read the directory of the {kind}: {e.strerror or e}") from None
    why = not_private(st)
    if why:
        raise error(f"{path}: the {kind} is not honoured: its directory {path.parent} is {why}; anyone who can write "
                    f"there could vouch for any artifact (chmod go-w {path.parent}, or remove the file)")


def check_regular(path: str | os.PathLike[str], kind: str, error: type[DPUError]) -> None:
    """`error` unless `path` is a regular file (for readers that bound their own reads, e.g. an .npz's members): a
    FIFO would block the open, a device would never end."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"{kind} {path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{kind} {path}: {_kind_of(st.st_mode)}, not a regular file: refused")
