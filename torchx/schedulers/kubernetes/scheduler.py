"""``kubernetes``: run an app as a Volcano Job (default) or as Indexed Jobs (no Volcano).

``-cfg job_type=volcano`` (upstream-compatible) submits one ``batch.volcano.sh/v1alpha1`` Job
with one task per replica: Volcano gang-schedules the replicas (``minAvailable`` = the roles'
``min_replicas``), its svc plugin gives every pod a stable host name, and the replicas reach
the rank-0 host as ``$VC_{ROLE}_0_HOSTS`` (rank 0 itself uses ``localhost``).
``-cfg job_type=indexed`` needs only stock Kubernetes (upstream torchx#660): one Indexed
``batch/v1`` Job per role plus a headless Service (see ``manifests.indexed_jobs``).

Secrets (``torchx.specs.secrets``) never sit in a Job or pod spec: the roles' secret env
values (the user's, and MLflow credentials torchx injects) go to the app's own Secret
``{name}-env``, and ``-cfg secret_env=VAR:SECRET[:KEY]`` names an existing one; the pods
read both through ``valueFrom.secretKeyRef``. The app's Secret is created right after its
job, owned by it (``ownerReferences`` with the job's uid, known only once it exists), so
Kubernetes deletes it with the job and it never outlives it. A pod that starts before it
exists waits (the kubelet retries ``CreateContainerConfigError``); the Secret follows its
job within one API call.

App ids are ``{namespace}:{name}``. A keyed submission (``Runner.run(idempotency_key=...)``)
claims its name with a ConfigMap before creating its job (``claims``). Workspaces are
``DockerWorkspaceMixin``'s: ``schedule`` pushes the image before creating anything.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
    TypedDict,
)

import yaml

from torchx.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    keyed_app_id,
    schedule_named,
)
from torchx.schedulers.kubernetes import claims
from torchx.schedulers.kubernetes import logs as kl
from torchx.schedulers.kubernetes import status as ks
from torchx.schedulers.kubernetes.api import (
    KubernetesError,
    api_errors,
    kubeconfig_path,
    load_api_client,
    status_message,
    tolerating,
)
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_APP_NAME,
    ANNOTATION_SUBMITTED_AT,
    JOB_TYPE_INDEXED,
    JOB_TYPE_VOLCANO,
    JOB_TYPES,
    LABEL_APP_NAME,
    LABEL_IDEMPOTENCY_TOKEN,
    LABEL_ORGANIZATION,
    LABEL_UNIQUE_NAME,
    ORGANIZATION,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
    EnvSecret,
    app_object_name,
    claim_config_map,
    env_secret,
    env_secret_name,
    indexed_jobs,
    named_secret_env,
    owned_by,
    parse_toleration,
    role_dns_names,
    unique_app_name,
    volcano_job,
)
from torchx.specs.api import (
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    InvalidArgumentError,
    InvalidRunConfigException,
    is_terminal,
    runopts,
)
from torchx.specs.secrets import MASK
from torchx.util.modules import import_optional
from torchx.workspace.docker_workspace import DockerWorkspaceMixin, ImagesToPush

if TYPE_CHECKING:
    from docker import DockerClient

logger = logging.getLogger(__name__)


class KubernetesOpts(TypedDict, total=False):
    queue: Optional[str]
    namespace: Optional[str]
    service_account: Optional[str]
    priority_class: Optional[str]
    image_repo: Optional[str]
    quiet: bool
    node_selector: Optional[Dict[str, str]]
    tolerations: Optional[List[str]]
    image_pull_secrets: Optional[List[str]]
    job_type: str
    secret_env: Optional[Dict[str, str]]


class NameTaken(KubernetesError):
    """A keyed submission's name is claimed (``claims``) by another submission."""


