"""Processes of ``local_cwd`` apps: who is ours, and how to end all of them. Stdlib only
(psutil off Linux, where there is no /proc): the supervisor imports it.

- A pid may be reused once its process exited, so every pid we record comes with a
  *stamp*: its owner (real uid), start time and boot id (psutil's ``uids().real`` and
  ``create_time()``, read from /proc on Linux). A process is ours only if all match, and
  nothing is signalled that is not ours.
- Every replica process carries ``TORCHX_LOCAL_REPLICA=<app_id>/<role>/<replica>`` in its
  environment, inherited by everything it starts, so its descendants are found even
  after they left its process group or session, or were orphaned.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

REPLICA_ENV = "TORCHX_LOCAL_REPLICA"


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()[:8]
    except OSError:
        return ""


def _proc_stat(pid: int) -> Optional[List[str]]:
    """Fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _read_at(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096).decode(errors="replace")  # stat, and status up to its Uid
    finally:
        os.close(fd)


def _probe(pid: int) -> Optional[Tuple[bool, str]]:
    """``(is a zombie, stamp)`` of ``pid``, or None if there is no such process."""
    if sys.platform.startswith("linux"):
        try:  # both files through one open directory: they describe one process, even if
            # the pid is reused in between (reads under a reaped process's directory fail)
            dir_fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fields = _read_at(dir_fd, "stat").rsplit(")", 1)[1].split()
            status = _read_at(dir_fd, "status").splitlines()
            uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
        except (OSError, IndexError, StopIteration):
            return None
        finally:
            os.close(dir_fd)
        return fields[0] == "Z", f"{uid}:{fields[19]}@{_boot_id()}"
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE, f"{p.uids().real}:{p.create_time()}"
    except psutil.Error:
        return None


def stamp(pid: int) -> Optional[str]:
    """A stamp that tells ``pid`` apart from any later process given the same pid, and from
    the same process once it changed owner (``<uid>:<start time>@<boot id>``)."""
    found = _probe(pid)
    return found[1] if found else None


def is_ours(pid: object, pid_stamp: object) -> bool:
    """Whether ``pid`` still runs (not a zombie) and is the process that had ``pid_stamp``:
    same owner, same start time. Checked before every signal to a recorded pid."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(pid_stamp, str):
        return False
    return _probe(pid) == (False, pid_stamp)


def set_child_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux), so none escape it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # no libc to load, or no prctl in it
        return False


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    found = _probe(pid)
    return found is not None and not found[0]


def own_children() -> Set[int]:
    """This process's children (orphans re-parented to a subreaper included)."""
    if not sys.platform.startswith("linux"):
        return _psutil_children(os.getpid(), recursive=False)
    kids: Set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/children") as f:
                    kids.update(int(p) for p in f.read().split())
            except FileNotFoundError:
                if tid == str(os.getpid()):  # the kernel has no children files
                    raise
                # else: a thread that just ended
        return kids
    except OSError:
        return set(_children_map().get(os.getpid(), []))


def descendants_of(pids: Iterable[int]) -> Set[int]:
    """Every descendant of any of ``pids`` (one scan of the process table)."""
    if not sys.platform.startswith("linux"):
        return set().union(*(_psutil_children(p, recursive=True) for p in pids))
    children = _children_map()
    found: Set[int] = set()
    todo = list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _children_map() -> Dict[int, List[int]]:
    """``{parent pid: [child pids]}`` of every process, from /proc."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            if fields := _proc_stat(int(name)):
                children.setdefault(int(fields[1]), []).append(int(name))
    return children


def _psutil_children(pid: int, recursive: bool) -> Set[int]:
    import psutil

    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=recursive)}
    except psutil.Error:
        return set()


def replica_tag(pid: int) -> Optional[str]:
    """The ``TORCHX_LOCAL_REPLICA`` of a process (None if unset or unreadable)."""
    if not sys.platform.startswith("linux"):
        import psutil

        try:
            return psutil.Process(pid).environ().get(REPLICA_ENV)
        except psutil.Error:
            return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = REPLICA_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def tagged(prefix: str) -> Set[int]:
    """Processes whose replica tag starts with ``prefix``."""
    if sys.platform.startswith("linux"):
        among = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    else:
        import psutil

        among = psutil.pids()
    me = os.getpid()
    return {p for p in among if p != me and (replica_tag(p) or "").startswith(prefix)}


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each pid; first to the whole group of each that leads one.

    A group gets the signal in one system call. A parent signalled after its child could
    run on in between, see the child die and carry on (``sh -c 'sleep 30; echo end'``
    printed "end" after a cancel when ``sleep`` was signalled first)."""
    pids = [p for p in pids if p > 1]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(p) == p:
                os.killpg(p, sig)
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def kill_tagged_everywhere(prefix: str, roots: Iterable[int] = ()) -> None:
    """SIGKILL, until none is left, every process tagged ``prefix`` and the trees under
    ``roots`` (pids already checked to be ours); used when the supervisor is gone."""
    tops = set(roots)
    known = {p: st for p in tops | descendants_of(tops) if (st := stamp(p))}
    for _ in range(50):
        pids = tagged(prefix) | {p for p, st in known.items() if is_ours(p, st)}
        pids = {p for p in pids if alive(p)}
        if not pids:
            return
        signal_pids(pids, signal.SIGKILL)
        time.sleep(0.02)
