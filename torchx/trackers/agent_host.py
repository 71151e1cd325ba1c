"""One warm tracker agent per machine, user and Python environment.

``import mlflow`` and opening a sqlite store cost about 9 s of CPU, and a job's launcher
and each of its ranks paid it in an agent of their own. The host pays it once per idle
period: it imports the backends' clients, then forks one agent per caller. The fork
starts in milliseconds with the caller's environment, working directory and stderr, and
applies the caller's calls exactly as ``python -m torchx.trackers.agent`` would.

- Only a launcher starts a host, never a job's own process: a scheduler ending the job
  would end the host, and every other caller's agent with it. A job's ranks use the host
  when there is one, else their own agent as before.
- Callers find it by a unix socket in a directory only this user can enter
  (``$XDG_RUNTIME_DIR/torchx`` or ``/tmp/torchx-<uid>``), named after the Python
  executable, the torchx version and its trackers' code, so another venv, version or
  edit never gets an old host.
- A caller that cannot reach a host falls back to its own agent; nothing is lost.
- The host exits after ``IDLE_SECONDS`` without a caller; agents it forked run on.
- ``TORCHX_TRACKER_AGENT_HOST=0`` turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Dict, Iterable, Iterator, List, Optional, Tuple

from torchx.trackers import agent

ENV_HOST = "TORCHX_TRACKER_AGENT_HOST"  # "0": every caller runs its own agent
ENV_IDLE = "TORCHX_TRACKER_AGENT_HOST_IDLE"  # seconds without a caller before the host exits
IDLE_SECONDS = 120.0
CONNECT_TIMEOUT = 5.0  # a starting host binds its socket within this
# what the host imports before it forks, per tracker its starter uses: the cost each
# agent used to pay itself
PRELOAD = {
    "mlflow": (
        "mlflow",
        "mlflow.tracking",
        "mlflow.store.tracking.sqlalchemy_store",
        "mlflow.store.db.utils",
        "torchx.trackers.mlflow_backend",
    ),
}
# the host's own environment: enough to run Python; each agent gets its caller's
HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", ENV_IDLE)
# forked agents need no native thread pools (a fork keeps only the forking thread)
HOST_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

logger = logging.getLogger(__name__)
_started: List[subprocess.Popen[bytes]] = []  # hosts this process started (reaped later)


def enabled() -> bool:
    return os.environ.get(ENV_HOST, "1") != "0" and hasattr(socket, "send_fds")


def _runtime_dir() -> Optional[Path]:
    """A directory only this user can enter, or None if it is not safely ours."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "torchx" if base else Path("/tmp") / f"torchx-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def socket_path() -> Optional[str]:
    """The host's socket for this Python and torchx (None where no safe place exists)."""
    import torchx

    runtime = _runtime_dir()
    if runtime is None:
        return None
    here = os.path.dirname(__file__)  # code changed since a host started: a new host
    sources = [os.path.join(here, f) for f in os.listdir(here) if f.endswith(".py")]
    changed = max(os.path.getmtime(f) for f in sources)
    key = f"{sys.executable}\0{torchx.__version__}\0{torchx.__file__}\0{changed}"
    path = str(runtime / f"agent-{hashlib.sha1(key.encode()).hexdigest()[:16]}.sock")
    return path if len(path) < 100 else None  # sun_path holds 108 bytes


def _connect(path: str) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)  # a host's full backlog would block a connect
    try:
        sock.connect(path)
        sock.settimeout(None)
        return sock
    except OSError:
        sock.close()
        return None


def _connect_ok(path: str) -> bool:
    sock = _connect(path)
    if sock is not None:
        sock.close()
    return sock is not None


