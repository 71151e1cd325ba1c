"""How the launcher starts an app's supervisor: a fork of itself when that is safe (a few
ms), else a new interpreter (``supervisor.command``, 30-80 ms). Either way the supervisor
is the launcher's child in a session of its own, so it outlives the launcher and no
terminal signal of the launcher reaches it.

A fork without exec is safe only with one thread (another may hold a lock the child then
waits for forever), counted by ``threading`` and the kernel, and only while the launcher
is small (``FORK_MAX_RSS``): the child keeps its memory for the app's lifetime.

The forked child inherits nothing that acts on its own: its stdio is ``/dev/null`` and
``supervisor.log``, other inherited descriptors point at ``/dev/null`` (replaced, not
closed, so a finalizer cannot close a file the supervisor opened under that number),
signal handlers are reset, and it leaves by ``os._exit``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from typing import Optional, Set

from torchx.schedulers.local import supervisor

FORK_MAX_RSS = 40 << 20  # bytes
# forked supervisors not reaped yet (a zombie is reaped at the next start or close)
_FORKED: Set[int] = set()


class Started:
    """A started supervisor: its pid, and its exit code once it exited (``poll``)."""

    def __init__(self, pid: int, popen: Optional[subprocess.Popen[bytes]] = None) -> None:
        self.pid = pid
        self._popen = popen
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self._popen is not None:
            self.returncode = self._popen.poll()
        elif self.returncode is None:
            self.returncode = _reap(self.pid)
        return self.returncode


def can_fork() -> bool:
    """Whether this process may fork without exec: Linux, a single thread, and small."""
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return False
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return False
    return resident <= FORK_MAX_RSS


def start(app_dir: str, log_fd: int) -> Started:
    """Start the supervisor of ``app_dir`` with its output on ``log_fd``."""
    reap_forked()
    if can_fork():
        return Started(_fork(app_dir, log_fd))
    proc = subprocess.Popen(
        supervisor.command(app_dir),
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        start_new_session=True,
        close_fds=True,
    )
    return Started(proc.pid, proc)


def _fork(app_dir: str, log_fd: int) -> int:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: no copy
            stream.flush()  # else the child's copy of the buffer could be written twice
    devnull = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid:
        os.close(devnull)
        _FORKED.add(pid)
        return pid
    code = 1
    try:  # the child: never returns into the launcher's code
        os.setsid()
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        _blank_inherited_fds(devnull)
        _reset_signals()
        _set_name(b"torchx-local")  # its command line stays the launcher's; ps -e, top
        code = supervisor.main(app_dir)
    except BaseException:  # the forked child must reach os._exit, whatever it raised
        with contextlib.suppress(OSError, ValueError):  # no stderr left to print to
            traceback.print_exc()
    finally:
        os._exit(code)


def _set_name(name: bytes) -> None:
    """The process name (``prctl(PR_SET_NAME)``), through ``/proc``: ``ctypes`` would cost
    the child ~5 ms of imports before it starts the replicas."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "wb") as f:
        f.write(name[:15])


def _blank_inherited_fds(devnull: int) -> None:
    """Point every file descriptor above 2 at ``devnull`` (then closed itself)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != devnull:
            with contextlib.suppress(OSError):  # the listing's own descriptor, gone already
                os.dup2(devnull, fd, inheritable=False)
    os.close(devnull)


def _reset_signals() -> None:
    """The launcher's Python signal handlers and wakeup fd do not apply to the child."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter


def _reap(pid: int) -> Optional[int]:
    """The exit code of forked child ``pid`` if it exited (reaping it), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped by someone else (a waitpid(-1) of the caller)
        _FORKED.discard(pid)
        return -1
    if done == 0:
        return None
    _FORKED.discard(pid)
    return os.waitstatus_to_exitcode(status)


def reap_forked() -> None:
    """Reap the forked supervisors that exited (no zombie stays behind for long)."""
    for pid in list(_FORKED):
        _reap(pid)
