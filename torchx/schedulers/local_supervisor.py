"""The per-app supervisor of the local scheduler: a small detached process that
starts the replicas, copies their output to log files, applies retries and records
every state change on disk.

It is run as a script (``python local_supervisor.py APP_DIR``), not as a module of
the ``torchx`` package, so it starts fast: stdlib only (psutil when available).

Files in APP_DIR: ``request.json`` (written by the scheduler: what to run),
``state.json`` (written here, atomically, on every change), ``supervisor.log``.
SIGTERM (``torchx cancel``) ends every replica's process tree (TERM, then KILL after
a grace period) and marks the app CANCELLED. Output goes through pipes read here,
so a replica's last line is on disk before its exit is recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

GRACE_SECONDS = 5.0
SUCCEEDED, FAILED, CANCELLED, RUNNING, PENDING = (
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "RUNNING",
    "PENDING",
)


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def kill_tree(pid: int, sig: int) -> set:
    """Signal a replica's process group and every descendant (some leave the group)."""
    pids = {pid}
    try:
        import psutil

        pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    except Exception:
        pass
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.killpg(p, sig)  # descendants that started their own session
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def reap_stragglers(pids: set, grace: float) -> None:
    """KILL whatever of ``pids`` still runs after ``grace`` s (orphaned grandchildren)."""
    try:
        import psutil
    except ImportError:
        return
    procs = []
    for p in pids:
        try:
            procs.append(psutil.Process(p))
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def last_line(path: str, limit: int = 300) -> str:
    """The last non-empty line of a log file (the usual place of a crash's message)."""
    try:
        with open(path, "rb") as f:
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


class _Tee:
    """Copies one pipe of a replica to its own log and (whole lines) to combined.log."""

    def __init__(
        self, fd: int, own_path: str, combined: Any, combined_lock: threading.Lock
    ) -> None:
        self._fd = fd
        self._own = open(own_path, "ab", buffering=0)
        self._combined = combined
        self._lock = combined_lock
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            self._own.write(chunk)
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if cut:
                with self._lock:
                    self._combined.write(pending[:cut])
                pending = pending[cut:]
        if pending:
            with self._lock:
                self._combined.write(pending)
        self._own.close()
        os.close(self._fd)


