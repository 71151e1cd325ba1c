"""Upstream's module path of the local scheduler: ``local_cwd`` lives in the
``torchx.schedulers.local`` package. This module re-exports upstream's public names, and
defines those ``local_cwd`` itself does not use (its logs and signals work differently),
so code written against upstream keeps importing them.
"""

from __future__ import annotations

import os
import signal
import time
from typing import IO, Any, Optional, Protocol

from torchx.schedulers.ids import make_unique  # noqa: F401
from torchx.schedulers.local.images import (  # noqa: F401
    ENV_CUDA_VISIBLE_DEVICES,
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
    LocalOpts,
    ReplicaParam,
    _join_PATH,
)
from torchx.schedulers.local.scheduler import (  # noqa: F401
    COMBINED_LOG,
    ERROR_FILE,
    GRACE_SECONDS,
    STDERR_LOG,
    STDOUT_LOG,
    LocalScheduler,
    PopenRequest,
    UnreadableAppError,
    create_scheduler,
    log,
)
from torchx.specs.api import is_terminal

NA = "<N/A>"
AppId = str
AppName = str
RoleName = str

_POLL_SECONDS = 0.1


class PopenProtocol(Protocol):
    """What a replica process offers (``subprocess.Popen`` fits); upstream's type name."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...

    def poll(self) -> Optional[int]: ...

    def kill(self) -> None: ...


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
