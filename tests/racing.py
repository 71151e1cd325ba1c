"""Keyed submissions racing in threads of one process, each with its own Runner."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Tuple

from torchx.runner import Runner, get_runner


def race_runs(
    n: int, run: Callable[[Runner], str], **runner_kwargs: Any
) -> Tuple[List[str], List[bool]]:
    """``run(runner)`` (a keyed ``Runner.run``) in ``n`` threads at once; the handles they got
    and whether each re-attached (``Runner.reattached``), in the order they returned."""
    handles: List[str] = []
    reattached: List[bool] = []

    def submit() -> None:
        with get_runner(**runner_kwargs) as runner:
            handle = run(runner)
            handles.append(handle)
            reattached.append(runner.reattached(handle))

    racers = [threading.Thread(target=submit) for _ in range(n)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=180)
    return handles, reattached
