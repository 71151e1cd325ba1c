"""Stall detection that runs WITH the job, whatever the scheduler (docs/progress.md).

``python -m torchx.runtime.watchdog S -- cmd args...`` runs ``cmd`` in a session of its own,
copies its output through and, on a stall, ends ``cmd``'s process group and exits
``STALLED_EXIT``, leaving the reason as its last stderr line (``stall_reason_in``).
``local_cwd``'s supervisor and Ray's driver run with the job already: they use ``StallClock``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, List, Optional, Tuple, Union

STALLED_EXIT = 124  # as coreutils' ``timeout``
MARK = "torchx-watchdog: "
CHECK_INTERVAL = 1.0
# a gap between two checks longer than this: the watchdog was stopped, not the job silent
SUSPEND_GAP = 10.0
GRACE = 10.0


COMMAND = ["python", "-m", "torchx.runtime.watchdog"]


def wrap(cmd: List[str], stall_timeout: Optional[float], *options: str) -> List[str]:
    """``cmd`` run under the watchdog with ``stall_timeout`` (and ``options``: ``--peers
    GLOB``, ``--beacon PATH``, ``--only-where NAME=VALUE``); ``cmd`` itself without a
    timeout."""
    return [*COMMAND, f"{stall_timeout:g}", *options, "--", *cmd] if stall_timeout else cmd


def unwrap(cmd: List[str]) -> List[str]:
    """The replica's own command from a (maybe) wrapped one (``wrap``'s inverse)."""
    wrapped = cmd[: len(COMMAND)] == COMMAND and "--" in cmd
    return cmd[cmd.index("--") + 1 :] if wrapped else cmd


def stall_reason_in(text: str) -> Optional[str]:
    """The stall reason a watchdog left in a replica's output ``text`` (its tail), or None."""
    for line in reversed(text.splitlines()):
        at = line.find(MARK + "stalled: ")
        if at >= 0:
            return line[at + len(MARK) :].strip()
    return None


def step_of(report: Optional[Union[str, bytes]]) -> Optional[int]:
    """The step of a progress report (the progress file's JSON), None if it has none."""
    try:
        step = json.loads(report or "")["step"]
        return step if isinstance(step, int) else None
    except (ValueError, KeyError, TypeError):
        return None


class StallClock:
    """When a job last showed life: ``active()`` on output, a change of the progress file
    when ``stalled()`` looks. ``peers``: a glob of files whose mtime is a peer's output
    (Slurm's logs, the peers' ``beacon`` files), stat'ed only once this replica is silent."""

    def __init__(
        self,
        timeout: float,
        progress_path: Optional[str],
        peers: Optional[str] = None,
        beacon: Optional[str] = None,
    ) -> None:
        self.timeout = timeout
        self.progress_path = progress_path
        self.peers, self.beacon, self.touched = peers, beacon, 0.0
        self.progress_key: Optional[Tuple[int, int]] = self._progress_key()
        self.last = self.checked = time.monotonic()

    def _progress_key(self) -> Optional[Tuple[int, int]]:
        try:
            st = os.stat(self.progress_path or "")
            return st.st_ino, st.st_mtime_ns
        except OSError:
            return None

    def active(self, at: Optional[float] = None) -> None:
        now = time.monotonic()
        self.last = max(self.last, now if at is None else at)
        if self.beacon and at is None and now - self.touched >= 1.0:
            self.touched = now
            with contextlib.suppress(OSError), open(self.beacon, "a"):
                os.utime(self.beacon)

    def _peer_activity(self, now: float) -> None:
        """The newest peer file's mtime, as this process's monotonic time (wall clocks)."""
        mtimes = []
        for path in glob.glob(self.peers or ""):
            with contextlib.suppress(OSError):
                mtimes.append(os.stat(path).st_mtime)
        if mtimes:
            self.active(min(now, now - (time.time() - max(mtimes))))

    def stalled(self, step: Optional[int] = None) -> Optional[str]:
        """The stall's reason once nothing showed life for the timeout; else None. ``step``:
        the last step reported, for a clock without a progress file of its own."""
        now = time.monotonic()
        if now - self.checked > SUSPEND_GAP:
            self.last = now  # this process was stopped (the job suspended): start over
        self.checked = now
        key = self._progress_key()
        if key != self.progress_key:
            self.progress_key, self.last = key, now
        if now - self.last >= self.timeout and self.peers:
            self._peer_activity(now)
        if now - self.last < self.timeout:
            return None
        if self.progress_path:
            with contextlib.suppress(OSError), open(self.progress_path, "rb") as f:
                step = step_of(f.read())
        last = f"last step {step}" if step is not None else "no step reported"
        # the same text on every scheduler
        return f"stalled: no progress or output for {self.timeout:g} s ({last})"


