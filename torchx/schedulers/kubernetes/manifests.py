"""Kubernetes manifests for an AppDef: a Volcano Job, or Indexed Jobs plus a headless Service.

Every pod template, Job and Service is built from the official ``kubernetes`` client's
models (so field names and required fields are checked by the client) and turned into
plain dicts with ``ApiClient().sanitize_for_serialization``. The Volcano Job has no
model in the client; its envelope is a dict around model-built pod templates.

Names: ``{app}-{random}`` (DNS-1035, at most 33 characters; a keyed submission's
``{app}-{token}-{generation}``, as long) for the Volcano Job and the Service; one Volcano
task per replica, ``{role}-{replica_id}``, so that per-replica macros (``${replica_id}``,
``${rank0_env}``) can differ. Pod host names stay under the 63-character DNS label limit.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torchx
from torchx.runtime import watchdog
from torchx.schedulers.api import (
    IDEMPOTENCY_GENERATION,
    OWNER,
    STALL_TIMEOUT,
    InvalidAppError,
    app_idempotency_token,
    app_stall_timeout,
)
from torchx.schedulers.ids import keyed_name, random_id
from torchx.specs.api import (
    AppDef,
    BindMount,
    DeviceMount,
    InvalidRunConfigException,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
    macros,
)
from torchx.specs.secrets import secret_env

LABEL_VERSION = "torchx.pytorch.org/version"
LABEL_APP_NAME = "torchx.pytorch.org/app-name"
LABEL_ROLE_INDEX = "torchx.pytorch.org/role-index"
LABEL_ROLE_NAME = "torchx.pytorch.org/role-name"
LABEL_REPLICA_ID = "torchx.pytorch.org/replica-id"
LABEL_KUBE_APP_NAME = "app.kubernetes.io/name"
LABEL_ORGANIZATION = "app.kubernetes.io/managed-by"
LABEL_UNIQUE_NAME = "app.kubernetes.io/instance"
# The Runner's idempotency token (api.idempotency_token): found with a label selector.
LABEL_IDEMPOTENCY_TOKEN = "torchx.pytorch.org/idempotency-token"
ORGANIZATION = "torchx.pytorch.org"
# Annotations keep the exact (unsanitized) names that labels cannot hold.
ANNOTATION_ROLE_NAME = "torchx.pytorch.org/role-name"
ANNOTATION_APP_NAME = "torchx.pytorch.org/app-name"
ANNOTATION_ISTIO_SIDECAR = "sidecar.istio.io/inject"
ANNOTATION_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Nanoseconds since the epoch (submitter's clock) of a keyed submission: orders two jobs
# whose creationTimestamps (whole seconds) are equal.
ANNOTATION_SUBMITTED_AT = "torchx.pytorch.org/submitted-at"
# the job's owner (``Runner.run(owner=...)``, compact JSON: a label value cannot hold it)
ANNOTATION_OWNER = "torchx.pytorch.org/owner"
# ``Runner.run(stall_timeout=S)``
ANNOTATION_STALL_TIMEOUT = "torchx.pytorch.org/stall-timeout"

VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_VERSION = "v1alpha1"
VOLCANO_PLURAL = "jobs"

JOB_TYPE_VOLCANO = "volcano"
JOB_TYPE_INDEXED = "indexed"
JOB_TYPES = (JOB_TYPE_VOLCANO, JOB_TYPE_INDEXED)

RANK0_ENV = "TORCHX_RANK0_HOST"
REPLICA_ID_ENV = "TORCHX_REPLICA_ID"
GPU_RESOURCE = "nvidia.com/gpu"
FIELD_PATH_PREFIX = "[FIELD_PATH]"
SHELLS = {"bash", "sh", "dash", "zsh", "ksh", "ash"}

# Requests sit a little below limits so a role sized to a whole node still fits next to
# the node's daemons, but never far below (upstream requested memMB-1024, i.e. 0 for 1 GiB).
RESERVED_MILLICPU = 100
RESERVED_MEMMB = 1024
MAX_RESERVED_FRACTION = 10  # reserve at most 1/10 of the limit

APP_NAME_MAX = 24
ROLE_NAME_MAX = 20

# ``-cfg secret_env=VAR:SECRET[:KEY]``: a Secret's name (a DNS subdomain) and one of its keys
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")

# Volcano event -> action for each retry policy: APPLICATION restarts every task (the
# whole gang, as torchelastic expects); REPLICA restarts only the failed replica's task.
RETRY_POLICIES: Dict[RetryPolicy, List[Dict[str, str]]] = {
    RetryPolicy.APPLICATION: [
        {"event": "PodEvicted", "action": "RestartJob"},
        {"event": "PodFailed", "action": "RestartJob"},
    ],
    RetryPolicy.REPLICA: [
        {"event": "PodEvicted", "action": "RestartTask"},
        {"event": "PodFailed", "action": "RestartTask"},
    ],
}


def normalize_name(value: str, max_len: int, fallback: str = "app") -> str:
    """A DNS-1035 label: lowercase alphanumerics and '-', starting with a letter."""
    out = re.sub(r"[^a-z0-9-]+", "-", value.lower())
    out = re.sub(r"-{2,}", "-", out)
    out = re.sub(r"^[^a-z]+", "", out)[:max_len].strip("-")
    return out or fallback


def label_value(value: str) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", out)


def unique_app_name(app_name: str) -> str:
    return f"{normalize_name(app_name, APP_NAME_MAX)}-{random_id(8)}"


def app_object_name(app: AppDef) -> str:
    """``unique_app_name``; a keyed submission's is ``keyed_name`` instead (as long, with a
    one-digit generation): its racers pick one name and the API server keeps one object."""
    token, generation = app_idempotency_token(app), app.metadata.get(IDEMPOTENCY_GENERATION)
    if not (token and generation):
        return unique_app_name(app.name)
    return keyed_name(normalize_name(app.name, APP_NAME_MAX - 6), token, generation)


def claim_config_map(app: AppDef, name: str, namespace: str) -> Dict[str, Any]:
    """The ConfigMap that claims a keyed app's name (``claims``), labelled as the app."""
    meta = _metadata(name, namespace, _app_labels(app, name), _job_annotations(app))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": serialize(meta), "data": {}}


