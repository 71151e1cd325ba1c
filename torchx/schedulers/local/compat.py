"""Names upstream's ``torchx.schedulers.local_scheduler`` has that ``local_cwd`` itself does
not use (its logs and signals work differently, see the ``torchx.schedulers.local`` doc).

They are here, re-exported by ``local_scheduler``, so code written against upstream keeps
importing them: ``LogIterator`` (follow one log file until the app ends),
``SignalException``, ``PopenProtocol``, the id type aliases and ``make_unique``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import IO, Any, Optional, Protocol

from torchx.schedulers.ids import make_unique
from torchx.specs.api import is_terminal

__all__ = ["LogIterator", "PopenProtocol", "SignalException", "make_unique"]

NA = "<N/A>"
AppId = str
AppName = str
RoleName = str


class PopenProtocol(Protocol):
    """What a replica process offers (``subprocess.Popen`` fits); upstream's type name."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...

    def poll(self) -> Optional[int]: ...

    def kill(self) -> None: ...


_POLL_SECONDS = 0.1


class SignalException(Exception):
    """A termination signal turned into an exception (``sigval`` says which)."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


class LogIterator:
    """Chunks of ``log_file`` as they are written; with ``should_tail`` it keeps reading
    until ``scheduler.describe(app_id)`` is terminal (or gone), then stops at end of file.
    Bad UTF-8 reads as U+FFFD. Raises ``RuntimeError`` if the app ends without the file.
    """

    def __init__(self, app_id: str, log_file: str, scheduler: Any, should_tail: bool = True):
        self._app_id = app_id
        self._log_file = log_file
        self._scheduler = scheduler
        self._app_finished = not should_tail
        self._fp: Optional[IO[str]] = None

    def _check_finished(self) -> None:
        desc = self._scheduler.describe(self._app_id)
        self._app_finished = desc is None or is_terminal(desc.state)

    def __iter__(self) -> LogIterator:
        while not os.path.isfile(self._log_file):
            self._check_finished()
            if os.path.isfile(self._log_file):
                break
            if self._app_finished:
                raise RuntimeError(
                    f"app: {self._app_id} finished without writing: {self._log_file}"
                )
            time.sleep(_POLL_SECONDS)
        self._fp = open(self._log_file, newline="\n", errors="replace")
        return self

    def __next__(self) -> str:
        fp = self._fp
        assert fp is not None, "iterate with iter() first"
        while True:
            chunk = fp.read(64000)
            if chunk:
                return chunk
            if self._app_finished:
                fp.close()
                raise StopIteration
            time.sleep(_POLL_SECONDS)
            self._check_finished()