def report(reason: str) -> None:
    """Leave ``reason`` where the replica's failure is read: its stderr's last line, and
    torchelastic's error file if the job has one (the stall is the failure: it replaces
    what the killed command may have written there)."""
    print(MARK + reason, file=sys.stderr, flush=True)
    if path := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        doc = {"message": {"message": reason, "extraInfo": {"timestamp": str(int(time.time()))}}}
        try:
            with open(path, "w") as f:
                json.dump(doc, f)
        except OSError as e:
            print(f"{MARK}cannot write {path}: {e}", file=sys.stderr, flush=True)


def _copy(src: IO[bytes], dst: IO[bytes], clock: StallClock) -> None:
    for chunk in iter(lambda: os.read(src.fileno(), 65536), b""):
        clock.active()
        dst.write(chunk)
        dst.flush()


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the command's process group, KILL it after ``GRACE`` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(GRACE)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run(
    timeout: float, cmd: List[str], peers: Optional[str] = None, beacon: Optional[str] = None
) -> int:
    """Run ``cmd`` under a watchdog of ``timeout`` s; its exit code, or ``STALLED_EXIT``."""
    clock = StallClock(timeout, os.environ.get("TORCHX_PROGRESS_FILE"), peers, beacon)
    # The stop signals are ours before the command starts: one that arrives while it starts
    # is held and forwarded once its group exists (Popen returns after the child's setsid
    # and exec), one that arrived before means it never starts. Handlers run in the main
    # thread between bytecodes, so a signal is either held or forwarded, never lost.
    held: List[int] = []
    group: Optional[int] = None

    def forward(signum: int, _: object) -> None:
        if group is None:
            held.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # this is the process' main
        signal.signal(sig, forward)
    if held:
        return 128 + held[0]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    group = proc.pid
    for signum in held:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signum)
    assert proc.stdout is not None and proc.stderr is not None
    copiers = [
        threading.Thread(target=_copy, args=(src, dst, clock), daemon=True)
        for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))
    ]
    for t in copiers:
        t.start()
    while True:
        try:
            code = proc.wait(CHECK_INTERVAL)
            break
        except subprocess.TimeoutExpired:
            pass
        reason = clock.stalled()
        if reason is not None:
            _end_group(proc)
            for t in copiers:
                t.join(GRACE)
            report(reason)
            return STALLED_EXIT
    for t in copiers:
        t.join(GRACE)
    return code if code >= 0 else 128 - code


USAGE = (
    "usage: python -m torchx.runtime.watchdog SECONDS [--peers GLOB] [--beacon PATH]"
    " [--only-where NAME=VALUE] -- CMD"
)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    head, cmd = (
        (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else ([], [])
    )
    options = dict(zip(head[1::2], head[2::2], strict=False))  # pairs: checked below
    try:
        timeout = float(head[0])
    except (IndexError, ValueError):
        timeout = 0.0
    known = {"--peers", "--beacon", "--only-where"}
    if not cmd or not timeout > 0 or len(head) % 2 == 0 or set(options) - known:
        print(USAGE, file=sys.stderr)
        return 2
    # ``--only-where NAME=VALUE``: judge only where env NAME is VALUE (or unset): the rank-0
    # replica of a gang whose replicas share no directory, so a rank that prints nothing while
    # rank 0 prints (most DDP ranks) is never stopped on its own
    name, _, value = options.get("--only-where", "").partition("=")
    if name and os.environ.get(name, value) != value:
        os.execvp(cmd[0], cmd)  # an unjudged replica: its command as if unwrapped
    return run(timeout, cmd, options.get("--peers"), options.get("--beacon"))


if __name__ == "__main__":
    sys.exit(main())