def role_dns_names(app: AppDef) -> List[str]:
    """Per-role DNS-safe names; two roles may not normalize to the same name."""
    seen: Dict[str, str] = {}  # DNS name -> role name, in role order
    for role in app.roles:
        name = normalize_name(role.name, ROLE_NAME_MAX, fallback="role")
        if name in seen:
            raise InvalidAppError(
                f"roles {seen[name]!r} and {role.name!r} map to the same Kubernetes name {name!r};"
                " rename one of them"
            )
        seen[name] = role.name
    return list(seen)


def task_name(role_dns: str, replica_id: int) -> str:
    return f"{role_dns}-{replica_id}"


def volcano_hosts_env(task: str) -> str:
    """The variable Volcano's svc plugin sets to a task's pod host names."""
    return f"VC_{task.upper().replace('-', '_')}_HOSTS"


def parse_toleration(spec: str) -> Dict[str, Any]:
    """``KEY[=VALUE][:EFFECT]`` (kubectl taint syntax) -> a V1Toleration's fields.

    Without a value the operator is ``Exists``; ``*`` alone tolerates every taint.
    """
    text = spec.strip()
    effect: Optional[str] = None
    if ":" in text:
        text, effect = text.rsplit(":", 1)
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise InvalidRunConfigException(
                f"toleration {spec!r}: effect must be NoSchedule, PreferNoSchedule or NoExecute",
                "tolerations",
                spec,
            )
    if text in ("", "*"):
        return {"operator": "Exists", "effect": effect}
    if "=" in text:
        key, value = text.split("=", 1)
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": text, "operator": "Exists", "effect": effect}


