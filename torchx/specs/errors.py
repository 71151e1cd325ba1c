"""The errors a user can cause, each with a message that says what to do.

Names and constructor arguments are upstream's; where upstream raised a builtin type for
the same mistake, the class also derives from that type.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Tuple, Type


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


# What a call into a scheduler's or a tracker's backend raises when its service fails,
# refuses or is missing: for the callers that must carry on (a tracker never fails a stage;
# a cancel left undone is reaped later) while a bug (TypeError, AttributeError) surfaces.

# torchx's own; I/O and network (requests' included); bad or missing data; a missing extra;
# a client's own failure (Ray's job client, PyTorch's)
_ALWAYS: Tuple[Type[Exception], ...] = (
    TorchXError,
    OSError,
    ValueError,
    LookupError,
    ImportError,
    RuntimeError,
)

# (module, class): a client library's base error, counted once the client is loaded
# (no other code can raise it), so that no optional client is imported to name it
_CLIENTS = (
    ("subprocess", "SubprocessError"),  # sbatch, squeue, scancel
    ("sqlite3", "Error"),
    ("http.client", "HTTPException"),
    ("urllib3.exceptions", "HTTPError"),
    ("sqlalchemy.exc", "SQLAlchemyError"),
    ("mlflow.exceptions", "MlflowException"),
    ("kubernetes.client.exceptions", "OpenApiException"),
    ("kubernetes.config.config_exception", "ConfigException"),
    ("botocore.exceptions", "BotoCoreError"),
    ("botocore.exceptions", "ClientError"),
    ("ray.exceptions", "RayError"),
    ("docker.errors", "DockerException"),
)


def backend_errors() -> Tuple[Type[Exception], ...]:
    """The exception types of a failed backend call, for ``except backend_errors():``."""
    loaded = (getattr(sys.modules.get(module), name, None) for module, name in _CLIENTS)
    return (*_ALWAYS, *(error for error in loaded if isinstance(error, type)))
