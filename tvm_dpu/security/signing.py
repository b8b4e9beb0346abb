"""Ed25519 signatures over whole artifacts (Vitis AI's xmodels are unsigned).

A signed artifact is the unsigned file followed by a fixed 112-byte trailer::

    offset from trailer start  size  field
    0                          8     magic b"TVMDPSIG"
    8                          4     trailer version (uint32 LE, 1)
    12                         4     reserved (0)
    16                         32    Ed25519 public key of the signer (raw)
    48                         64    Ed25519 signature of every byte before the trailer

The signature covers the whole unsigned file: header, DPU programs, verification data and the native CPU library.
Verifying it says the file is byte for byte what the holder of that private key wrote; it says nothing about
whether the key holder's build was trustworthy, and the CPU library is native code either way. `tvm_dpu.load`
checks the signature (when trusted keys are given) before any checksum is trusted or any library is loaded.

Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public) or raw 32-byte key files; `generate_keypair`
writes a pair.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArtifactError, DPUError

TRAILER_MAGIC = b"TVMDPSIG"
TRAILER_VERSION = 1
_TRAILER = struct.Struct("<8sII32s64s")
TRAILER_SIZE = _TRAILER.size


class SignatureError(ArtifactError):
    """A signature that is missing, malformed, made by an untrusted key or not valid for the file's bytes."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - cryptography is a dependency
        raise DPUError("signing needs the 'cryptography' package (pip install cryptography)") from None
    return serialization, ed25519


def _read_key_bytes(path: str | os.PathLike[str]) -> bytes:
    from tvm_dpu.security.safe_io import read_regular

    return read_regular(path, "key", SignatureError)


def load_private_key(path: str | os.PathLike[str]):
    serialization, ed25519 = _crypto()
    data = _read_key_bytes(path)
    try:
        if len(data) == 32:
            return ed25519.Ed25519PrivateKey.from_private_bytes(data)
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SignatureError(f"{path}: not an Ed25519 private key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{path}: the key is {type(key).__name__}, not Ed25519")
    return key


def public_key_bytes(spec) -> bytes:
    """Raw 32 bytes of a public key given as raw bytes, a key object, or a PEM / raw key file path (a private key
    file gives its public half)."""
    serialization, ed25519 = _crypto()
    if isinstance(spec, (bytes, bytearray)) and len(spec) == 32:
        return bytes(spec)
    if isinstance(spec, ed25519.Ed25519PublicKey):
        return spec.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if isinstance(spec, ed25519.Ed25519PrivateKey):
        return public_key_bytes(spec.public_key())
    data = _read_key_bytes(spec)
    if len(data) == 32:
        return data
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        return public_key_bytes(load_private_key(spec))
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SignatureError(f"{spec}: the key is {type(key).__name__}, not Ed25519")
    return public_key_bytes(key)


def generate_keypair(prefix: str | os.PathLike[str], overwrite: bool = False) -> tuple[Path, Path]:
    """Write PREFIX.key (private, PEM, mode 0600) and PREFIX.pub (public, PEM); returns both paths. An existing
    key file is never replaced unless `overwrite`: losing a private key orphans everything it signed."""
    serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    priv, pub = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    existing = [str(p) for p in (priv, pub) if p.exists()]
    if existing and not overwrite:
        raise SignatureError(f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: not "
                             "replacing a key (choose another prefix, or pass --force / overwrite=True)")
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(priv, 0o600)
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def sign(data: bytes, private_key_path: str | os.PathLike[str]) -> bytes:
    """`data` (an unsigned artifact) followed by its signature trailer."""
    key = load_private_key(private_key_path)
    return bytes(data) + _TRAILER.pack(TRAILER_MAGIC, TRAILER_VERSION, 0, public_key_bytes(key), key.sign(bytes(data)))


def split(data: bytes) -> tuple[bytes, tuple[bytes, bytes] | None]:
    """(unsigned bytes, (public key, signature) or None). A file without a trailer is returned whole."""
    if len(data) < TRAILER_SIZE or data[-TRAILER_SIZE:-TRAILER_SIZE + 8] != TRAILER_MAGIC:
        return data, None
    _, version, _, pub, sig = _TRAILER.unpack_from(data, len(data) - TRAILER_SIZE)
    if version != TRAILER_VERSION:
        raise SignatureError(f"signature trailer version {version} at offset {len(data) - TRAILER_SIZE + 8} is "
                             f"unknown (this reader knows {TRAILER_VERSION})")
    return data[:-TRAILER_SIZE], (pub, sig)


def trusted_key_list(trusted_keys: Any) -> list:
    """`trusted_keys` as a list of single key specs. One key may be given alone (a file path, raw 32 bytes or a
    key object) or several in a list/tuple/set; anything else is a SignatureError, so that a plain path string is
    never iterated character by character and raw key bytes never byte by byte."""
    _, ed25519 = _crypto()
    single = (str, os.PathLike, ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)
    if isinstance(trusted_keys, single) or (isinstance(trusted_keys, (bytes, bytearray)) and len(trusted_keys) == 32):
        return [trusted_keys]
    if isinstance(trusted_keys, (bytes, bytearray)):
        raise SignatureError(f"trusted_keys: {len(trusted_keys)} bytes is not a raw Ed25519 public key (32 bytes)")
    if not isinstance(trusted_keys, (list, tuple, set, frozenset)):
        raise SignatureError(f"trusted_keys must be a key (a key file path, 32 raw bytes or a key object) or a list "
                             f"of keys, got {type(trusted_keys).__name__}")
    keys = list(trusted_keys)
    for i, k in enumerate(keys):
        ok = isinstance(k, single) or (isinstance(k, (bytes, bytearray)) and len(k) == 32)
        if not ok:
            raise SignatureError(f"trusted_keys[{i}]: expected a key file path, 32 raw bytes or a key object, got "
                                 f"{type(k).__name__} {k!r:.40}")
    return keys


def verify(data: bytes, trusted_keys: Any, source: str) -> bytes:
    """The unsigned bytes of `data` if its signature is valid and made by one of `trusted_keys` (one key or a
    list: raw bytes, key objects or key file paths, see `trusted_key_list`); SignatureError otherwise."""
    _, ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    trusted = {public_key_bytes(k) for k in trusted_key_list(trusted_keys)}
    if not trusted:
        raise SignatureError(f"{source}: a signature is required but no trusted key was given")
    body, found = split(data)
    if found is None:
        raise SignatureError(f"{source}: not signed (no signature trailer at the end of the file), and a signature "
                             "is required")
    pub, sig = found
    if pub not in trusted:
        raise SignatureError(f"{source}: signed by key {pub.hex()[:16]}..., which is not a trusted key")
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(pub).verify(sig, body)
    except InvalidSignature:
        raise SignatureError(f"{source}: the signature does not match the file's bytes (modified after signing)"
                             ) from None
    return body
