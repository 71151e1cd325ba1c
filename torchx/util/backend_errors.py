"""What a call into a scheduler's or a tracker's backend raises when its service fails,
refuses or is missing. For the callers that must carry on (a tracker never fails a stage;
a cancel left undone is reaped later) while a bug (``TypeError``, ``AttributeError``)
still surfaces."""

from __future__ import annotations

import sys
from typing import Tuple, Type

from torchx.specs.errors import TorchXError

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
