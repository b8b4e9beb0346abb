"""
Export an artifact and deploy it on a Pynq board
================================================

``compiled.export(path)`` writes one ``.tvmdpu`` file holding everything a board needs: TVM's library with every
DPU subgraph's machine code, weights and tensor fix_points inside, the DPU fingerprint, a format version and
checksums (optionally an Ed25519 signature: ``export(path, sign="key.key")``). ``tvm_dpu.runtime.artifact.load(path, device=...)`` runs it in another process, on the
emulator or, on a board, through the Pynq driver.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for fewer calibration samples.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# Compile and export
# ------------------
# ``cross="aarch64"`` adds the CPU library cross-compiled for the board's aarch64 Linux (needs
# ``aarch64-linux-gnu-gcc``; Debian: ``apt-get install gcc-aarch64-linux-gnu``). The library for this machine
# is always included, so the same file also runs here.
import numpy as np

import tvm_dpu
from tvm_dpu import zoo

model = zoo.build_model("mixed_cnn")
compiled = tvm_dpu.build(model, arch="zcu102", progress=False,
                         calibration=[zoo.random_input(model, seed=s) for s in range(2 if SMALL else 8)])
tmp = tempfile.TemporaryDirectory(prefix="tvmdpu_tutorial_")  # removed when the script ends
workdir = Path(tmp.name)
cross = "aarch64" if shutil.which("aarch64-linux-gnu-gcc") else None
if cross is None:
    print("note: aarch64-linux-gnu-gcc is not on PATH, so the artifact holds this machine's CPU library only and "
          "will not run on the board; install the cross compiler (Debian/Ubuntu: apt-get install "
          "gcc-aarch64-linux-gnu) and run again to include the board's")
path = compiled.export(workdir / "mixed_cnn.tvmdpu", cross=cross)
print(f"wrote {path}: {path.stat().st_size} bytes, CPU library for the board included: {cross is not None}")

######################################################################
# Load in a fresh process
# -----------------------
# Loading verifies every checksum and every header value, checks the DPU fingerprint against the device, and only
# then loads the library and creates the Relax VM. Nothing but the (checksummed) library is executed from the file.
x = zoo.random_input(model, seed=3)
np.save(workdir / "x.npy", x)
script = f"""
import numpy as np
from tvm_dpu.runtime.artifact import load
m = load({str(path)!r})
np.save({str(workdir / 'y.npy')!r}, m.run(np.load({str(workdir / 'x.npy')!r}))[0])
"""
subprocess.run([sys.executable, "-c", script], check=True)
y = np.load(workdir / "y.npy")
assert np.array_equal(y, compiled.run(x)[0])
print(f"fresh-process output equals the in-process output (bit for bit); predicted class {int(y.argmax())}")

######################################################################
# On the board
# ------------
# On a ZCU102/ZCU104/KV260 image with PYNQ and a DPUCZDX8G bitstream (``dpu.bit`` + ``dpu.hwh``)::
#
#     pip install 'tvm-dpu[pynq]'
#     python -c "from tvm_dpu.runtime.artifact import load; import numpy as np; \
#                m = load('mixed_cnn.tvmdpu', device='pynq', bitfile='dpu.bit'); print(m.run(np.load('x.npy')))"
#
# The driver allocates contiguous buffers with ``pynq.allocate``, flushes them, writes the eight base-address
# registers and the instruction address of the DPU core through ``pynq.MMIO``, starts it and polls for done with
# a timeout (docs/deploy.md lists the register map and what is verified).
#
# Without a board, the same driver code runs against a *simulated* register file whose "start" executes the
# emulator on the buffers the driver prepared. This is a simulation, not hardware:
from tvm_dpu.runtime.artifact import load
from tvm_dpu.runtime.pynq_driver import PynqDevice
from tvm_dpu.runtime.sim_regfile import SimulatedPynq

board = SimulatedPynq("zcu102")
device = PynqDevice(bitfile="dpu.bit", pynq=board, timeout_s=5.0)
on_board = load(path, device=device)
assert np.array_equal(on_board.run(x)[0], y)
print(f"simulated board: {board.dpu.runs} DPU runs, {len(board.dpu.writes)} register writes")