@dataclasses.dataclass(eq=False)
class KubernetesJob:
    """The manifests ``schedule`` creates (a keyed submission's claim first, the app's
    Secret last); ``str()`` is YAML ``kubectl apply -f`` accepts, the Secret's values
    masked (``***``)."""

    manifests: List[Dict[str, Any]]
    namespace: str
    name: str
    job_type: str
    images_to_push: ImagesToPush = dataclasses.field(default_factory=dict)
    claim: Optional[Dict[str, Any]] = None
    secret: Optional[Dict[str, Any]] = None  # the app's Secret, without its owners yet

    @property
    def resource(self) -> Dict[str, Any]:
        """The main manifest: the Volcano Job, or the first role's Indexed Job."""
        return self.manifests[0] if self.job_type == JOB_TYPE_VOLCANO else self.manifests[1]

    def __str__(self) -> str:
        claim = [self.claim] if self.claim else []
        secret = []
        if self.secret is not None:  # its keys show, its values never
            shown = copy.deepcopy(self.secret)
            shown["stringData"] = dict.fromkeys(shown.get("stringData") or {}, MASK)
            secret.append(shown)
        return yaml.safe_dump_all(claim + self.manifests + secret, sort_keys=False, width=1000)

    __repr__ = __str__


def labels_of(obj: Dict[str, Any]) -> Dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def created(obj: Dict[str, Any]) -> Tuple[str, int]:
    """(creationTimestamp, submit time in ns): RFC 3339 UTC stamps sort as strings."""
    meta = obj.get("metadata") or {}
    submitted = str((meta.get("annotations") or {}).get(ANNOTATION_SUBMITTED_AT) or "")
    return str(meta.get("creationTimestamp") or ""), int(submitted) if submitted.isdigit() else 0


def app_name(obj: Dict[str, Any]) -> str:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_APP_NAME) or labels_of(obj).get(LABEL_APP_NAME, "")


def list_json(method: Any, namespace: str, labels: Dict[str, str]) -> List[Dict[str, Any]]:
    """The items with ``labels`` a namespaced list call returns (also when a server ignores
    the selector), as plain dicts (as the API sent them) rather than models."""
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    resp = method(namespace, label_selector=selector, _preload_content=False)
    items = json.loads(resp.data).get("items") or []
    return [i for i in items if all(labels_of(i).get(k) == v for k, v in labels.items())]


def parse_app_id(app_id: str) -> Tuple[str, str]:
    namespace, sep, name = app_id.partition(":")
    if not sep or not namespace or not name:
        raise InvalidArgumentError(
            f"{app_id!r} is not a kubernetes app id;"
            " expected NAMESPACE:NAME (e.g. default:trainer-abc12345)"
        )
    return namespace, name


