"""The errors a user can cause, each with a message that says what to do.

The CLI prints a :class:`TorchXError` as one line without a traceback. Class names and
constructor arguments are upstream TorchX's, so ``except`` clauses written for it still
catch them; where upstream raised a builtin type for the same mistake, the class also
derives from that type.
"""

from __future__ import annotations

from typing import Any, List, Optional


class TorchXError(Exception):
    """Base of every error a user can cause; the CLI prints it as one line."""


class InvalidRunConfigException(TorchXError, ValueError):
    """A scheduler run config (``-cfg``) is missing a required key or has a wrong type."""

    def __init__(self, invalid_reason: str, cfg_key: str, cfg: Any) -> None:
        super().__init__(f"{invalid_reason}. Given run configs: {cfg or '<EMPTY>'}")
        self.invalid_reason = invalid_reason
        self.cfg_key = cfg_key
        self.cfg = cfg


class MalformedAppHandleException(TorchXError):
    """An app handle that is not ``{scheduler}://{session}/{app_id}``."""

    def __init__(self, app_handle: str) -> None:
        super().__init__(
            f"{app_handle!r} is not a valid app handle;"
            " expected the form SCHEDULER://SESSION/APP_ID (e.g. local_cwd://torchx/echo-abc123)"
        )
        self.app_handle = app_handle


class UnknownSchedulerException(TorchXError):
    """The named scheduler backend is not registered."""

    def __init__(self, scheduler_backend: str, known: Optional[List[str]] = None) -> None:
        msg = f"unknown scheduler {scheduler_backend!r}"
        if known:
            msg += f"; available schedulers: {', '.join(known)}"
        super().__init__(msg)
        self.scheduler_backend = scheduler_backend


class UnknownAppException(TorchXError):
    """The app handle names an app the scheduler does not know (any more)."""

    def __init__(self, app_handle: str) -> None:
        super().__init__(
            f"app {app_handle} does not exist or has been removed from its scheduler;"
            " check the handle with `torchx list -s SCHEDULER`"
        )
        self.app_handle = app_handle


class InvalidArgumentError(TorchXError, ValueError):
    """A component or API argument with a bad value (e.g. ``-j 0x2``)."""


class AppStatusError(TorchXError):
    """Raised by ``AppStatus.raise_for_status`` when the app did not succeed."""

    def __init__(self, status: Any, *args: Any) -> None:
        super().__init__(*args)
        self.status = status
