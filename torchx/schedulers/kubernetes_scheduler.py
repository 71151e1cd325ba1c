"""Upstream's module path of the kubernetes scheduler: ``kubernetes`` lives in the
``torchx.schedulers.kubernetes`` package; this module re-exports what upstream's
``torchx.schedulers.kubernetes_scheduler`` offered, so code written against it keeps working.
"""

from torchx.schedulers.kubernetes.api import KubernetesError  # noqa: F401
from torchx.schedulers.kubernetes.compat import (  # noqa: F401
    ANNOTATION_ISTIO_SIDECAR,
    JOB_STATE,
    LABEL_INSTANCE_TYPE,
    LABEL_KUBE_APP_NAME,
    LABEL_REPLICA_ID,
    LABEL_ROLE_INDEX,
    LABEL_ROLE_NAME,
    LABEL_VERSION,
    RESERVED_MEMMB,
    RESERVED_MILLICPU,
    RETRY_POLICIES,
    TASK_STATE,
    pod_labels,
    role_to_pod,
    sanitize_for_serialization,
)
from torchx.schedulers.kubernetes.logs import TAIL_POLL_SECONDS  # noqa: F401
from torchx.schedulers.kubernetes.manifests import (  # noqa: F401
    LABEL_APP_NAME,
    LABEL_ORGANIZATION,
    LABEL_UNIQUE_NAME,
)
from torchx.schedulers.kubernetes.scheduler import (  # noqa: F401
    KubernetesJob,
    KubernetesOpts,
    KubernetesScheduler,
    app_to_resource,
    create_scheduler,
    logger,
)