class KubernetesScheduler(DockerWorkspaceMixin, Scheduler[KubernetesJob]):
    """Submits, watches, tails and deletes torchx apps on a Kubernetes cluster."""

    def __init__(
        self,
        session_name: str,
        client: Optional[Any] = None,
        docker_client: Optional[DockerClient] = None,  # upstream's positional order
        namespace: Optional[str] = None,
    ) -> None:
        super().__init__("kubernetes", session_name, docker_client=docker_client)
        self._client = client
        self._owns_client = client is None
        self._namespace = namespace
        self._kinds: Dict[str, str] = {}  # app_id -> job type, for apps this process saw
        self._cancelled: Set[str] = set()  # deleted by this process: CANCELLED, not "unknown"

    # a keyed app's name is its claim (``claims``): the API server keeps one of a name
    names_keyed_apps = True

    def _api_client(self) -> Any:
        if self._client is None:
            self._client = load_api_client()
        return self._client

    def _custom(self) -> Any:
        from kubernetes.client import CustomObjectsApi

        return CustomObjectsApi(self._api_client())

    def _core(self) -> Any:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self._api_client())

    def _batch(self) -> Any:
        from kubernetes.client import BatchV1Api

        return BatchV1Api(self._api_client())

    def close(self) -> None:
        if self._client is not None and self._owns_client:
            self._client.close()
            self._client = None

    def default_namespace(self) -> str:
        """The scheduler's namespace, else the kube context's, else ``default`` (no network)."""
        if self._namespace:
            return self._namespace
        try:
            import_optional("kubernetes", "kubernetes")
            from kubernetes import config

            _, active = config.list_kube_config_contexts(config_file=kubeconfig_path())
            namespace = (active or {}).get("context", {}).get("namespace")
        except Exception:  # no kubeconfig: fine for dry runs
            namespace = None
        self._namespace = namespace or "default"
        return self._namespace

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "queue",
            type_=str,
            help="Volcano queue to schedule the job in (required for job_type=volcano)",
        )
        opts.add(
            "namespace",
            type_=str,
            help="Kubernetes namespace (default: the kube context's, else 'default')",
        )
        opts.add("service_account", type_=str, help="service account the pods run as")
        opts.add("priority_class", type_=str, help="name of the PriorityClass of the job")
        opts.add(
            "node_selector",
            type_=Dict[str, str],
            help="node labels the pods must match, e.g. disktype:ssd;zone:a",
        )
        opts.add(
            "tolerations",
            type_=List[str],
            help="taints to tolerate, KEY[=VALUE][:EFFECT] separated by ';'"
            " (e.g. nvidia.com/gpu:NoSchedule)",
        )
        opts.add(
            "image_pull_secrets",
            type_=List[str],
            help="names of the secrets used to pull the images",
        )
        opts.add(
            "job_type",
            type_=str,
            default=JOB_TYPE_VOLCANO,
            help="volcano (a Volcano Job, gang-scheduled)"
            " or indexed (Indexed batch/v1 Jobs + headless Service, no Volcano)",
        )
        opts.add(
            "secret_env",
            type_=Dict[str, str],
            help="env vars read from existing Secrets in the job's namespace,"
            " VAR:SECRET[:KEY] separated by ';' (KEY defaults to VAR), e.g."
            " HF_TOKEN:hf-creds:token (KFP's use_secret_as_env); the app's own secret env"
            " values always go to a Secret of the app's, never in the pod spec",
        )
        return opts

    def _validate(
        self, app: AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        super()._validate(app, scheduler, cfg)
        cfg = cfg or {}
        defaults = {name: opt.default for name, opt in self.run_opts()}
        given = {k: v for k, v in cfg.items() if v is not None and v != defaults.get(k)}
        job_type = cfg.get("job_type") or JOB_TYPE_VOLCANO
        if job_type not in JOB_TYPES:
            raise InvalidRunConfigException(
                f"Run option 'job_type' must be one of {', '.join(JOB_TYPES)}, got {job_type!r}",
                "job_type",
                given,
            )
        if job_type == JOB_TYPE_VOLCANO and not cfg.get("queue"):
            raise InvalidRunConfigException(
                "Required run option 'queue' is missing for job_type=volcano; pass -cfg queue=QUEUE"
                " (a Volcano queue, e.g. default) or -cfg job_type=indexed",
                "queue",
                given,
            )
        tolerations = cfg.get("tolerations")
        for spec in tolerations if isinstance(tolerations, list) else []:
            parse_toleration(str(spec))
        named_secret_env(cfg)
        role_dns_names(app)

    def _submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, CfgVal]
    ) -> AppDryRunInfo[KubernetesJob]:
        import_optional("kubernetes", "kubernetes")  # the missing extra is reported first
        images_to_push = self.dryrun_push_images(app, cfg)  # workspace image -> image_repo:digest
        opts = dict(cfg)
        namespace = str(opts.get("namespace") or self.default_namespace())
        job_type = str(opts.get("job_type") or JOB_TYPE_VOLCANO)
        name = app_object_name(app)
        secret = EnvSecret(env_secret_name(name))
        if job_type == JOB_TYPE_VOLCANO:
            manifests = [volcano_job(app, name, namespace, opts, secret)]
        else:
            manifests = indexed_jobs(app, name, namespace, opts, secret)
        claim = claim_config_map(app, name, namespace) if keyed_app_id(app) else None
        job = KubernetesJob(manifests, namespace, name, job_type, images_to_push, claim)
        if secret.data:
            job.secret = env_secret(app, name, namespace, secret)
        return AppDryRunInfo(job, str)

    @api_errors()
    def schedule(self, dryrun_info: AppDryRunInfo[KubernetesJob]) -> str:
        self.push_images(dryrun_info.request.images_to_push)
        from kubernetes.client.rest import ApiException

        req = dryrun_info.request
        app_id = f"{req.namespace}:{req.name}"
        created: List[Tuple[str, str]] = []
        try:
            if req.claim is not None:
                self._core().create_namespaced_config_map(req.namespace, req.claim)
                created.append(("ConfigMap", req.name))
            jobs = []  # as the API server returned them: with their uids
            for manifest in req.manifests:
                kind = "VolcanoJob" if req.job_type == JOB_TYPE_VOLCANO else manifest["kind"]
                obj = self._create(kind, req.namespace, manifest)
                created.append((kind, manifest["metadata"]["name"]))
                if kind != "Service":
                    jobs.append(obj)
        except ApiException as e:
            self._rollback(created, req.namespace)  # no half-created apps
            raise self._api_error(e, req) from None
        if req.secret is not None:
            self._create_secret(req, jobs, created)
        self._kinds[app_id] = req.job_type
        claim = self._claim(req.namespace, req.name) if req.claim is not None else None
        if claim is not None and claims.claim_state(claim)[0] == AppState.CANCELLED:
            self._cancel_existing(app_id)  # a re-attached racer cancelled it before its job
        return app_id

    def _create(self, kind: str, namespace: str, manifest: Dict[str, Any]) -> Dict[str, Any]:
        """Create one of an app's objects; the object as the API server stored it."""
        if kind == "VolcanoJob":
            return self._custom().create_namespaced_custom_object(
                VOLCANO_GROUP, VOLCANO_VERSION, namespace, VOLCANO_PLURAL, manifest
            )
        if kind == "Service":
            resp = self._core().create_namespaced_service(
                namespace, manifest, _preload_content=False
            )
        else:
            resp = self._batch().create_namespaced_job(namespace, manifest, _preload_content=False)
        return json.loads(resp.data)

    def _create_secret(
        self, req: KubernetesJob, jobs: List[Dict[str, Any]], created: List[Tuple[str, str]]
    ) -> None:
        """The app's Secret, owned by its ``jobs``; without it the app is deleted again."""
        from kubernetes.client.rest import ApiException

        assert req.secret is not None
        name = req.secret["metadata"]["name"]
        if not all((job.get("metadata") or {}).get("uid") for job in jobs):
            reason = "the API server returned the job without a uid to own it"
        else:
            try:
                self._core().create_namespaced_secret(req.namespace, owned_by(req.secret, jobs))
                return
            except ApiException as e:
                reason = f"Kubernetes API error {e.status} ({e.reason}): {status_message(e)}"
        self._rollback(created, req.namespace)
        raise KubernetesError(
            f"cannot create Secret {name} for {req.name}'s secret env ({reason});"
            " nothing was submitted"
        )

    def _rollback(self, created: List[Tuple[str, str]], namespace: str) -> None:
        for kind, name in created:
            self._delete(kind, namespace, name)

    def schedule_keyed(
        self, token: str, dryrun_info: AppDryRunInfo[KubernetesJob], reattach_succeeded: bool
    ) -> tuple[str, Optional[str]]:
        """The API server refuses a second ConfigMap of one name (409): the claim."""
        app_id = f"{dryrun_info.request.namespace}:{dryrun_info.request.name}"
        return schedule_named(
            self, token, dryrun_info, reattach_succeeded, app_id, lambda e: isinstance(e, NameTaken)
        )

    def _api_error(self, e: Any, req: KubernetesJob) -> KubernetesError:
        reason = status_message(e)
        if e.status == 409 and req.claim is not None:
            return NameTaken(f"{req.name} is claimed in namespace {req.namespace}: {reason}")
        if e.status == 409:
            return KubernetesError(
                f"a job named {req.name} already exists in namespace {req.namespace}: {reason}"
            )
        if e.status == 404 and req.job_type == JOB_TYPE_VOLCANO:
            return KubernetesError(
                f"Volcano jobs ({VOLCANO_GROUP}/{VOLCANO_VERSION})"
                f" are not served by this cluster: {reason};"
                " install Volcano or use -cfg job_type=indexed"
            )
        return KubernetesError(
            f"Kubernetes API error {e.status} ({e.reason}) creating {req.name}: {reason}"
        )

    def _get_volcano(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        with tolerating(404):
            return self._custom().get_namespaced_custom_object(
                VOLCANO_GROUP, VOLCANO_VERSION, namespace, VOLCANO_PLURAL, name
            )
        return None

    def _indexed_jobs(self, namespace: str, name: str) -> List[Dict[str, Any]]:
        return list_json(self._batch().list_namespaced_job, namespace, {LABEL_UNIQUE_NAME: name})

    def _pods(self, namespace: str, name: str) -> List[Dict[str, Any]]:
        return list_json(self._core().list_namespaced_pod, namespace, {LABEL_UNIQUE_NAME: name})

    @api_errors()
    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        namespace, name = parse_app_id(app_id)
        kind = self._kinds.get(app_id)
        if kind != JOB_TYPE_INDEXED:
            job = self._get_volcano(namespace, name)
            if job is not None:
                return ks.describe_volcano(app_id, job, self._pods(namespace, name))
        if kind != JOB_TYPE_VOLCANO:
            jobs = self._indexed_jobs(namespace, name)
            if jobs:
                return ks.describe_indexed(app_id, jobs, self._pods(namespace, name))
        claim = self._claim(namespace, name) if claims.is_keyed(name) else None
        if claim is not None:  # its job is gone (cancelled) or not yet created
            state, msg = claims.claim_state(claim)
            return DescribeAppResponse(app_id=app_id, state=state, msg=msg)
        if app_id in self._cancelled:
            return DescribeAppResponse(
                app_id=app_id, state=AppState.CANCELLED, msg="deleted by torchx cancel"
            )
        return None

    def _claim(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        items = list_json(
            self._core().list_namespaced_config_map, namespace, {LABEL_UNIQUE_NAME: name}
        )
        return next((c for c in items if c["metadata"]["name"] == name), None)

    @api_errors()
    def list(self) -> List[ListAppResponse]:
        """torchx apps (Volcano and Indexed) in the scheduler's (or kube context's) namespace."""
        found = self._find_apps(self.default_namespace(), {LABEL_ORGANIZATION: ORGANIZATION})
        return [app for _, app in found]

    @api_errors()
    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """Apps labelled with ``token`` in ``cfg``'s namespace (a keyed app submitted with
        ``-cfg namespace=...`` is found there by its retry), oldest first. Never the whole
        cluster: two teams' keys can be equal (the same DAG, task and run id), and a
        cluster-wide lookup would re-attach to, or cancel as a race's loser, another team's app.

        Order: creationTimestamp (whole seconds), then the submitter's submit time, then the
        app id. A claim (``claims``) whose job is gone is its app, CANCELLED or FAILED.
        """
        labels = {LABEL_ORGANIZATION: ORGANIZATION, LABEL_IDEMPOTENCY_TOKEN: token}
        namespace = str((cfg or {}).get("namespace") or "") or self.default_namespace()
        found = self._find_apps(namespace, labels)
        with_job = {app.app_id for _, app in found}
        for claim in list_json(self._core().list_namespaced_config_map, namespace, labels):
            app_id = f"{namespace}:{claim['metadata']['name']}"
            if app_id not in with_job:
                state = claims.claim_state(claim)[0]
                found.append((claim, ListAppResponse(app_id, state, name=app_name(claim))))
        found.sort(key=lambda pair: (*created(pair[0]), pair[1].app_id))
        return [app for _, app in found]

    def _find_apps(
        self, namespace: str, labels: Dict[str, str]
    ) -> List[Tuple[Dict[str, Any], ListAppResponse]]:
        """(oldest object, entry) of each app in ``namespace`` whose objects carry ``labels``:
        Volcano Jobs, and the Indexed Jobs of one app grouped by its unique-name label."""
        volcano = functools.partial(
            self._custom().list_namespaced_custom_object,
            VOLCANO_GROUP,
            VOLCANO_VERSION,
            plural=VOLCANO_PLURAL,
        )
        volcano_jobs: List[Dict[str, Any]] = []
        with tolerating(404):  # Volcano not installed
            volcano_jobs = list_json(volcano, namespace, labels)
        found = [(job["metadata"]["name"], ks.volcano_state(job), job) for job in volcano_jobs]
        groups: Dict[str, List[Dict[str, Any]]] = {}
        for job in list_json(self._batch().list_namespaced_job, namespace, labels):
            if labels_of(job).get(LABEL_UNIQUE_NAME):
                groups.setdefault(labels_of(job)[LABEL_UNIQUE_NAME], []).append(job)
        for name, jobs in groups.items():
            state = ks.combine_states([ks.batch_job_state(j)[0] for j in jobs])
            found.append((name, state, min(jobs, key=created)))
        return [
            (obj, ListAppResponse(f"{namespace}:{name}", state, name=app_name(obj)))
            for name, state, obj in found
        ]

    @api_errors()
    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = parse_app_id(app_id)
        if self._get_volcano(namespace, name) is not None:
            self._delete("VolcanoJob", namespace, name)
        else:
            for job in self._indexed_jobs(namespace, name):
                self._delete("Job", namespace, job["metadata"]["name"])
            self._delete("Service", namespace, name)
        if claims.is_keyed(name):  # its claim stays, so its name is never another app's
            body = {"data": {claims.CANCELLED_KEY: "true"}}
            with tolerating(404):  # submitted keyed by a torchx without claims
                self._core().patch_namespaced_config_map(name, namespace, body)
        self._cancelled.add(app_id)

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete an object and (foreground) its pods; already gone is fine."""
        with tolerating(404):
            if kind == "VolcanoJob":
                self._custom().delete_namespaced_custom_object(
                    VOLCANO_GROUP,
                    VOLCANO_VERSION,
                    namespace,
                    VOLCANO_PLURAL,
                    name,
                    propagation_policy="Foreground",
                )
            elif kind == "Job":
                self._batch().delete_namespaced_job(
                    name, namespace, propagation_policy="Foreground"
                )
            elif kind == "ConfigMap":  # a claim whose job could not be created
                self._core().delete_namespaced_config_map(name, namespace)
            else:
                self._core().delete_namespaced_service(name, namespace)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        should_tail: bool = False,
        streams: Optional[Stream] = None,
    ) -> Iterable[str]:
        """Lines of the pod of replica ``k`` of ``role_name`` (stdout and stderr combined)."""
        if streams not in (None, Stream.COMBINED):
            raise InvalidArgumentError(
                "kubernetes keeps stdout and stderr in one pod log;"
                " use --streams combined (the default)"
            )
        namespace, name = parse_app_id(app_id)

        def pod_name() -> Optional[str]:  # the newest (a restarted replica has several)
            info = ks.latest_pods(self._pods(namespace, name)).get((role_name, k))
            return info.name if info else None

        def ended() -> bool:
            desc = self.describe(app_id)
            return desc is None or is_terminal(desc.state)

        lines = kl.pod_log_lines(self._core, pod_name, ended, namespace, since, until, should_tail)
        return filter_regex(regex, lines)


def app_to_resource(
    app: AppDef, queue: str, service_account: Optional[str], priority_class: Optional[str] = None
) -> Dict[str, Any]:
    """Upstream's helper: the Volcano Job for ``app`` (namespace ``default``, unique name)."""
    import_optional("kubernetes", "kubernetes")
    cfg = {"queue": queue, "service_account": service_account, "priority_class": priority_class}
    return volcano_job(app, unique_app_name(app.name), "default", cfg)


def create_scheduler(
    session_name: str,
    client: Optional[Any] = None,
    docker_client: Optional[DockerClient] = None,
    **kwargs: Any,
) -> KubernetesScheduler:
    return KubernetesScheduler(
        session_name,
        client=client,
        namespace=kwargs.get("namespace"),
        docker_client=docker_client,
    )
