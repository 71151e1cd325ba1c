"""Find the processes of a torchx job on this machine: every replica process carries
``TORCHX_JOB_ID=<app handle>`` in its environment, whichever scheduler started it."""

from __future__ import annotations

import time
from typing import List, Optional

import psutil


def job_processes(handle: str, cmdline: Optional[List[str]] = None) -> List[psutil.Process]:
    """The live processes of ``handle`` (only those running exactly ``cmdline``, if given)."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (p.info["environ"] or {}).get("TORCHX_JOB_ID") != handle:
                continue
            if cmdline is None or p.info["cmdline"] == cmdline:
                found.append(p)
        except psutil.Error:
            pass
    return found


def wait_for_job_processes(
    handle: str, count: int, cmdline: Optional[List[str]] = None, timeout: float = 60
) -> List[psutil.Process]:
    """Poll until ``count`` such processes run.

    Fails the test unless exactly ``count`` do within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    procs = job_processes(handle, cmdline)
    while len(procs) < count and time.monotonic() < deadline:
        time.sleep(0.2)
        procs = job_processes(handle, cmdline)
    assert len(procs) == count, (
        f"{handle}: {len(procs)} processes {cmdline or ''} within {timeout:.0f} s, expected {count}"
    )
    return procs