def resource_requirements(resource: Resource) -> Any:
    """Limits from the Resource; requests at most 10% (<= 100m cpu / 1 GiB mem) below them."""
    from kubernetes.client.models import V1ResourceRequirements

    limits: Dict[str, str] = {}
    requests: Dict[str, str] = {}
    if resource.cpu > 0:
        mcpu = int(resource.cpu * 1000)
        limits["cpu"] = f"{mcpu}m"
        requests["cpu"] = f"{mcpu - min(RESERVED_MILLICPU, mcpu // MAX_RESERVED_FRACTION)}m"
    if resource.memMB > 0:
        mem = int(resource.memMB)
        limits["memory"] = f"{mem}Mi"
        requests["memory"] = f"{mem - min(RESERVED_MEMMB, mem // MAX_RESERVED_FRACTION)}Mi"
    if resource.gpu > 0:  # extended resources: request must equal limit
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(int(resource.gpu))
    for device, count in resource.devices.items():
        limits[device] = requests[device] = str(int(count))
    return V1ResourceRequirements(limits=limits or None, requests=requests or None)


def _volumes(role: Role) -> Tuple[List[Any], List[Any], bool]:
    """(volumes, volume mounts, privileged): /dev/shm plus the role's mounts."""
    from kubernetes.client.models import (
        V1EmptyDirVolumeSource,
        V1HostPathVolumeSource,
        V1PersistentVolumeClaimVolumeSource,
        V1Volume,
        V1VolumeMount,
    )

    shm_size = f"{int(role.resource.memMB)}Mi" if role.resource.memMB > 0 else None
    volumes = [
        V1Volume(
            name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size)
        )
    ]
    mounts = [V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    privileged = False
    for i, mount in enumerate(role.mounts):
        name = f"mount-{i}"
        if isinstance(mount, BindMount):
            volume = V1Volume(name=name, host_path=V1HostPathVolumeSource(path=mount.src_path))
            read_only = mount.read_only
        elif isinstance(mount, VolumeMount):
            claim = V1PersistentVolumeClaimVolumeSource(
                claim_name=mount.src, read_only=mount.read_only
            )
            volume = V1Volume(name=name, persistent_volume_claim=claim)
            read_only = mount.read_only
        elif isinstance(mount, DeviceMount):
            # Pods cannot be given a single device: mount the host path, which needs privileges.
            volume = V1Volume(name=name, host_path=V1HostPathVolumeSource(path=mount.src_path))
            read_only = "w" not in mount.permissions
            privileged = True
        else:
            raise InvalidAppError(f"role {role.name!r}: unsupported mount {mount!r}")
        volumes.append(volume)
        mounts.append(V1VolumeMount(name=name, mount_path=mount.dst_path, read_only=read_only))
    return volumes, mounts, privileged


@dataclasses.dataclass
class EnvSecret:
    """The app's own Secret (``{name}-env``): the secret env values of every container
    (``torchx.specs.secrets.secret_env``), filled while the pod templates are built. The pod
    specs reference it by key (``valueFrom.secretKeyRef``), so no Job or pod holds a secret."""

    name: str
    data: Dict[str, str] = dataclasses.field(default_factory=dict)

    def key_for(self, container: str, var: str, value: str) -> str:
        """The key ``value`` is kept under: ``VAR``, or ``VAR.{container}`` where another
        container's ``VAR`` holds a different value."""
        key = re.sub(r"[^-._a-zA-Z0-9]", "_", var)
        if self.data.get(key, value) != value:
            key = f"{key}.{container}"
        self.data[key] = value
        return key


def named_secret_env(cfg: Mapping[str, Any]) -> Dict[str, Tuple[str, str]]:
    """``-cfg secret_env=VAR:SECRET[:KEY];...`` as env var -> (an existing Secret, its key; the
    variable's name by default), KFP's ``use_secret_as_env`` keyed by the variable."""
    out: Dict[str, Tuple[str, str]] = {}
    for var, ref in dict(cfg.get("secret_env") or {}).items():
        secret, _, key = str(ref).partition(":")
        key = key or str(var)
        if not (SECRET_NAME.fullmatch(secret) and len(secret) <= 253 and SECRET_KEY.fullmatch(key)):
            raise InvalidRunConfigException(
                f"secret_env {var}:{ref}: expected VAR:SECRET[:KEY], SECRET the name of a"
                " Secret in the job's namespace and KEY one of its keys (e.g. HF_TOKEN:hf:token)",
                "secret_env",
                ref,
            )
        out[str(var)] = (secret, key)
    return out


def _env(
    env: Dict[str, str],
    container_name: str,
    secret: Optional[EnvSecret],
    named: Dict[str, Tuple[str, str]],
) -> List[Any]:
    """The container's env: secret values (with ``secret``) and ``named`` Secrets as
    ``secretKeyRef``s, ``[FIELD_PATH]`` values as ``fieldRef``s, the rest as values."""
    from kubernetes.client.models import (
        V1EnvVar,
        V1EnvVarSource,
        V1ObjectFieldSelector,
        V1SecretKeySelector,
    )

    def secret_ref(name: str, key: str) -> Any:
        return V1EnvVarSource(secret_key_ref=V1SecretKeySelector(name=name, key=key))

    secrets = secret_env(env) if secret is not None else {}
    out = []
    # a named Secret's variable keeps its place in ``env`` (``$(VAR)`` reads earlier ones)
    for var, value in {**env, **dict.fromkeys(named, "")}.items():
        if var in named:
            out.append(V1EnvVar(name=var, value_from=secret_ref(*named[var])))
        elif secret is not None and var in secrets:
            key = secret.key_for(container_name, var, value)
            out.append(V1EnvVar(name=var, value_from=secret_ref(secret.name, key)))
        elif value.startswith(FIELD_PATH_PREFIX):
            field = V1ObjectFieldSelector(field_path=value.removeprefix(FIELD_PATH_PREFIX))
            out.append(V1EnvVar(name=var, value_from=V1EnvVarSource(field_ref=field)))
        else:
            out.append(V1EnvVar(name=var, value=value))
    return out


def pod_template(
    role: Role,
    container_name: str,
    labels: Dict[str, str],
    annotations: Dict[str, str],
    cfg: Dict[str, Any],
    subdomain: Optional[str] = None,
    priority_class: Optional[str] = None,
    stall_timeout: Optional[float] = None,
    watch_options: Sequence[str] = (),
    secret: Optional[EnvSecret] = None,
) -> Any:
    """A V1PodTemplateSpec for one replica (or, for Indexed Jobs, for all replicas of a role).
    With ``stall_timeout`` the command runs under ``torchx.runtime.watchdog`` (the image
    needs torchx, ``watch_options`` its options), whose last stderr line becomes the
    container's termination message. With ``secret`` (the scheduler's), secret env values
    go there and the pod spec references them; without it (upstream's helpers, which build
    a pod for the caller to submit) the env stays as given."""
    from kubernetes.client.models import (
        V1Container,
        V1ContainerPort,
        V1LocalObjectReference,
        V1ObjectMeta,
        V1PodSpec,
        V1PodTemplateSpec,
        V1SecurityContext,
        V1Toleration,
    )

    volumes, mounts, privileged = _volumes(role)
    node_selector = dict(cfg.get("node_selector") or {})
    instance_type = role.resource.capabilities.get("node.kubernetes.io/instance-type")
    if instance_type:
        node_selector.setdefault("node.kubernetes.io/instance-type", str(instance_type))
    tolerations = [V1Toleration(**parse_toleration(t)) for t in cfg.get("tolerations") or []]
    secrets = [V1LocalObjectReference(name=s) for s in cfg.get("image_pull_secrets") or []]
    ports = [
        V1ContainerPort(name=normalize_name(name, 15, fallback=f"port-{port}"), container_port=port)
        for name, port in role.port_map.items()
    ]
    # as local, slurm and ray: prints reach the pod log at once (a block-buffered print
    # loop looks silent to stall detection), unless the role says otherwise
    env = {**role.env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    container = V1Container(
        name=container_name,
        image=role.image,
        command=watchdog.wrap([role.entrypoint, *role.args], stall_timeout, *watch_options),
        termination_message_policy="FallbackToLogsOnError" if stall_timeout else None,
        env=_env(env, container_name, secret, named_secret_env(cfg)) or None,
        resources=resource_requirements(role.resource),
        ports=ports or None,
        volume_mounts=mounts,
        security_context=V1SecurityContext(privileged=True) if privileged else None,
    )
    spec = V1PodSpec(
        containers=[container],
        restart_policy="Never",
        service_account_name=cfg.get("service_account"),
        node_selector=node_selector or None,
        tolerations=tolerations or None,
        image_pull_secrets=secrets or None,
        volumes=volumes,
        subdomain=subdomain,
        priority_class_name=priority_class,
    )
    return V1PodTemplateSpec(
        metadata=V1ObjectMeta(labels=labels, annotations=annotations), spec=spec
    )


def _app_labels(app: AppDef, unique_name: str) -> Dict[str, str]:
    labels = {
        LABEL_VERSION: label_value(torchx.__version__),
        LABEL_APP_NAME: label_value(app.name),
        LABEL_KUBE_APP_NAME: label_value(app.name),
        LABEL_ORGANIZATION: ORGANIZATION,
        LABEL_UNIQUE_NAME: unique_name,
    }
    token = app_idempotency_token(app)
    if token:
        if label_value(token) != token:
            raise InvalidAppError(
                f"idempotency token {token!r} is not a valid Kubernetes label value;"
                " make it with torchx.schedulers.api.idempotency_token(key)"
            )
        labels[LABEL_IDEMPOTENCY_TOKEN] = token
    return labels


def _job_annotations(app: AppDef) -> Dict[str, str]:
    """Annotations of the app's top-level objects (a keyed submission's submit time, the
    owner, the stall timeout)."""
    annotations = {}
    if app_idempotency_token(app):
        annotations[ANNOTATION_SUBMITTED_AT] = str(time.time_ns())
    if app.metadata.get(OWNER):
        annotations[ANNOTATION_OWNER] = app.metadata[OWNER]
    if app.metadata.get(STALL_TIMEOUT):
        annotations[ANNOTATION_STALL_TIMEOUT] = app.metadata[STALL_TIMEOUT]
    return annotations


def _role_labels(app: AppDef, unique_name: str, role_idx: int, role: Role) -> Dict[str, str]:
    labels = _app_labels(app, unique_name)
    labels.update({LABEL_ROLE_INDEX: str(role_idx), LABEL_ROLE_NAME: label_value(role.name)})
    return labels


def _annotations(app: AppDef, role: Role) -> Dict[str, str]:
    return {
        ANNOTATION_ISTIO_SIDECAR: "false",
        ANNOTATION_ROLE_NAME: role.name,
        ANNOTATION_APP_NAME: app.name,
    }


def _metadata(
    name: str, namespace: str, labels: Dict[str, str], annotations: Optional[Dict[str, str]] = None
) -> Any:
    from kubernetes.client.models import V1ObjectMeta

    return V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations)


def serialize(obj: Any) -> Any:
    """Plain JSON-able data (camelCase keys, no None fields) from client models."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def volcano_job(
    app: AppDef,
    unique_name: str,
    namespace: str,
    cfg: Dict[str, Any],
    secret: Optional[EnvSecret] = None,
) -> Dict[str, Any]:
    """A ``batch.volcano.sh/v1alpha1`` Job: one task per replica, gang-scheduled by Volcano
    (secret env values go to ``secret``, see ``pod_template``)."""
    role_names = role_dns_names(app)
    rank0_task = task_name(role_names[0], 0)
    tasks: List[Dict[str, Any]] = []
    min_available = 0
    for role_idx, (role, role_dns) in enumerate(zip(app.roles, role_names, strict=True)):
        if role.retry_policy not in RETRY_POLICIES:
            raise InvalidAppError(
                f"role {role.name!r}: retry_policy {role.retry_policy.value} is not supported on"
                " kubernetes; use APPLICATION or REPLICA"
            )
        min_available += role.num_replicas if role.min_replicas is None else role.min_replicas
        for replica_id in range(role.num_replicas):
            name = task_name(role_dns, replica_id)
            is_rank0 = name == rank0_task
            values = macros.Values(
                img_root="",
                app_id=f"{namespace}:{unique_name}",
                replica_id=str(replica_id),
                rank0_env=RANK0_ENV if is_rank0 else volcano_hosts_env(rank0_task),
            )
            replica_role = values.apply(role)
            if is_rank0:
                replica_role.env[RANK0_ENV] = "localhost"
            labels = _role_labels(app, unique_name, role_idx, role)
            labels[LABEL_REPLICA_ID] = str(replica_id)
            template = pod_template(
                replica_role,
                name,
                labels,
                _annotations(app, role),
                cfg,
                # pods share no directory: rank 0 is judged (its stop ends the gang), a
                # rank that prints nothing while rank 0 prints is not
                stall_timeout=app_stall_timeout(app) if is_rank0 else None,
                secret=secret,
            )
            task: Dict[str, Any] = {"name": name, "replicas": 1}
            if role.min_replicas is not None:
                task["minAvailable"] = 1 if replica_id < role.min_replicas else 0
            if role.max_retries > 0:
                task["maxRetry"] = role.max_retries
            task["policies"] = [dict(p) for p in RETRY_POLICIES[role.retry_policy]]
            task["template"] = serialize(template)
            tasks.append(task)
    spec: Dict[str, Any] = {
        "schedulerName": "volcano",
        "queue": cfg.get("queue"),
        "minAvailable": min_available,
        "maxRetry": min(role.max_retries for role in app.roles),
        "plugins": {"svc": ["--publish-not-ready-addresses"], "env": []},
        "tasks": tasks,
    }
    if cfg.get("priority_class"):
        spec["priorityClassName"] = cfg["priority_class"]
    labels = _app_labels(app, unique_name)
    metadata = serialize(_metadata(unique_name, namespace, labels, _job_annotations(app) or None))
    return {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Job",
        "metadata": metadata,
        "spec": spec,
    }


def indexed_job_name(unique_name: str, role_dns: str) -> str:
    return f"{unique_name}-{role_dns}"


def _replica_id_refs(role: Role) -> Tuple[str, str]:
    """How ``${replica_id}`` reads the pod's completion index in (args, env values).

    The kubelet expands ``$(VAR)`` in command/args and env values, but not inside a
    shell's ``$( ... )``; a shell entrypoint (``bash -c ...``, as dist.ddp) therefore
    gets the shell form ``${TORCHX_REPLICA_ID}``.
    """
    kubelet_ref = f"$({REPLICA_ID_ENV})"
    is_shell = posixpath.basename(role.entrypoint) in SHELLS
    return (f"${{{REPLICA_ID_ENV}}}" if is_shell else kubelet_ref), kubelet_ref


def indexed_jobs(
    app: AppDef,
    unique_name: str,
    namespace: str,
    cfg: Dict[str, Any],
    secret: Optional[EnvSecret] = None,
) -> List[Dict[str, Any]]:
    """A headless Service plus one Indexed ``batch/v1`` Job per role (no Volcano needed).

    Pods get the stable DNS names ``{job}-{index}.{service}``; the rank-0 host is
    ``{first role's job}-0.{service}``. There is no gang scheduling: elastic roles
    rely on torchrun's rendezvous (MIN..MAX nodes); failed pods are recreated per
    index up to ``max_retries`` times.
    """
    from kubernetes.client.models import (
        V1Job,
        V1JobSpec,
        V1Service,
        V1ServicePort,
        V1ServiceSpec,
    )

    role_names = role_dns_names(app)
    job_annotations = _job_annotations(app)
    rank0_host = f"{indexed_job_name(unique_name, role_names[0])}-0.{unique_name}"
    ports = {
        normalize_name(name, 15, fallback=f"port-{port}"): port
        for role in app.roles
        for name, port in role.port_map.items()
    }
    service = V1Service(
        api_version="v1",
        kind="Service",
        metadata=_metadata(unique_name, namespace, _app_labels(app, unique_name)),
        spec=V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={LABEL_UNIQUE_NAME: unique_name},
            ports=[V1ServicePort(name=n, port=p, target_port=p) for n, p in ports.items()] or None,
        ),
    )
    out = [serialize(service)]
    # first, so that the kubelet expands ``$(TORCHX_REPLICA_ID)`` in the env values after it
    replica_env = {
        REPLICA_ID_ENV: f"{FIELD_PATH_PREFIX}metadata.annotations['{ANNOTATION_COMPLETION_INDEX}']"
    }
    for role_idx, (role, role_dns) in enumerate(zip(app.roles, role_names, strict=True)):
        args_ref, env_ref = _replica_id_refs(role)
        base = dict(img_root="", app_id=f"{namespace}:{unique_name}", rank0_env=RANK0_ENV)
        with_args = macros.Values(replica_id=args_ref, **base).apply(role)
        with_env = macros.Values(replica_id=env_ref, **base).apply(role)
        with_args.env = {**replica_env, **with_env.env}
        with_args.metadata = with_env.metadata
        with_args.env[RANK0_ENV] = rank0_host
        labels = _role_labels(app, unique_name, role_idx, role)
        job_name = indexed_job_name(unique_name, role_dns)
        template = pod_template(
            with_args,
            role_dns,
            labels,
            _annotations(app, role),
            cfg,
            subdomain=unique_name,
            priority_class=cfg.get("priority_class"),
            # only the rank-0 pod is judged, as for Volcano (one template for every index)
            stall_timeout=app_stall_timeout(app) if role_idx == 0 else None,
            watch_options=("--only-where", f"{REPLICA_ID_ENV}=0"),
            secret=secret,
        )
        job = V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=_metadata(
                job_name, namespace, labels, {ANNOTATION_ROLE_NAME: role.name, **job_annotations}
            ),
            spec=V1JobSpec(
                completion_mode="Indexed",
                completions=role.num_replicas,
                parallelism=role.num_replicas,
                backoff_limit=role.max_retries,
                template=template,
            ),
        )
        out.append(serialize(job))
    return out


def env_secret_name(unique_name: str) -> str:
    return f"{unique_name}-env"


def env_secret(app: AppDef, unique_name: str, namespace: str, secret: EnvSecret) -> Dict[str, Any]:
    """The app's Secret, labelled as the app; ``schedule`` adds its owners (``owned_by``)."""
    from kubernetes.client.models import V1Secret

    meta = _metadata(secret.name, namespace, _app_labels(app, unique_name))
    body = V1Secret(
        api_version="v1", kind="Secret", type="Opaque", metadata=meta, string_data=secret.data
    )
    return serialize(body)


def owned_by(obj: Dict[str, Any], owners: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """``obj`` owned by the created ``owners`` (their uids): Kubernetes' garbage collector
    deletes it once they are all deleted (``kubectl delete``, ``torchx cancel``)."""
    from kubernetes.client.models import V1OwnerReference

    refs = [
        V1OwnerReference(
            api_version=o["apiVersion"],
            kind=o["kind"],
            name=o["metadata"]["name"],
            uid=o["metadata"]["uid"],
        )
        for o in owners
    ]
    meta = {**obj["metadata"], "ownerReferences": serialize(refs)}
    return {**obj, "metadata": meta}
