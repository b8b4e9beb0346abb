"""A real Ray cluster of this test run's own: a head and worker nodes started with `ray start`, on free ports and
a private temp dir, stopped by killing exactly the processes it started (never `ray stop`, which would stop every
cluster on the machine)."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import tvm_dpu

#: The nodes' environment: the test's own (its TVM_DPU_CONFIG_DIR included), this checkout importable, and no
#: token authentication (the cluster listens on this machine only, for this test run).
_ENV_EXTRA = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def refresh_ray_auth() -> None:
    """Make this process's Ray read RAY_AUTH_MODE again. Ray caches the mode in the process, and a local
    `ray.init()` switches the process to token mode: a driver that ran one before would otherwise talk token auth
    to this cluster (and its actors would be cancelled). Ray's own test helper does it; a Ray without token
    authentication has nothing to refresh."""
    try:
        from ray._private.authentication_test_utils import reset_auth_token_state
    except ImportError:
        return
    reset_auth_token_state()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_range(width: int = 40) -> tuple[int, int]:
    """A run of `width` ports nothing listens on (checked, not reserved: good enough for a test)."""
    for _ in range(50):
        base = random.randrange(30000, 60000 - width)
        try:
            for p in range(base, base + width):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base, base + width - 1
    raise RuntimeError("no free port range for the Ray workers")


def _port_flags(head: bool) -> list[str]:
    lo, hi = _free_range()

    def single() -> int:
        # an ephemeral port the OS hands out may fall inside the workers' range, and `ray start` then refuses
        # ("a port number ... that is used by other components"): draw again
        while lo <= (p := _free_port()) <= hi:
            pass
        return p

    flags = [f"--node-manager-port={single()}", f"--object-manager-port={single()}",
             f"--min-worker-port={lo}", f"--max-worker-port={hi}", f"--metrics-export-port={single()}",
             f"--dashboard-agent-listen-port={single()}", f"--dashboard-agent-grpc-port={single()}",
             f"--runtime-env-agent-port={single()}"]
    if head:
        flags += ["--include-dashboard=false", f"--dashboard-port={single()}"]
    return flags


def _alive(pid: int) -> bool:
    """The process runs (a zombie, dead and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _process_table() -> tuple[dict[int, list[bytes]], dict[int, int]]:
    """(pid -> command line arguments, pid -> parent pid) of every process now."""
    cmds: dict[int, list[bytes]] = {}
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmds[int(d.name)] = (d / "cmdline").read_bytes().split(b"\0")
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return cmds, parent


def _with_descendants(roots: set[int], parent: dict[int, int]) -> set[int]:
    out, grew = set(roots), True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in out and pid not in out:
                out.add(pid)
                grew = True
    return out


class LocalRayCluster:
    """`ray start --head` plus `add_node` workers, each with its own custom resources and one CPU. `start` runs
    it all in a thread (the caller builds its models meanwhile; `wait` joins it)."""

    def __init__(self, head_resources: dict, object_store_bytes: int = 80_000_000):
        self.tmp = Path(tempfile.mkdtemp(prefix="tvmdpu_ray_", dir="/tmp"))  # short: Ray's socket paths are long
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        root = str(Path(tvm_dpu.__file__).resolve().parent.parent)
        self.env = dict(os.environ, **_ENV_EXTRA)
        self.env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])
        self.object_store_bytes = object_store_bytes
        self.head_resources = head_resources
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: Each started node's node-manager port (the head's first), as ray.nodes() reports it.
        self.node_manager_ports: list[int] = []

    def start(self, workers: list[dict]) -> None:
        """Start the head and one worker node per resource dict, in a background thread."""
        def run() -> None:
            try:
                self._ray_start(["--head", f"--port={self.port}", f"--temp-dir={self.tmp}"], self.head_resources,
                                head=True)
                for resources in workers:
                    self.add_node(resources)
                self.wait_nodes(1 + len(workers))
            except BaseException as e:  # noqa: BLE001 - raised by wait()
                self._error = e

        self._thread = threading.Thread(target=run, name="ray-cluster-start", daemon=True)
        self._thread.start()

    def wait_quietly(self) -> None:
        """Until `start` is done, whatever its outcome (before `stop`, so nothing starts after it)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        """Until `start` is done; its error, if any, raised here."""
        self.wait_quietly()
        if self._error is not None:
            raise RuntimeError(f"the test's Ray cluster did not start: {self._error}")

    def _ray_start(self, where: list[str], resources: dict, head: bool) -> None:
        flags = _port_flags(head)
        cmd = [shutil.which("ray") or "ray", "start", *where, "--num-cpus=1", f"--resources={json.dumps(resources)}",
               f"--object-store-memory={self.object_store_bytes}", "--disable-usage-stats", *flags]
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"ray start failed ({r.returncode}): {r.stderr[-1500:]}")
        self.node_manager_ports.append(int(flags[0].split("=")[1]))

    def kill_node(self, node_manager_port: int) -> list[int]:
        """SIGKILL the node listening on `node_manager_port` (one of this cluster's) as when its machine is lost:
        its raylet and every process under it (the workers running its actors, its agents). Returns their pids."""
        assert node_manager_port in self.node_manager_ports
        flag = f"--node_manager_port={node_manager_port}".encode()
        cmds, parent = _process_table()
        raylet = next((pid for pid, cmd in cmds.items() if flag in cmd and cmd[0].endswith(b"raylet")), None)
        if raylet is None or raylet not in self._pids():
            raise RuntimeError(f"no raylet of this cluster listens on port {node_manager_port}")
        doomed = _with_descendants({raylet}, parent)
        for pid in sorted(doomed - {raylet}) + [raylet]:  # children first: orphans would no longer be traceable
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return sorted(doomed)

    def add_node(self, resources: dict) -> None:
        """A second node (its own raylet process) joining this cluster."""
        self._ray_start([f"--address={self.address}"], resources, head=False)

    def wait_nodes(self, n: int, timeout_s: float = 60.0) -> None:
        """Until `n` nodes are alive (checked by a short-lived driver process, so this one stays unconnected)."""
        code = ("import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = subprocess.run([os.sys.executable, "-c", code, self.address], env=self.env, capture_output=True,
                               text=True, timeout=120)
            if r.returncode == 0 and int(r.stdout.split()[-1]) >= n:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster at {self.address} did not reach {n} nodes")

    def _pids(self) -> list[int]:
        """This cluster's processes: those naming its temp dir (the daemons `ray start` detached), and their
        descendants (the workers)."""
        cmds, parent = _process_table()
        tmp = str(self.tmp).encode()
        mine = _with_descendants({pid for pid, cmd in cmds.items() if any(tmp in c for c in cmd)}, parent)
        mine.discard(os.getpid())
        return sorted(mine)

    def stop(self) -> None:
        # Found once, before anything dies: a killed raylet's children are re-parented and no longer traceable.
        pids = set(self._pids())
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            pids |= set(self._pids())
            for pid in sorted(pids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.2)
            pids = {p for p in pids if _alive(p)}
            if not pids:
                break
        shutil.rmtree(self.tmp, ignore_errors=True)
