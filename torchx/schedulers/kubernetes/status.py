"""From Kubernetes objects (plain dicts as the API returns them) to torchx states.

Pure functions, no client calls: Volcano Job and ``batch/v1`` Job phases map to an
``AppState``; pods map to per-replica states, and a pod that cannot make progress
(bad image, bad config, OOM kill, unschedulable) is reported with its reason instead
of sitting in PENDING forever (upstream torchx#207).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from torchx.runtime.watchdog import stall_reason_in
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER, STALL_TIMEOUT, DescribeAppResponse
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_COMPLETION_INDEX,
    ANNOTATION_OWNER,
    ANNOTATION_ROLE_NAME,
    ANNOTATION_STALL_TIMEOUT,
    GPU_RESOURCE,
    LABEL_IDEMPOTENCY_TOKEN,
    LABEL_REPLICA_ID,
    LABEL_ROLE_INDEX,
    LABEL_ROLE_NAME,
    LABEL_UNIQUE_NAME,
    ROLE_NAME_MAX,
    env_secret_name,
    normalize_name,
    task_name,
)
from torchx.specs.api import (
    NONE,
    AppState,
    ReplicaStatus,
    Resource,
    Role,
    RoleStatus,
    is_terminal,
)
from torchx.util.quantity import InvalidQuantityError, cpu_whole_cores, memory_mib

Obj = Dict[str, Any]

# Volcano job phases (upstream torchx's JOB_STATE, plus Completing).
VOLCANO_JOB_STATE: Dict[str, AppState] = {
    "Pending": AppState.PENDING,
    "Running": AppState.RUNNING,
    "Restarting": AppState.RUNNING,
    "Completing": AppState.RUNNING,
    "Aborting": AppState.RUNNING,
    "Terminating": AppState.RUNNING,
    "Completed": AppState.SUCCEEDED,
    "Terminated": AppState.FAILED,
    "Failed": AppState.FAILED,
    "Aborted": AppState.CANCELLED,
}

POD_PHASE_STATE: Dict[str, AppState] = {
    "Pending": AppState.PENDING,
    "Running": AppState.RUNNING,
    "Succeeded": AppState.SUCCEEDED,
    "Failed": AppState.FAILED,
    "Unknown": AppState.UNKNOWN,
}

# Waiting reasons a pod does not recover from without a change to the job.
FATAL_WAITING_REASONS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
}


@dataclass
class PodInfo:
    """What describe and log_iter need from one pod."""

    name: str
    role: str
    replica_id: int
    state: AppState
    hostname: str
    problem: str  # "" when none
    fatal: bool  # the problem stops the app from ever running
    created: str


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def job_metadata(job: Obj) -> Dict[str, str]:
    """The app metadata a job stores: its idempotency token (a label), owner and stall
    timeout (annotations), as ``DescribeAppResponse.metadata``."""
    meta = _meta(job)
    annotations = meta.get("annotations") or {}
    found = {
        IDEMPOTENCY_TOKEN: (meta.get("labels") or {}).get(LABEL_IDEMPOTENCY_TOKEN),
        OWNER: annotations.get(ANNOTATION_OWNER),
        STALL_TIMEOUT: annotations.get(ANNOTATION_STALL_TIMEOUT),
    }
    return {k: str(v) for k, v in found.items() if v}


def role_name_of(obj_or_template: Obj) -> str:
    meta = _meta(obj_or_template)
    annotated = (meta.get("annotations") or {}).get(ANNOTATION_ROLE_NAME)
    return annotated or (meta.get("labels") or {}).get(LABEL_ROLE_NAME, "")


def replica_id_of(pod: Obj) -> Optional[int]:
    """Volcano pods carry our replica label; Indexed Job pods their completion index (an
    annotation since Kubernetes 1.21, also a label since 1.28)."""
    meta = _meta(pod)
    replica = (meta.get("labels") or {}).get(LABEL_REPLICA_ID)
    index = (meta.get("annotations") or {}).get(ANNOTATION_COMPLETION_INDEX)
    for value in (replica, index):
        if value is not None and str(value).isdigit():
            return int(value)
    return None


def pod_problem(pod: Obj) -> Tuple[str, bool]:
    """(reason: message, fatal) for a pod that is stuck or died for a known reason."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in FATAL_WAITING_REASONS:
            return _reason(reason, waiting.get("message")), not _awaits_its_secret(pod, waiting)
        for state_key in ("state", "lastState"):
            terminated = (cs.get(state_key) or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                return "OOMKilled: the container exceeded its memory limit (raise memMB)", False
            if state_key == "state" and terminated.get("exitCode") not in (None, 0):
                stalled = stall_reason_in(terminated.get("message") or "")
                if stalled:  # the watchdog's last line (``FallbackToLogsOnError``)
                    return stalled, False
                detail = terminated.get("message") or f"exit code {terminated.get('exitCode')}"
                return _reason(terminated.get("reason") or "Error", detail), False
        if reason == "CrashLoopBackOff":
            return _reason(reason, waiting.get("message")), False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _reason(cond.get("reason") or "Unschedulable", cond.get("message")), False
    if status.get("reason"):  # e.g. Evicted, DeadlineExceeded
        return _reason(status["reason"], status.get("message")), False
    return "", False


def _awaits_its_secret(pod: Obj, waiting: Obj) -> bool:
    """The pod started before its app's own Secret, which ``schedule`` creates right after
    the job: the kubelet retries until it exists (a missing Secret the user named is fatal)."""
    app = (_meta(pod).get("labels") or {}).get(LABEL_UNIQUE_NAME)
    missing = f'secret "{env_secret_name(str(app))}" not found'
    return bool(app) and missing in str(waiting.get("message") or "")


def _reason(reason: str, message: Optional[str]) -> str:
    message = " ".join(str(message or "").split())
    return f"{reason}: {message}" if message else reason


def pod_info(pod: Obj) -> Optional[PodInfo]:
    replica_id = replica_id_of(pod)
    if replica_id is None:
        return None
    status = pod.get("status") or {}
    state = POD_PHASE_STATE.get(status.get("phase") or "Pending", AppState.UNKNOWN)
    problem, fatal = pod_problem(pod)
    if fatal and state == AppState.PENDING:
        state = AppState.FAILED
    return PodInfo(
        name=str(_meta(pod).get("name") or ""),
        role=role_name_of(pod),
        replica_id=replica_id,
        state=state,
        hostname=(pod.get("spec") or {}).get("nodeName") or "",
        problem=problem if state in (AppState.PENDING, AppState.FAILED) else "",
        fatal=fatal,
        created=str(_meta(pod).get("creationTimestamp") or ""),
    )


def latest_pods(pods: Iterable[Obj]) -> Dict[Tuple[str, int], PodInfo]:
    """The newest pod of each (role, replica) (a restarted replica has several)."""
    infos = sorted((i for i in map(pod_info, pods) if i is not None), key=lambda i: i.created)
    return {(info.role, info.replica_id): info for info in infos}


def volcano_state(job: Obj) -> AppState:
    phase = ((job.get("status") or {}).get("state") or {}).get("phase")
    if _meta(job).get("deletionTimestamp"):
        return AppState.CANCELLED
    if not phase:
        return AppState.SUBMITTED  # accepted by the API server, not yet seen by Volcano
    return VOLCANO_JOB_STATE.get(phase, AppState.UNKNOWN)


def batch_job_state(job: Obj) -> Tuple[AppState, str]:
    """(state, message) of a ``batch/v1`` Job from its conditions and counters."""
    status = job.get("status") or {}
    if _meta(job).get("deletionTimestamp"):
        return AppState.CANCELLED, ""
    for cond in status.get("conditions") or []:
        if str(cond.get("status")) != "True":
            continue
        if cond.get("type") in ("Failed", "FailureTarget"):
            return AppState.FAILED, _reason(cond.get("reason") or "Failed", cond.get("message"))
        if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return AppState.SUCCEEDED, ""
        if cond.get("type") == "Suspended":
            return AppState.PENDING, "Suspended"
    if not status:
        return AppState.SUBMITTED, ""
    if (status.get("ready") or 0) > 0 or (status.get("succeeded") or 0) > 0:
        return AppState.RUNNING, ""
    return AppState.PENDING, ""


def combine_states(states: List[AppState]) -> AppState:
    """One app state from its parts (one Indexed Job per role: never none)."""
    for terminal in (AppState.FAILED, AppState.CANCELLED):
        if terminal in states:
            return terminal
    if all(s == AppState.SUCCEEDED for s in states):
        return AppState.SUCCEEDED
    if any(s in (AppState.RUNNING, AppState.SUCCEEDED) for s in states):
        return AppState.RUNNING
    if AppState.PENDING in states:
        return AppState.PENDING
    return states[0]


def describe_volcano(app_id: str, job: Obj, pods: List[Obj]) -> DescribeAppResponse:
    roles = volcano_roles(job)
    task_counts = (job.get("status") or {}).get("taskStatusCount") or {}

    def from_task_counts(role_idx: int, replica_id: int) -> Optional[AppState]:
        """A replica's state from its task's pod phase counts (when its pod is not visible)."""
        role_dns = normalize_name(roles[role_idx].name, ROLE_NAME_MAX, fallback="role")
        phases = (task_counts.get(task_name(role_dns, replica_id)) or {}).get("phase") or {}
        states = [POD_PHASE_STATE.get(p, AppState.UNKNOWN) for p, n in phases.items() if n]
        # of pods in several phases the most advanced wins: AppState is in lifecycle order
        return max(states, key=lambda state: (state != AppState.UNKNOWN, state), default=None)

    restarts = int((job.get("status") or {}).get("retryCount") or 0)
    resp = describe_response(app_id, volcano_state(job), roles, pods, from_task_counts, restarts)
    resp.metadata = job_metadata(job)
    return resp


def describe_indexed(app_id: str, jobs: List[Obj], pods: List[Obj]) -> DescribeAppResponse:
    parts = [batch_job_state(j) for j in jobs]
    state = combine_states([s for s, _ in parts])
    msg = next((m for s, m in parts if s == AppState.FAILED and m), "")
    restarts = sum(int((j.get("status") or {}).get("failed") or 0) for j in jobs)
    roles = indexed_roles(jobs)
    resp = describe_response(app_id, state, roles, pods, lambda r, i: None, restarts, msg)
    resp.metadata = job_metadata(jobs[0])
    return resp


def describe_response(
    app_id: str,
    state: AppState,
    roles: List[Role],
    pods: List[Obj],
    fallback: Callable[[int, int], Optional[AppState]],
    restarts: int,
    msg: str = "",
) -> DescribeAppResponse:
    """The app's response from its job state and pods: each replica's state comes from its
    newest pod, else ``fallback(role_idx, replica_id)``, else the app's state."""
    latest = latest_pods(pods)
    statuses: List[RoleStatus] = []
    problems: List[Tuple[bool, str]] = []
    for role_idx, role in enumerate(roles):
        replicas = []
        for i in range(role.num_replicas):
            info = latest.get((role.name, i))
            if info is not None:
                r_state, host, err = info.state, info.hostname, info.problem
                if info.problem:
                    problems.append((info.fatal, f"{role.name}[{i}]: {info.problem}"))
            else:
                r_state = fallback(role_idx, i) or (
                    state if is_terminal(state) else AppState.PENDING
                )
                host, err = "", ""
            if state == AppState.CANCELLED and not is_terminal(r_state):
                r_state = AppState.CANCELLED
            replicas.append(ReplicaStatus(i, r_state, role.name, host, err or NONE))
        statuses.append(RoleStatus(role.name, replicas))
    fatal = [p for f, p in problems if f]
    stalled = [p.split(": ", 1)[1] for _, p in problems if ": stalled: " in p]
    if stalled and state == AppState.FAILED:  # a replica's watchdog stopped it
        msg = stalled[0]
    elif fatal and state in (AppState.SUBMITTED, AppState.PENDING):
        # A pod that can never start: report it instead of PENDING forever (torchx#207).
        state = AppState.FAILED
        msg = f"{fatal[0]} (the job is still on the cluster: `torchx cancel` deletes it)"
    elif problems and not msg:
        msg = problems[0][1]
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=restarts,
        msg=msg or NONE,
        roles_statuses=statuses,
        roles=roles,
    )


