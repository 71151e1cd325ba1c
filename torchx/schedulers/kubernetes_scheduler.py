"""Upstream's module path of the kubernetes scheduler (``torchx.schedulers.kubernetes``):
the package's names re-exported, and those upstream spells differently defined here, each a
thin view of the one implementation in ``manifests`` / ``status``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torchx
from torchx.schedulers.kubernetes.api import KubernetesError  # noqa: F401
from torchx.schedulers.kubernetes.logs import TAIL_POLL_SECONDS  # noqa: F401
from torchx.schedulers.kubernetes.manifests import (  # noqa: F401 (upstream's names)
    ANNOTATION_ISTIO_SIDECAR,
    LABEL_APP_NAME,
    LABEL_KUBE_APP_NAME,
    LABEL_ORGANIZATION,
    LABEL_REPLICA_ID,
    LABEL_ROLE_INDEX,
    LABEL_ROLE_NAME,
    LABEL_UNIQUE_NAME,
    LABEL_VERSION,
    ORGANIZATION,
    RESERVED_MEMMB,
    RESERVED_MILLICPU,
    RETRY_POLICIES,
    pod_template,
    serialize,
)
from torchx.schedulers.kubernetes.scheduler import (  # noqa: F401
    KubernetesJob,
    KubernetesOpts,
    KubernetesScheduler,
    app_to_resource,
    create_scheduler,
    logger,
)
from torchx.schedulers.kubernetes.status import POD_PHASE_STATE, VOLCANO_JOB_STATE
from torchx.specs.api import AppDef, AppState, Role

LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
sanitize_for_serialization = serialize
JOB_STATE: Dict[str, AppState] = dict(VOLCANO_JOB_STATE)

# Volcano task statuses -> replica state: the pod phases plus the scheduling steps
TASK_STATE: Dict[str, AppState] = {
    **POD_PHASE_STATE,
    "Allocated": AppState.PENDING,
    "Pipelined": AppState.PENDING,
    "Binding": AppState.PENDING,
    "Bound": AppState.PENDING,
    "Releasing": AppState.RUNNING,
}


def pod_labels(
    app: AppDef, role_idx: int, role: Role, replica_id: int, app_id: str
) -> Dict[str, str]:
    """The labels upstream puts on one replica's pod (``app_id``: the job's unique name)."""
    return {
        LABEL_VERSION: torchx.__version__,
        LABEL_APP_NAME: app.name,
        LABEL_ROLE_INDEX: str(role_idx),
        LABEL_ROLE_NAME: role.name,
        LABEL_REPLICA_ID: str(replica_id),
        LABEL_KUBE_APP_NAME: app.name,
        LABEL_ORGANIZATION: ORGANIZATION,
        LABEL_UNIQUE_NAME: app_id,
    }


def role_to_pod(name: str, role: Role, service_account: Optional[str]) -> Any:
    """A ``V1Pod`` running one replica of ``role`` in a container named ``name`` (resources,
    mounts, ports and env as the scheduler builds them; needs ``torchx[kubernetes]``)."""
    from kubernetes.client.models import V1Pod

    template = pod_template(
        role,
        name,
        labels={},
        annotations={ANNOTATION_ISTIO_SIDECAR: "false"},
        cfg={"service_account": service_account},
    )
    return V1Pod(metadata=template.metadata, spec=template.spec)
