"""Print an app's log lines as they are written, each prefixed ``role/replica``.

Where the scheduler offers them (``LogLines.blocks()`` of local_cwd), lines are taken and
printed many at a time: a million lines cost a few writes, not a million.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import List, Optional, TextIO, Tuple

from torchx.runner.api import Runner
from torchx.runner.logs import each_replica
from torchx.schedulers.api import Stream
from torchx.schedulers.local.logs import LogLines

_COLORS = ["\033[32m", "\033[36m", "\033[33m", "\033[35m", "\033[34m", "\033[31m"]
_RESET = "\033[0m"


def stream_logs(
    runner: Runner,
    handle: str,
    pairs: List[Tuple[str, int]],
    should_tail: bool,
    regex: Optional[str] = None,
    streams: Optional[Stream] = None,
    out: TextIO = sys.stdout,
) -> List[BaseException]:
    """Print every replica's lines concurrently; returns the errors of the reader threads."""
    lock = threading.Lock()
    color = out.isatty() and not os.environ.get("NO_COLOR")

    def read(role: str, k: int, idx: int) -> None:
        prefix = f"{role}/{k}"
        if color:
            prefix = f"{_COLORS[idx % len(_COLORS)]}{prefix}{_RESET}"
        prefix += " "
        lines = runner.log_lines(
            handle, role, k, regex=regex, should_tail=should_tail, streams=streams
        )
        # local_cwd's give many lines at a time
        for text in lines.blocks() if isinstance(lines, LogLines) else lines:
            body = text[:-1] if text.endswith("\n") else text
            text = prefix + body.replace("\n", "\n" + prefix) + "\n"
            with lock:
                out.write(text)
                out.flush()

    return each_replica(pairs, read)