def _start_host(path: str, trackers: Iterable[str]) -> None:
    env = {k: os.environ[k] for k in HOST_ENV if k in os.environ}
    env.update(HOST_THREADS)
    preload = sorted(set(trackers) & set(PRELOAD))
    fd = os.open(path + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with open(fd, "ab") as log:
        _started.append(
            subprocess.Popen(
                [sys.executable, "-m", "torchx.trackers.agent_host", path, *preload],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd="/",
            )
        )
    for proc in list(_started):  # the launcher's end exits at once (the host forks)
        if proc.poll() is not None:
            _started.remove(proc)


def may_start_host() -> bool:
    """A job's own processes never start a host (see the module docstring)."""
    return not os.environ.get("TORCHX_JOB_ID")


def connect(start: bool, stderr_fd: int, trackers: Iterable[str] = ()) -> Optional[socket.socket]:
    """A connection to a fresh agent forked by the host (None: run an agent of your own).

    ``start``: start a host if there is none, preloading the clients of ``trackers``.
    The agent's stderr is ``stderr_fd``.
    """
    if not enabled():
        return None
    path = socket_path()
    if path is None:
        return None
    sock = _connect(path)
    if sock is None and start and may_start_host():
        _start_host(path, trackers)
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while sock is None and time.monotonic() < deadline:
            time.sleep(0.01)
            sock = _connect(path)
    if sock is None:
        return None
    hello = {"env": dict(os.environ), "cwd": os.getcwd()}
    try:
        socket.send_fds(sock, [(json.dumps(hello) + "\n").encode()], [stderr_fd])
    except OSError:
        sock.close()
        return None
    return sock


def ensure_host(trackers: Iterable[str]) -> None:
    """Start a host unless one runs, without waiting: a launcher does this so the ranks
    of the job it is starting find one."""
    if not enabled() or not may_start_host():
        return
    path = socket_path()
    if path is None:
        return
    if not _connect_ok(path):
        _start_host(path, trackers)


# ---------------------------------------------------------------------------- the host


def _lines(first: bytes, conn: socket.socket) -> Iterator[bytes]:
    """The caller's call lines: those read with the hello, then the rest of the stream."""
    reader = conn.makefile("rb")
    *complete, partial = first.split(b"\n")
    for line in complete:
        yield line + b"\n"
    if partial:
        yield partial + reader.readline()
    yield from reader


def _hello(conn: socket.socket) -> Tuple[Dict[str, Any], List[int], bytes]:
    """The caller's first line (its env and cwd), the fds sent with it, and what follows."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
    while b"\n" not in data:
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("the caller left before saying hello")
        data += more
    line, _, rest = data.partition(b"\n")
    return json.loads(line), list(fds), rest


def _agent(conn: socket.socket) -> int:
    """In the forked child: become the caller's agent and serve its calls."""
    hello, fds, first = _hello(conn)
    os.environ.clear()
    os.environ.update(hello["env"])
    try:
        os.chdir(hello["cwd"])
    except OSError:
        pass
    if fds:
        os.dup2(fds[0], 2)
        os.close(fds[0])
    agent.log_to_stderr()
    out: IO[str] = conn.makefile("w", encoding="utf-8")
    code = agent.serve(_lines(first, conn), out)
    out.flush()
    return code


def _fork_agent(conn: socket.socket, listener: socket.socket, lock_fd: int) -> None:
    if os.fork():
        conn.close()
        return
    code = 1
    try:
        listener.close()
        os.close(lock_fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = _agent(conn)
    except EOFError:  # a caller that only checked the host is there
        code = 0
    except BaseException:
        logging.getLogger(__name__).exception("tracker agent failed")
    finally:
        try:
            conn.close()
        finally:
            os._exit(code)


def _preload(trackers: Iterable[str]) -> None:
    import importlib

    for name in [m for t in trackers for m in PRELOAD.get(t, ())]:
        try:
            importlib.import_module(name)
        except Exception:  # a backend not installed: its agents import what they need
            pass


def serve_host(path: str, idle: float, trackers: List[str]) -> int:
    lock_fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    deadline = time.monotonic() + 2.0  # a host that went idle finishes exiting first
    while True:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if _connect_ok(path) or time.monotonic() > deadline:
                return 0  # another host serves this socket
            time.sleep(0.05)
    agent.lower_priority()
    if os.fork():  # the starter reaps this process at once; the host lives on
        os._exit(0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked agents reap themselves
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    logger.info("tracker agent host %d serving %s", os.getpid(), path)
    _preload(trackers)  # callers queue meanwhile
    while True:
        ready, _, _ = select.select([listener], [], [], idle)
        if not ready:
            break
        conn, _ = listener.accept()
        _fork_agent(conn, listener, lock_fd)
    # idle: new callers start a new host from now on; those already queued are served
    os.unlink(path)
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            break
        conn.setblocking(True)
        _fork_agent(conn, listener, lock_fd)
    listener.close()
    logger.info("tracker agent host %d idle for %.0f s: exiting", os.getpid(), idle)
    return 0


def main() -> int:
    agent.log_to_stderr("torchx tracker agent host")
    idle = float(os.environ.get(ENV_IDLE) or IDLE_SECONDS)
    return serve_host(sys.argv[1], idle, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
