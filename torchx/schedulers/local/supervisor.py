"""The per-app supervisor of ``local_cwd``: a detached process that starts the replicas,
copies their output to log files, applies retries and records every state change.

``launch`` forks it or starts it as a bare ``python -S -E`` (``command``), so it and what
it imports are stdlib only, plus psutil off Linux (``tests/util/test_import_graph.py``).

- It is a child subreaper (Linux), so descendants that daemonize or ``setsid`` re-parent
  to it, and each replica's processes carry the replica's tag (``processes``).
- A replica is its whole process tree: when its main process exits, whatever it left
  running is killed at once, as a lost node's.
- A cancel (SIGTERM, or the ``cancel`` file) or a gang failure sends SIGTERM to every
  process of the app, SIGKILL after ``GRACE_SECONDS``, and only then records the end.
- Output goes through pipes read here, so a replica's last line is on disk before its
  exit is recorded.
- With a ``stall_timeout``, an app whose replicas neither print nor report progress for
  that long is stopped like a gang failure and ends FAILED (``stalled: ...``), enforced
  here so it holds whether or not anyone waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Set

from torchx.runtime.watchdog import StallClock
from torchx.schedulers.local import failures
from torchx.schedulers.local import processes as procs
from torchx.schedulers.local import protocol as files
from torchx.schedulers.local.logs import LineBuffer
from torchx.schedulers.local.protocol import (
    CANCELLED,
    FAILED,
    GRACE_SECONDS,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ReplicaSpec,
    ReplicaState,
    Request,
    RoleSpec,
    State,
)

READ_SIZE = 1 << 20
# ``python -S -E -c BOOT PKG_ROOT APP_DIR``: the package's root first on the path, then main
BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1));"
    " from torchx.schedulers.local.supervisor import main; sys.exit(main())"
)


def command(app_dir: str) -> List[str]:
    """The argv that starts the supervisor of ``app_dir`` in a new interpreter."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    fast = ["-S", "-E"] if sys.platform.startswith("linux") else []
    return [sys.executable, *fast, "-c", BOOT, root, app_dir]


