"""Which artifacts' native code this process may load: the trust policy.

An artifact carries a native library (the model's CPU part), and loading it runs code from the file. So
`tvm_dpu.load` loads the library only from an artifact that is one of:

1. signed by a trusted key: the keys passed as `trusted_keys`, else the keys listed in the user's trusted-keys file
   (`<config>/trusted_keys`, one key file path per line, relative paths from the config directory). When that file
   exists, signatures are mandatory for every load in this user's processes;
2. built by this user on this machine: `export` records the identity of every artifact it writes (`artifact_id`,
   which covers every byte) in `<config>/built` (newest last, the oldest dropped past `MAX_BUILT`), so a model
   compiled here runs here with no key management (the README's first command);
3. explicitly allowed unsigned: `trust="unsigned"` / `tvm-dpu run --allow-unsigned`, for an artifact from a source
   the user vouches for.

The trusted-keys file, the keys it lists and the build record are honoured only when they and their directory are
owned by this user (or root) and writable by nobody else, as ssh treats its files: otherwise a SignatureError names
the file and why, since anyone who can write there could vouch for any artifact.

Anything else (an unsigned artifact from elsewhere, or one signed by a key nobody listed) is refused with a
`SignatureError` saying how to trust it. `<config>` is `$TVM_DPU_CONFIG_DIR`, else `$XDG_CONFIG_HOME/tvm-dpu`, else
`~/.config/tvm-dpu`. Reading an artifact's header (`inspect`, `report`) loads no native code and needs no trust.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from tvm_dpu.security.container import FIXED_SIZE
from tvm_dpu.security.safe_io import read_regular, read_text
from tvm_dpu.security.signing import SignatureError

TRUST_MODES = ("auto", "unsigned")
#: Records kept in `<config>/built` (65 bytes each: a sha256 and a newline).
MAX_BUILT = 20000
_LOCK = threading.Lock()


def user_dir(env: str, xdg: str, fallback: str) -> Path:
    """`$<env>`, else `$<xdg>/tvm-dpu`, else `~/<fallback>/tvm-dpu` (a per-user directory, XDG style)."""
    given = os.environ.get(env)
    if given:
        return Path(given)
    base = os.environ.get(xdg)
    return (Path(base) if base else Path.home() / fallback) / "tvm-dpu"


def config_dir() -> Path:
    return user_dir("TVM_DPU_CONFIG_DIR", "XDG_CONFIG_HOME", ".config")


def cache_dir() -> Path:
    """`$TVM_DPU_CACHE_DIR`, else `$XDG_CACHE_HOME/tvm-dpu`, else `~/.cache/tvm-dpu`."""
    return user_dir("TVM_DPU_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def configured_keys() -> list[str] | None:
    """Key file paths from `<config>/trusted_keys` (None when the file does not exist: signatures optional)."""
    path = config_dir() / "trusted_keys"
    try:
        text = read_text(path, "trusted-keys file", SignatureError, private=True)
    except (FileNotFoundError, NotADirectoryError):  # no such file: signatures are optional
        return None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise SignatureError(f"{path}: the trusted-keys file lists no key (one key file path per line); remove it "
                             "to make signatures optional")
    paths = [str(config_dir() / k) if not os.path.isabs(k) else k for k in keys]
    for k in paths:  # a key another user can replace would let them sign anything: the same rule as the list
        try:
            read_regular(k, "key", SignatureError, private=True)
        except FileNotFoundError:
            raise SignatureError(f"{path}: lists key {k}, which does not exist") from None
    return paths


def artifact_id(fixed_part: bytes) -> str:
    """The identity recorded for an artifact: sha256 of its fixed-size container header (tvm_dpu.security.container),
    which holds the sha256 of everything after it. So it names every byte of the unsigned artifact at the cost
    of hashing FIXED_SIZE bytes; the loader verifies that stored digest before anything in the file is used."""
    return hashlib.sha256(bytes(fixed_part[:FIXED_SIZE])).hexdigest()


def record_build(path: str | os.PathLike[str]) -> None:
    """Remember that this user built the artifact at `path` (its unsigned body's sha256). A config directory that
    cannot be written only means the artifact will need a key or `--allow-unsigned` elsewhere: not an error."""
    with open(path, "rb") as f:
        digest = artifact_id(f.read(FIXED_SIZE))
    built = config_dir() / "built"
    with _LOCK:
        try:
            built.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                lines = _read_record(built).split()
            except FileNotFoundError:
                lines = []
            if digest in lines:
                return
            lines.append(digest)
            tmp = built.with_name(f"built.tmp{os.getpid()}.{threading.get_ident()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines[-MAX_BUILT:]) + "\n")
            os.replace(tmp, built)
        except (OSError, SignatureError):  # a record that is not honoured is not added to either
            pass


def _read_record(built: Path) -> str:
    return read_text(built, "build record", SignatureError, private=True)


def built_here(digest: str) -> bool:
    """Whether `<config>/built` records `digest`; SignatureError when the record exists but is not this user's
    alone (not honoured: anyone who can write it could vouch for any artifact)."""
    try:
        return digest in _read_record(config_dir() / "built").split()
    except (FileNotFoundError, NotADirectoryError):
        return False


def _by_key_or_choice(data: bytes, source: str, trusted_keys: Any, trust: str) -> bytes | None:
    """The policy's rules 1 and 3: the verified bytes when keys apply (given, or the trusted-keys file), the
    unsigned bytes under `trust="unsigned"`, None when neither decides."""
    from tvm_dpu.security import signing

    if trust not in TRUST_MODES:
        raise SignatureError(f"trust={trust!r}: choose one of {', '.join(TRUST_MODES)}")
    if trusted_keys is not None:
        return signing.verify(data, trusted_keys, source)
    keys = configured_keys()
    if keys is not None:
        return signing.verify(data, keys, f"{source} (signatures are required by {config_dir() / 'trusted_keys'})")
    return signing.split(data)[0] if trust == "unsigned" else None


def check_trust(data: bytes, source: str, trusted_keys: Any, trust: str) -> bytes:
    """The artifact bytes to parse (signature trailer removed) if the policy allows loading its native code;
    SignatureError saying how to trust it otherwise."""
    from tvm_dpu.security import signing

    decided = _by_key_or_choice(data, source, trusted_keys, trust)
    if decided is not None:
        return decided
    body, _ = signing.split(data)
    if built_here(artifact_id(body)):
        return body
    raise SignatureError(
        f"{source}: not built by this user on this machine and not signed by a trusted key, so its native code is "
        "not loaded. Trust it with a signature (tvm-dpu run --require-signature KEY.pub, trusted_keys=[...], or a "
        f"trusted-keys file in {config_dir()}), or explicitly: tvm-dpu run --allow-unsigned / "
        "tvm_dpu.load(..., trust='unsigned')")


def check_library_trust(data: bytes, source: str, trusted_keys: Any, trust: str) -> bytes:
    """The bytes of a plain shared library (TVM's export_library output) to load, if the policy allows it: a valid
    signature by a trusted key (the trailer `tvm_dpu.security.signing.sign` appends), or `trust="unsigned"`. "Built by
    this user" does not apply (tvm-dpu did not write the file); SignatureError saying how to trust it otherwise."""
    decided = _by_key_or_choice(data, source, trusted_keys, trust)
    if decided is not None:
        return decided
    raise SignatureError(
        f"{source}: a shared library is native code, and this one is not signed by a trusted key, so it is not "
        "loaded. Trust it with a signature (the file with tvm_dpu.security.signing.sign(data, KEY.key) appended, then "
        "tvm-dpu run --require-signature KEY.pub), or "
        "explicitly: tvm-dpu run --allow-unsigned / tvm_dpu.load(..., trust='unsigned'). inspect and report read "
        "it without loading it")