def _quantity(parse: Callable[[str], int], q: Optional[str]) -> int:
    """A limit read back (-1: none or not a quantity a user could fix here)."""
    try:
        return parse(q) if q else -1
    except InvalidQuantityError:
        return -1


def role_from_template(
    template: Obj, num_replicas: int, min_replicas: Optional[int], max_retries: int
) -> Role:
    """A Role read back from a pod template (macros already substituted)."""
    spec = template.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    command = list(container.get("command") or [])
    limits = (container.get("resources") or {}).get("limits") or {}
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return Role(
        name=role_name_of(template),
        image=container.get("image", ""),
        entrypoint=command[0] if command else "",
        args=command[1:],
        env=env,
        num_replicas=num_replicas,
        min_replicas=min_replicas,
        max_retries=max_retries,
        resource=Resource(
            cpu=_quantity(cpu_whole_cores, limits.get("cpu")),
            gpu=int(limits.get(GPU_RESOURCE, 0) or 0),
            memMB=_quantity(memory_mib, limits.get("memory")),
        ),
    )


def volcano_roles(job: Obj) -> List[Role]:
    """Roles of a Volcano job: its tasks grouped by role (in role-index order)."""
    groups: Dict[Tuple[int, str], List[Obj]] = {}
    for task in (job.get("spec") or {}).get("tasks") or []:
        template = task.get("template") or {}
        labels = _meta(template).get("labels") or {}
        key = (int(labels.get(LABEL_ROLE_INDEX, 0)), role_name_of(template))
        groups.setdefault(key, []).append(task)
    roles = []
    for (_, _), tasks in sorted(groups.items()):
        elastic = any("minAvailable" in t for t in tasks)
        min_replicas = sum(1 for t in tasks if t.get("minAvailable")) if elastic else None
        roles.append(
            role_from_template(
                tasks[0].get("template") or {},
                len(tasks),
                min_replicas,
                int(tasks[0].get("maxRetry") or 0),
            )
        )
    return roles


def indexed_roles(jobs: List[Obj]) -> List[Role]:
    def index(job: Obj) -> int:
        return int((_meta(job).get("labels") or {}).get(LABEL_ROLE_INDEX, 0))

    roles = []
    for job in sorted(jobs, key=index):
        spec = job.get("spec") or {}
        roles.append(
            role_from_template(
                spec.get("template") or {},
                int(spec.get("completions") or 1),
                None,
                int(spec.get("backoffLimit") or 0),
            )
        )
    return roles