class Replica:
    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec = spec
        self.role: str = spec["role"]
        self.id: int = spec["replica_id"]
        self.proc: Optional[subprocess.Popen] = None
        self.tees: List[_Tee] = []
        self.state = PENDING
        self.exit_code: Optional[int] = None
        self.combined: Any = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.spec["stdout"]), exist_ok=True)
        if os.path.exists(self.spec["error_file"]):
            os.remove(self.spec["error_file"])  # a fresh attempt gets a fresh reply file
        env = dict(os.environ)
        env.update(self.spec["env"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
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
            with open(self.spec["stderr"], "ab") as f:
                f.write(f"failed to start {self.spec['args'][0]!r}: {e}\n".encode())
            with open(self.spec["combined"], "ab") as f:
                f.write(f"failed to start {self.spec['args'][0]!r}: {e}\n".encode())
            self.state, self.exit_code = FAILED, 127
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        self.combined = open(self.spec["combined"], "ab", buffering=0)
        lock = threading.Lock()
        self.tees = [
            _Tee(out_r, self.spec["stdout"], self.combined, lock),
            _Tee(err_r, self.spec["stderr"], self.combined, lock),
        ]
        self.state = RUNNING

    def finish(self, returncode: int) -> None:
        """Record the exit once all its output is on disk."""
        for tee in self.tees:
            tee.thread.join(timeout=30)
        if self.combined is not None:
            self.combined.close()
            self.combined = None
        self.exit_code = returncode
        self.state = SUCCEEDED if returncode == 0 else FAILED

    def to_json(self) -> Dict[str, Any]:
        return {
            "role": self.role,
            "id": self.id,
            "pid": self.proc.pid if self.proc else None,
            "state": self.state,
            "exit_code": self.exit_code,
        }


class Supervisor:
    def __init__(self, app_dir: str) -> None:
        self.app_dir = app_dir
        with open(os.path.join(app_dir, "request.json")) as f:
            self.request = json.load(f)
        self.replicas = [Replica(s) for s in self.request["replicas"]]
        self.roles: Dict[str, Dict[str, Any]] = self.request["roles"]
        self.retries_left = {name: r["max_retries"] for name, r in self.roles.items()}
        self.num_restarts = 0
        self.state = PENDING
        self.msg = ""
        self.cancelled = threading.Event()
        self.signalled: set = set()
        self.started = time.time()

    def write_state(self) -> None:
        write_json_atomic(
            os.path.join(self.app_dir, "state.json"),
            {
                "state": self.state,
                "num_restarts": self.num_restarts,
                "msg": self.msg,
                "supervisor_pid": os.getpid(),
                "replicas": [r.to_json() for r in self.replicas],
                "started": self.started,
                "updated": time.time(),
            },
        )

    def by_pid(self, pid: int) -> Optional[Replica]:
        for r in self.replicas:
            if r.proc is not None and r.proc.pid == pid and r.state == RUNNING:
                return r
        return None

    def running(self) -> List[Replica]:
        return [r for r in self.replicas if r.state == RUNNING]

    def stop(self, replicas: List[Replica]) -> None:
        """TERM the replicas' trees, KILL after the grace period, reap them."""
        for r in replicas:
            if r.proc is not None:
                self.signalled |= kill_tree(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for r in replicas:
            if r.proc is None:
                continue
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
            kill_tree(r.proc.pid, signal.SIGKILL)  # stragglers that left the group
            r.finish(r.proc.returncode)

    def on_sigterm(self, *_: Any) -> None:
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        for r in self.running():
            if r.proc is not None:
                self.signalled |= kill_tree(r.proc.pid, signal.SIGTERM)
        timer = threading.Timer(GRACE_SECONDS, self._kill_remaining)
        timer.daemon = True
        timer.start()

    def _kill_remaining(self) -> None:
        for r in self.running():
            if r.proc is not None:
                kill_tree(r.proc.pid, signal.SIGKILL)

    def role_ok(self, role: str) -> bool:
        """Whether a role can still succeed.

        An elastic role tolerates losing nodes down to its min.
        """
        spec = self.roles[role]
        members = [r for r in self.replicas if r.role == role]
        failed = sum(1 for r in members if r.state == FAILED)
        return len(members) - failed >= spec["min_replicas"]

    def restart(self, replicas: List[Replica]) -> None:
        self.stop([r for r in replicas if r.state == RUNNING])
        self.num_restarts += 1
        for r in replicas:
            r.state, r.exit_code = PENDING, None
            r.start()

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
            self.restart(targets)
            return True
        return self.role_ok(role)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for r in self.replicas:
            if not self.cancelled.is_set():
                r.start()
        if self.cancelled.is_set():  # cancelled while starting: stop what did start
            for r in self.running():
                self.signalled |= kill_tree(r.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        self.state = RUNNING
        self.write_state()  # tells the scheduler the replicas started (and SIGTERM is handled)
        failed_app = False
        while self.running():
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            replica = self.by_pid(pid)
            if replica is None:
                continue
            replica.proc.returncode = os.waitstatus_to_exitcode(status)  # type: ignore[union-attr]
            replica.finish(replica.proc.returncode)  # type: ignore[union-attr]
            if self.cancelled.is_set():
                continue
            if replica.state == FAILED:
                self.msg = (
                    f"replica {replica.role}/{replica.id} exited with code {replica.exit_code}"
                )
                last = last_line(replica.spec["stderr"])
                if last:
                    self.msg += f": {last}"
                if not self.handle_failure(replica):
                    failed_app = True
                    self.write_state()
                    self.stop(self.running())
                    reap_stragglers(self.signalled, GRACE_SECONDS)
                    break
            self.write_state()
        if self.cancelled.is_set():
            self.stop(self.running())
            reap_stragglers(self.signalled, GRACE_SECONDS)
            self.state, self.msg = CANCELLED, "cancelled"
        elif failed_app or not all(self.role_ok(role) for role in self.roles):
            self.state = FAILED
        else:
            self.state = SUCCEEDED
            self.msg = ""
        self.write_state()
        return 0


def main() -> int:
    app_dir = sys.argv[1]
    return Supervisor(app_dir).run()


if __name__ == "__main__":
    sys.exit(main())
