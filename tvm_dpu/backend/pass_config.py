"""PassContext config options of the "dpu" pipeline: ``relax.dpu.arch``, ``relax.dpu.calibration``,
``relax.dpu.fusion``, so a TVM user can choose them the way TVM's own passes are configured::

    with tvm.transform.PassContext(config={"relax.dpu.arch": "kv260", "relax.dpu.calibration": "calib.npz"}):
        ex = tvm.compile(mod, target="dpu")

TVM validates config keys in C++ against options registered with ``TVM_REGISTER_PASS_CONFIG_OPTION``, which has no
Python counterpart. So the options are registered by a few lines of C++ (`_SOURCE`) that call TVM's exported
``PassContext::RegisterConfigOption`` when loaded: compiled once with the C++ compiler the BYOC codegen uses
anyway, kept in the user's cache directory (`cache_dir()`, private to the user), and loaded from there by later
imports. The cached library is this package's own source compiled on this machine; a file there that is not
owned by this user, or that others may write, is not loaded. Without a C++ compiler the options are simply not
registered (`registered()` is False) and the pipeline options / target tags remain the way to choose.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import tvm

#: Config keys -> what they choose (all strings).
CONFIG_OPTIONS = {
    "relax.dpu.arch": "DPU arch: a preset name (tvm_dpu.list_presets()) or an arch.json path",
    "relax.dpu.calibration": "calibration data: an .npz path, or \"random\" (random inputs, chosen knowingly: no "
                             "warning)",
    "relax.dpu.fusion": "fusion planner: none | greedy | optimal",
}

_SOURCE = r"""// tvm-dpu: registers the PassContext config options of the "dpu" Relax pipeline when loaded.
#include <functional>
#include <tvm/ffi/any.h>
#include <tvm/ffi/string.h>
namespace tvm { namespace transform {
class PassContext {  // the one exported member used here (include/tvm/ir/transform.h is not in the wheel)
 public:
  static void RegisterConfigOption(const char* key, ::tvm::ffi::String value_type_str,
                                   std::function<::tvm::ffi::Any(::tvm::ffi::Any)> legalization);
};
}}  // namespace tvm::transform
namespace {
struct RegisterDPUOptions {
  RegisterDPUOptions() {
    for (const char* key : {KEYS}) {
      tvm::transform::PassContext::RegisterConfigOption(
          key, "str", [](tvm::ffi::Any v) -> tvm::ffi::Any { return v.cast<tvm::ffi::String>(); });
    }
  }
} registered;
}  // namespace
"""

_STATE: dict = {"loaded": None}


def cache_dir() -> Path:
    """`$TVM_DPU_CACHE_DIR`, else `$XDG_CACHE_HOME/tvm-dpu`, else `~/.cache/tvm-dpu`
    (tvm_dpu.security.trust.cache_dir)."""
    from tvm_dpu.security.trust import cache_dir as user_cache_dir

    return user_cache_dir()


def _tvm_lib_dir() -> Path:
    return Path(tvm.__file__).resolve().parent / "lib"


def _source() -> str:
    return _SOURCE.replace("KEYS", ", ".join(f'"{k}"' for k in CONFIG_OPTIONS))


def _library_name() -> str:
    """Named by what it depends on: the source and the TVM library it links against."""
    lib = _tvm_lib_dir() / "libtvm_compiler.so"
    st = lib.stat()
    key = "\n".join([_source(), str(lib), str(st.st_size), str(st.st_mtime_ns), tvm.__version__])
    return f"passconfig-{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


def _private(path: Path, regular: bool = False) -> bool:
    """Owned by this user and writable by nobody else (else it could hold someone else's code); with `regular`, a
    regular file too (not a link, and not a FIFO or device, which would block or never end the loader's read)."""
    from tvm_dpu.security.safe_io import not_private

    try:
        st = path.lstat() if regular else path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not_private(st) is None and (not regular or stat.S_ISREG(st.st_mode))


def _load(path: Path) -> bool:
    """Load the cached library if it is this user's alone; whether the options are registered after it."""
    if not (_private(path, regular=True) and _private(path.parent)):
        return False
    try:
        ctypes.CDLL(str(path))  # its static initializer registers the options
    except OSError:  # truncated or damaged: the caller rebuilds it
        return False
    return all(k in tvm.transform.PassContext.list_configs() for k in CONFIG_OPTIONS)


def _compile(out: Path, cxx: str) -> None:
    import tvm_ffi

    include = Path(tvm_ffi.__file__).resolve().parent / "include"
    lib_dir = _tvm_lib_dir()
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix="tvm_dpu_", dir=out.parent) as tmp:
        src, obj = Path(tmp) / "passconfig.cc", Path(tmp) / "passconfig.so"
        src.write_text(_source())
        cmd = [cxx, "-shared", "-fPIC", "-O1", "-std=c++17", "-I", str(include), str(src), "-o", str(obj),
               f"-L{lib_dir}", "-ltvm_compiler", f"-Wl,-rpath,{lib_dir}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OSError(" ".join(proc.stderr.split())[:400])
        os.chmod(obj, 0o644)
        os.replace(obj, out)  # atomic: a concurrent import sees the whole library or none


def register_pass_config() -> bool:
    """Register the config options in this process (compiling the registration library on first use); False if
    that is not possible here (no C++ compiler, an unwritable cache). Idempotent."""
    if _STATE["loaded"] is not None:
        return _STATE["loaded"]
    known = tvm.transform.PassContext.list_configs()
    if all(k in known for k in CONFIG_OPTIONS):  # registered already (e.g. by another copy of this package)
        _STATE["loaded"] = True
        return True
    ok = False
    try:
        path = cache_dir() / _library_name()
        ok = os.path.lexists(path) and _load(path)
        if not ok:  # absent, not this user's alone, not a regular file, or damaged: build it anew (replaced)
            cxx = os.environ.get("CXX") or "g++"
            if shutil.which(cxx) is None:
                raise OSError(f"no C++ compiler {cxx!r}")
            _compile(path, cxx)
            ok = _load(path)
    except OSError:
        ok = False
    _STATE["loaded"] = ok
    return ok


def registered() -> bool:
    """Whether the relax.dpu.* config options exist in this process."""
    return bool(_STATE["loaded"])


def config_value(key: str) -> str | None:
    """The current PassContext's value of `key` (None when unset or the options are not registered)."""
    if key not in CONFIG_OPTIONS:
        raise KeyError(key)
    cfg = tvm.transform.PassContext.current().config
    if cfg is None or key not in cfg:
        return None
    value = str(cfg[key]).strip()
    return value or None


__all__ = ["CONFIG_OPTIONS", "cache_dir", "config_value", "register_pass_config", "registered"]