def last_line(path: str, limit: int = 300) -> str:
    """The last non-empty line of a log file (the usual place of a crash's message)."""
    try:
        with os.fdopen(files.open_private(path, os.O_RDONLY), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [
                ln.strip()
                for ln in f.read().decode(errors="replace").splitlines()
                if any(c.isalnum() for c in ln)
            ]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def failure_message(r: Replica) -> str:
    """Why ``r`` failed: the exception and rank that ended it (``failures``), else its
    exit code and the last line of its stderr."""
    found = failures.find(r.spec["stderr"], r.spec["error_file"])
    if found is not None:
        return f"replica {r.role}/{r.id} failed: {found}"[:500]  # one line, not a log
    msg = f"replica {r.role}/{r.id} exited with code {r.exit_code}"
    last = last_line(r.spec["stderr"])
    return f"{msg}: {last}" if last else msg


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Combined:
    """``combined.log`` of one replica: whole lines of both streams, one writer at a time.
    The last of its users closes it."""

    def __init__(self, path: str, users: int) -> None:
        self.fd = files.open_private(path)
        self.lock = threading.Lock()
        self.users = users

    def write(self, data: bytes) -> None:
        with self.lock:
            _write_all(self.fd, data)

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                os.close(self.fd)


class _Tee(threading.Thread):
    """Copies one pipe of a replica to its own log (as is) and to ``combined.log``."""

    def __init__(self, fd: int, own_path: str, combined: _Combined) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.own = files.open_private(own_path)
        self.combined = combined
        self.last_output = time.monotonic()  # for stall detection
        self.start()

    def run(self) -> None:
        lines = LineBuffer()
        try:
            while True:
                try:
                    chunk = os.read(self.fd, READ_SIZE)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                self.last_output = time.monotonic()
                _write_all(self.own, chunk)
                if complete := lines.feed(chunk):
                    self.combined.write(complete)
            if rest := lines.rest():
                self.combined.write(rest)
        finally:
            os.close(self.own)
            os.close(self.fd)
            self.combined.release()


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(r, 1031, READ_SIZE)  # F_SETPIPE_SZ: fewer wake-ups for chatty replicas
    return r, w


class Replica:
    def __init__(self, spec: ReplicaSpec, app_id: str) -> None:
        self.spec = spec
        self.role: str = spec["role"]
        self.id: int = spec["replica_id"]
        self.tag = f"{app_id}/{self.role}/{self.id}"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.pid: Optional[int] = None
        self.stamp: Optional[str] = None
        self.tees: List[_Tee] = []
        self.state = PENDING
        self.exit_code: Optional[int] = None
        self.start_error = ""  # why its command could not be started (then FAILED)

    def start(self) -> None:
        self.start_error = ""
        files.makedirs_private(os.path.dirname(self.spec["stdout"]))
        if os.path.exists(self.spec["error_file"]):
            os.remove(self.spec["error_file"])  # a fresh attempt gets a fresh reply file
        env = {**os.environ, **self.spec["env"], procs.REPLICA_ENV: self.tag}
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        try:
            self.proc = subprocess.Popen(
                self.spec["args"],
                env=env,
                cwd=self.spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
            )
        except OSError as e:
            os.close(out_r)
            os.close(err_r)
            self.start_error = f"failed to start {self.spec['args'][0]!r}: {e}"
            for path in (self.spec["stderr"], self.spec["combined"]):
                with open(files.open_private(path), "ab") as f:
                    f.write(f"{self.start_error}\n".encode())
            self.state, self.exit_code, self.pid = FAILED, 127, None
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        self.pid, self.stamp = self.proc.pid, procs.stamp(self.proc.pid)
        combined = _Combined(self.spec["combined"], 2)
        self.tees = [
            _Tee(out_r, self.spec["stdout"], combined),
            _Tee(err_r, self.spec["stderr"], combined),
        ]
        self.state, self.exit_code = RUNNING, None

    def exited(self, returncode: int) -> None:
        if self.proc is not None:
            self.proc.returncode = returncode  # reaped by the supervisor's waitpid(-1)
        self.exit_code = returncode
        self.state = SUCCEEDED if returncode == 0 else FAILED

    def drain(self, timeout: float = 10) -> None:
        """Wait until its output is on disk (the pipes close when its whole tree is gone;
        the timeout only matters for a process that cleared its environment and lives on)."""
        deadline = time.monotonic() + timeout
        for tee in self.tees:
            tee.join(timeout=max(0.0, deadline - time.monotonic()))

    def to_json(self) -> ReplicaState:
        return {
            "role": self.role,
            "id": self.id,
            "pid": self.pid,
            "stamp": self.stamp,
            "state": self.state,
            "exit_code": self.exit_code,
        }


class Supervisor:
    def __init__(self, app_dir: str) -> None:
        self.app_dir = app_dir
        request = files.load_request(app_dir)  # BadRecord: nothing started, nothing written
        if request is None:
            raise SystemExit(f"{app_dir}: no request")
        self.request: Request = request
        self.replicas = [Replica(s, request["app_id"]) for s in request["replicas"]]
        self.roles: Dict[str, RoleSpec] = self.request["roles"]
        self.retries_left = {name: r["max_retries"] for name, r in self.roles.items()}
        self.num_restarts = 0
        self.state = PENDING
        self.msg = ""
        self.cancel_requested = False
        self.started = time.time()
        self.exits: Dict[int, int] = {}
        self.quiet = 0  # > 0 while stopping replicas: exits are recorded, not handled
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        stall = self.request["stall_timeout"]
        progress = os.path.join(app_dir, files.PROGRESS)
        self.stall = StallClock(float(stall), progress) if stall else None

    def write_state(self) -> bool:
        """Record the state; False if it was already terminal on disk (then we must stop)."""
        doc: State = {
            "state": self.state,
            "num_restarts": self.num_restarts,
            "msg": self.msg,
            "supervisor_pid": os.getpid(),
            "replicas": [r.to_json() for r in self.replicas],
            "started": self.started,
            "updated": time.time(),
        }
        return files.transition(self.app_dir, doc) is doc

    def running(self) -> List[Replica]:
        return [r for r in self.replicas if r.state == RUNNING]

    def cancelling(self) -> bool:
        if not self.cancel_requested and os.path.exists(os.path.join(self.app_dir, files.CANCEL)):
            self.cancel_requested = True
        return self.cancel_requested

    def sleep(self, timeout: float) -> None:
        """Until a signal arrives (a child exited, a cancel) or ``timeout`` s passed."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            select.select([self.wake_r], [], [], timeout)
            os.read(self.wake_r, 4096)

    def collect(self) -> None:
        """Reap every exited child (orphans re-parent to us); remember replicas' codes."""
        mains = {r.pid for r in self.running()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in mains:
                self.exits[pid] = os.waitstatus_to_exitcode(status)

    def reap(self, targets: Optional[List[Replica]] = None) -> None:
        """Handle the exits of ``targets`` (default: every replica); others wait."""
        self.collect()
        for r in self.running() if targets is None else targets:
            if r.state == RUNNING and r.pid is not None and r.pid in self.exits:
                self.on_exit(r, self.exits.pop(r.pid))

    def processes(self, targets: Optional[List[Replica]]) -> Set[int]:
        """Live processes of ``targets`` (all our descendants when None)."""
        if not procs.own_children():
            return set()
        everything = procs.descendants_of([os.getpid()])
        if targets is None:
            found = everything
        else:
            tags = {r.tag for r in targets}
            found = {p for p in everything if procs.replica_tag(p) in tags}
            mains = {r.pid for r in targets if r.state == RUNNING and r.pid}
            found |= mains | procs.descendants_of(mains)
        return {p for p in found if procs.alive(p)}

    def stop(self, targets: Optional[List[Replica]], grace: float) -> None:
        """SIGTERM the processes of ``targets`` (None: every process of the app), SIGKILL
        what still runs after ``grace`` s; returns once all are gone and reaped."""
        self.quiet += 1
        try:
            pids = self.processes(targets)
            procs.signal_pids(pids, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while pids and time.monotonic() < deadline:
                self.sleep(0.05)
                self.reap(targets)
                pids = self.processes(targets)
            for _ in range(200):
                if not pids:
                    break
                procs.signal_pids(pids, signal.SIGKILL)
                self.sleep(0.01)
                self.reap(targets)
                pids = self.processes(targets)
            self.reap(targets)
            for r in self.replicas if targets is None else targets:
                r.drain(timeout=2)
        finally:
            self.quiet -= 1

    def kill_leftovers(self, r: Replica) -> None:
        """SIGKILL what the (exited) main process of ``r`` left running: its orphans are
        now our children (we are their subreaper), and carry its tag."""
        for _ in range(100):
            orphans = procs.own_children() - {x.pid for x in self.running()}
            if not orphans:
                return
            tree = orphans | procs.descendants_of(orphans)
            pids = {p for p in tree if procs.alive(p) and procs.replica_tag(p) == r.tag}
            if not pids:
                return
            procs.signal_pids(pids, signal.SIGKILL)
            self.sleep(0.01)
            self.collect()

    def on_exit(self, r: Replica, code: int) -> None:
        r.exited(code)
        if self.quiet:
            return  # ``stop`` ends the rest of its tree and drains its output
        self.kill_leftovers(r)
        r.drain()
        if r.state == FAILED:
            self.msg = failure_message(r)
            if not self.handle_failure(r):
                self.state = FAILED
        self.write_state()

    def role_ok(self, role: str) -> bool:
        """Whether a role can still succeed (an elastic role tolerates losing replicas
        down to its ``min_replicas``)."""
        members = [r for r in self.replicas if r.role == role]
        failed = sum(1 for r in members if r.state == FAILED)
        return len(members) - failed >= self.roles[role]["min_replicas"]

    def handle_failure(self, replica: Replica) -> bool:
        """Retry per policy; returns False when the app has failed."""
        role = replica.role
        if self.retries_left.get(role, 0) > 0:
            self.retries_left[role] -= 1
            policy = self.roles[role]["retry_policy"]
            if policy == "REPLICA":
                targets = [replica]
            elif policy == "ROLE":
                targets = [r for r in self.replicas if r.role == role]
            else:
                targets = list(self.replicas)
            self.stop([r for r in targets if r.state == RUNNING], GRACE_SECONDS)
            self.num_restarts += 1
            for r in targets:
                r.start()
            return True
        return self.role_ok(role)

    def stalled(self) -> bool:
        """True (with the app's message set) once nothing was printed or reported for
        ``stall_timeout`` s (``torchx.runtime.watchdog.StallClock``)."""
        if self.stall is None:
            return False
        for t in (t for r in self.running() for t in r.tees):
            self.stall.active(t.last_output)
        reason = self.stall.stalled()
        if reason is not None:
            self.msg = reason
        return reason is not None

    def _on_term(self, *_: Any) -> None:
        self.cancel_requested = True

    def start(self) -> bool:
        """Publish our pid (signals are handled from now on) and start the replicas;
        False if the app was cancelled or finished before it could start."""
        procs.set_child_subreaper()
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGTERM, self._on_term)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)  # handlers reset on exec: replicas get defaults
        files.write_atomic(
            os.path.join(self.app_dir, files.PID), f"{os.getpid()} {procs.stamp(os.getpid())}"
        )
        with files.locked(self.app_dir):
            cur = files.current_state(self.app_dir)
            if cur is not None and cur["state"] in files.TERMINAL:
                return False  # finalized already (a cancel before we started)
            late = time.time() - self.request["submitted"] > files.LAUNCH_TIMEOUT
            if late or self.cancelling():  # late: readers report it FAILED already
                files.end_unstarted(self.app_dir, self.request)
                return False
        for r in self.replicas:
            if self.cancelling():
                break
            r.start()
        return True

    def run(self) -> int:
        if not self.start():
            return 0
        stall = False
        if not self.cancelling():
            self.state = RUNNING
            if not self.write_state():  # someone finalized the app meanwhile
                self.stop(None, 0)
                return 0
        while not self.cancelling() and self.state != FAILED and self.running():
            if not any(r.pid in self.exits for r in self.running()):
                self.sleep(1.0)
            self.reap()
            if self.state != FAILED and self.running() and self.stalled():
                self.state = FAILED  # stopped below like a gang failure, never retried
                stall = True
        if self.cancelling():
            was_running = self.running()
            self.stop(None, GRACE_SECONDS)
            for r in was_running + [r for r in self.replicas if r.state == PENDING]:
                r.state = CANCELLED
            self.state, self.msg = CANCELLED, "cancelled"
        else:
            if self.state == FAILED and self.running() and not stall:
                self.write_state()  # the failure's message, while the others stop
            # a stall, like a cancel, is recorded once every process of the app is gone
            self.stop(None, GRACE_SECONDS)  # the other replicas, and anything left behind
            if self.state != FAILED and all(self.role_ok(role) for role in self.roles):
                self.state, self.msg = SUCCEEDED, ""
            else:
                self.state = FAILED
                if not self.msg:  # no replica's exit said why: one may not have started
                    unstarted = (r for r in self.replicas if r.start_error)
                    if (first := next(unstarted, None)) is not None:
                        self.msg = f"replica {first.role}/{first.id} {first.start_error}"
        self.write_state()
        return 0


def main(app_dir: Optional[str] = None) -> int:
    """Supervise the app of ``app_dir`` (default: ``sys.argv[1]``) to its end."""
    sup = Supervisor(app_dir or sys.argv[1])
    try:
        return sup.run()
    except Exception as e:  # a bug here must not leave processes or a state that lies
        traceback.print_exc()
        try:
            sup.stop(None, 0)
        finally:
            if sup.cancel_requested:
                sup.state, sup.msg = CANCELLED, "cancelled"
            else:
                sup.state, sup.msg = FAILED, f"the local supervisor failed: {e!r}"
            sup.write_state()
        return 1


if __name__ == "__main__":
    sys.exit(main())
