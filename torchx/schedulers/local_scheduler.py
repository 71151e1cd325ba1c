"""Upstream's module path of the local scheduler: ``local_cwd`` lives in the
``torchx.schedulers.local`` package; this module re-exports what upstream's
``torchx.schedulers.local_scheduler`` offered, so code written against it keeps working.
"""

from __future__ import annotations

from torchx.schedulers.local.compat import (
    NA,  # noqa: F401
    AppId,  # noqa: F401
    AppName,  # noqa: F401
    LogIterator,
    PopenProtocol,
    RoleName,  # noqa: F401
    SignalException,
    make_unique,
)
from torchx.schedulers.local.images import (
    ENV_CUDA_VISIBLE_DEVICES,
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
    LocalOpts,
    ReplicaParam,
    _join_PATH,  # noqa: F401
)
from torchx.schedulers.local.scheduler import (
    COMBINED_LOG,
    ERROR_FILE,  # noqa: F401
    GRACE_SECONDS,
    STDERR_LOG,
    STDOUT_LOG,
    LocalScheduler,
    PopenRequest,
    UnreadableAppError,
    create_scheduler,
    log,  # noqa: F401
)

__all__ = [
    "COMBINED_LOG",
    "CWDImageProvider",
    "ENV_CUDA_VISIBLE_DEVICES",
    "GRACE_SECONDS",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "LocalOpts",
    "LocalScheduler",
    "LogIterator",
    "PopenProtocol",
    "PopenRequest",
    "ReplicaParam",
    "STDERR_LOG",
    "STDOUT_LOG",
    "SignalException",
    "UnreadableAppError",
    "create_scheduler",
    "make_unique",
]
# also importable, as from upstream's module: NA, AppId, AppName, RoleName, ERROR_FILE,
# _join_PATH, log (imported above)
