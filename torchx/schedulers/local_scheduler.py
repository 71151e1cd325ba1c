"""Upstream's module path of the local scheduler: ``local_cwd`` lives in the
``torchx.schedulers.local`` package; this module re-exports what upstream's
``torchx.schedulers.local_scheduler`` offered, so code written against it keeps working.
"""

from torchx.schedulers.local.compat import (  # noqa: F401
    NA,
    AppId,
    AppName,
    LogIterator,
    PopenProtocol,
    RoleName,
    SignalException,
    make_unique,
)
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
