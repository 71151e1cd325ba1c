"""Follow every replica's log of an app at once (used by the pipeline adapters)."""

from __future__ import annotations

import threading
from typing import Callable, List, Optional

from torchx.runner.api import Runner


def tail_app_logs(
    runner: Runner,
    handle: str,
    emit: Callable[[str, int, str], None],
    should_tail: bool = True,
    stop: Optional[threading.Event] = None,
) -> List[BaseException]:
    """Call ``emit(role, replica, line)`` for each line (without its newline) as it is written.

    One thread per replica; ``emit`` calls are serialized. Returns the readers' errors, or
    within half a second of ``stop`` being set, without waiting for a replica's next line
    (its reader, a daemon thread, ends at that line if ``emit`` then raises).
    """
    app = runner.describe(handle)
    if app is None:
        return []
    lock = threading.Lock()
    errors: List[BaseException] = []

    def copy(role: str, k: int) -> None:
        try:
            for line in runner.log_lines(handle, role, k, should_tail=should_tail):
                with lock:
                    emit(role, k, line.rstrip("\n"))
        except Exception as e:  # reported to the caller
            errors.append(e)

    threads = [
        threading.Thread(target=copy, args=(r.name, k), daemon=True)
        for r in app.roles
        for k in range(r.num_replicas)
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            if stop is not None and stop.is_set():
                return list(errors)
            t.join(timeout=0.5)  # wakes up for signals (Ctrl-C, SIGTERM) and ``stop``
    return errors
