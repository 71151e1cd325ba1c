"""``TorchXOperator``: submit a torchx component, AppDef or torchrun line from an Airflow
task, stream its logs, wait (or defer to ``TorchXTrigger``), link and record lineage.

Retries re-attach on any worker (the scheduler stores the idempotency key, dag, task, run
and map index, with the job); a FAILED or CANCELLED app is never re-attached. Each task has
one stable Asset ``x-torchx://<dag_id>/<task_id>``: every DAG run adds an event to it.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from airflow.exceptions import AirflowConfigException, AirflowException
from airflow.sdk import Asset, BaseOperator, BaseOperatorLink
from airflow.sdk.log import mask_secret

from torchx.components.torchrun import COMPONENT
from torchx.pipelines import core
from torchx.pipelines.airflow.hook import DEFAULT_CONN_ID, TorchXHook
from torchx.pipelines.airflow.lineage import StageLineage, read_stage_lineage
from torchx.pipelines.airflow.reaper import Reapable
from torchx.pipelines.owner import airflow_owner, map_index_of
from torchx.pipelines.reap import cancel_if_owned
from torchx.pipelines.secrets import stage_secrets
from torchx.pipelines.torchrun import torchrun_stage
from torchx.runner.config import get_configured_trackers
from torchx.specs.api import AppDef, AppStatus

STAGE_SCHEME = "x-torchx://"


def _default_deferrable() -> bool:
    from airflow.configuration import conf

    try:
        return conf.getboolean("operators", "default_deferrable", fallback=False)
    except AirflowConfigException:  # a value that is not a boolean
        return False


class _TorchXLink(BaseOperatorLink):
    """An extra link the task computed (``""``: no link). It comes from the operator's
    memory, so a task without one reads no XCom and logs no "XCom not found" error."""

    name = ""
    kind = ""

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        if not isinstance(operator, TorchXOperator):
            return ""  # a serialized operator: its link was stored when the task ran
        return str(operator.torchx_links.get(self.kind, ""))


class TorchXAppLink(_TorchXLink):
    """Extra link: where the app's logs / UI are (the scheduler's ``ui_url``)."""

    name = "TorchX app"
    kind = "app"


class TorchXMLflowLink(_TorchXLink):
    """Extra link: the app's MLflow run in the MLflow UI (when there is a UI)."""

    name = "MLflow run"
    kind = "tracker"


def pipeline_run_id(dag_id: str, run_id: str) -> str:
    """The tracker run that groups every torchx job of one DAG run."""
    return f"airflow://{dag_id}/{run_id}"


def close_pipeline_run(
    context: Mapping[str, Any], trackers: Optional[Mapping[str, Optional[str]]] = None
) -> None:
    """DAG ``on_success_callback`` / ``on_failure_callback``: end the DAG run's tracker run
    FINISHED (DAG run succeeded) or FAILED. ``trackers`` default to the ``torchx_default``
    Connection's, else the configured ones; bind them with ``functools.partial`` when the
    operators are given ``trackers=``."""
    dag_run = context["dag_run"]
    succeeded = str(dag_run.state or "").endswith("success")
    if trackers is None:
        trackers = TorchXHook().settings.trackers
    core.close_pipeline_run(
        pipeline_run_id(dag_run.dag_id, dag_run.run_id),
        get_configured_trackers() if trackers is None else trackers,
        core.final_state(succeeded),
    )


class TorchXOperator(BaseOperator):
    """Run a torchx component (``utils.sh``, ``dist.ddp``, ``path/file.py:fn``), an AppDef or
    a torchrun command line as one Airflow task: submit (or re-attach), stream its logs,
    wait, link, record lineage.

    Returns the app handle (``scheduler://session/app_id``) as the task's XCom.

    :param component: component name (``utils.sh``, ``dist.ddp``) or ``path/file.py:function``;
        give this, ``app`` or ``torchrun``. Templated.
    :param app: an ``AppDef`` to run instead of a component.
    :param torchrun: a ``torchrun`` command line (a string or a list, with or without
        ``torchrun`` itself), run as the ``dist.ddp`` app ``torchx torchrun`` submits (see
        ``torchx.pipelines.torchrun``); it carries the script's arguments (no
        ``component_args``). Read when the task runs (the worker needs torch). Templated.
    :param component_args: the component's arguments, either as on the command line
        (``["--msg", "hi"]``) or as a dict of its parameters (``{"msg": "hi"}``); in the dict
        form a variadic component's extra arguments go under ``"args"`` as a list, e.g.
        ``{"args": ["echo", "hi"]}`` for ``utils.sh`` or
        ``{"script": "train.py", "j": "1x2", "args": ["--lr", "0.1"]}`` for ``dist.ddp``.
        Templated (rendered as JSON in the UI).
    :param scheduler: torchx scheduler (``local_cwd``, ``slurm``, ``kubernetes``,
        ``aws_batch``, ``ray``). Templated.
    :param cfg: scheduler run options, as ``torchx runopts <scheduler>`` lists them. Templated.
    :param wait_for_completion: wait for the app to end (default); ``False`` returns the
        handle at once (wait with ``TorchXSensor``).
    :param deferrable: wait in the triggerer (``TorchXTrigger``), freeing the worker slot;
        default: Airflow's ``[operators] default_deferrable``.
    :param poll_interval: seconds between status checks where the scheduler cannot push.
    :param get_logs: copy the replicas' log lines (``role/replica`` prefixed) into the task
        log as they are written (a deferred task: by the trigger, while deferred).
    :param progress_interval: seconds between reads of the job's progress report
        (``report_progress``); a changed one is logged as ``progress: step S/T, ...``
        (deferred or not). ``None``: no progress lines.
    :param stall_timeout: seconds; the job fails ``stalled: ...`` (the whole gang cancelled)
        when it neither prints nor reports progress for that long. Stored with the job.
    :param cancel_on_kill: cancel the app when the task is killed or marked failed.
    :param torchx_conn_id: the ``TorchXHook`` Connection with torchx's settings (state
        location, run-option defaults under this task's ``cfg``, trackers); without it, the
        environment's.
    :param trackers: ``{tracker: config}`` for this task's job, e.g.
        ``{"mlflow": "http://mlflow:5000"}`` (default: the configured ones,
        ``TORCHX_TRACKERS`` or ``.torchxconfig``); ``{}`` turns tracking off.
    :param parent_run_id: tracker run to nest the job's run under (default: the DAG run's
        ``airflow://<dag_id>/<run_id>``). Templated.
    :param durable: re-attach a retry to the app an earlier try of the same task instance
        submitted (found by the scheduler through the idempotency key), instead of
        submitting a second one.
    :param reuse_succeeded: with ``durable``, a cleared task whose app already SUCCEEDED
        returns that app instead of running again (a retry always does).
    :param record_assets: add the stable Asset ``x-torchx://<dag_id>/<task_id>`` (named
        ``torchx/<dag_id>/<task_id>``) to the task's outlets; its event on success names the
        app, and the output the stage recorded (``torchx.trackers.record_output``): the
        run's concrete ``uri``, the artifact, its digest and the tracker run (several
        outputs: the first flat, all under ``outputs``). (A mapped task gets none: give
        ``.partial(outlets=[Asset(...)])`` yourself if you need one.)
    :param outlets: Assets the task produces (Airflow's own parameter). A declared Asset
        whose URI is a path the stage recorded (``file:///abs/path`` for a local path) gets
        that output's extra on its event instead; declared outlets are also OpenLineage
        outputs.
    :param inlets: Assets the task consumes (Airflow's own parameter); OpenLineage inputs
        besides those the stage recorded (``torchx.trackers.record_input``).
    :param kwargs: any other ``BaseOperator`` argument (``task_id``, ``retries``, ...).
    """

    template_fields: Sequence[str] = (
        "component",
        "component_args",
        "torchrun",
        "scheduler",
        "cfg",
        "parent_run_id",
    )
    template_fields_renderers = {"component_args": "json", "cfg": "json"}
    operator_extra_links = (TorchXAppLink(), TorchXMLflowLink())
    ui_color = "#ee4c2c"

    def __init__(
        self,
        *,
        component: Optional[str] = None,
        app: Optional[AppDef] = None,
        torchrun: Union[str, List[str], None] = None,
        component_args: Union[List[str], Dict[str, Any], None] = None,
        scheduler: str = "local_cwd",
        cfg: Optional[Dict[str, Any]] = None,
        wait_for_completion: bool = True,
        deferrable: Optional[bool] = None,
        poll_interval: float = 5.0,
        get_logs: bool = True,
        cancel_on_kill: bool = True,
        trackers: Optional[Dict[str, Optional[str]]] = None,
        parent_run_id: Optional[str] = None,
        durable: bool = True,
        reuse_succeeded: bool = False,
        record_assets: bool = True,
        progress_interval: Optional[float] = core.PROGRESS_INTERVAL,
        stall_timeout: Optional[float] = None,
        torchx_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if [component, app, torchrun].count(None) != 2:
            raise ValueError(f"{self.task_id}: give exactly one of component=, app= or torchrun=")
        if torchrun is not None and component_args:
            raise ValueError(f"{self.task_id}: torchrun= holds the script's arguments")
        self.torchrun = torchrun
        self.component = COMPONENT if torchrun is not None else component
        self.app = app
        self.component_args = component_args if component_args is not None else []
        self.scheduler = scheduler
        self.cfg = cfg or {}
        self.wait_for_completion = wait_for_completion
        self.deferrable = _default_deferrable() if deferrable is None else deferrable
        self.poll_interval = poll_interval
        self.get_logs = get_logs
        self.cancel_on_kill = cancel_on_kill
        self.trackers = trackers
        self.parent_run_id = parent_run_id
        self.durable = durable
        self.reuse_succeeded = reuse_succeeded
        self.record_assets = record_assets
        self.progress_interval = progress_interval
        self.stall_timeout = stall_timeout
        self.torchx_conn_id = torchx_conn_id
        self._task_instance: Optional[tuple[str, str, str, int]] = None  # for on_kill
        self.app_handle: Optional[str] = None
        self.torchx_links: Dict[str, str] = {}  # what the extra links show (see _TorchXLink)
        self.stage_lineage: Optional[StageLineage] = None
        if record_assets and self.has_dag():
            self.outlets = [*self.outlets, stage_asset(self.dag_id, self.task_id)]

    @functools.cached_property
    def hook(self) -> TorchXHook:
        return TorchXHook(self.torchx_conn_id)

    def _runner(self) -> Any:
        return self.hook.runner(self.trackers)

    def _submit(self, context: Mapping[str, Any], runner: Any) -> str:
        ti = context["ti"]
        parent = self.parent_run_id or core.open_pipeline_run(
            pipeline_run_id(ti.dag_id, ti.run_id),
            runner.trackers(),
            orchestrator="airflow",
            dag_id=ti.dag_id,
        )
        component_args = self.component_args
        if self.torchrun is not None:
            component_args = torchrun_stage(self.torchrun).component_args
        key = core.stage_key("airflow", ti.dag_id, ti.task_id, ti.run_id, ti.map_index)
        handle = core.submit_or_attach(
            runner,
            self.app if self.app is not None else str(self.component),
            component_args,
            self.scheduler,
            self.hook.settings.cfg_for(self.scheduler, self.cfg),
            key if self.durable else None,
            parent_run_id=parent,
            # a SUCCEEDED app is returned rather than run again on a retry (a crash after it
            # succeeded must not run it twice), and after a clear with ``reuse_succeeded``
            reattach_succeeded=self.reuse_succeeded or is_retry(ti, self.retries),
            run_name=run_name(ti),
            run_params=run_params(context),
            owner=airflow_owner(ti, self.cancel_on_kill),
            stall_timeout=self.stall_timeout,
        )
        for secret in stage_secrets(runner, handle, component_args):
            mask_secret(secret)  # Airflow masks them in the task's log, the job's lines too
        verb = "re-attaching to" if runner.reattached(handle) else "submitted"
        self.log.info("%s %s", verb, handle)
        return handle

    def _link(self, ti: Any, link: _TorchXLink, url: Optional[str]) -> None:
        """Keep a real URL for the extra link (pushed now for readers of this try's XCom)."""
        if url:
            self.torchx_links[link.kind] = url
            ti.xcom_push(key=link.xcom_key, value=url)

    def execute(self, context: Any) -> str:
        ti = context["ti"]
        runner = self._runner()
        handle = self._submit(context, runner)
        self._remember(ti, handle)
        ti.xcom_push(key="app_handle", value=handle)
        status = runner.status(handle)
        self._link(ti, TorchXAppLink(), status.ui_url if status is not None else None)
        if not self.wait_for_completion:
            return handle
        if self.deferrable:
            from torchx.pipelines.airflow.trigger import TorchXTrigger

            # links are kept before deferring: Airflow stores them when the task defers
            self._link(ti, TorchXMLflowLink(), core.tracker_run_link(handle, runner.trackers()))
            self.defer(
                trigger=TorchXTrigger(
                    app_handle=handle,
                    poll_interval=self.poll_interval,
                    cancel_on_kill=self.cancel_on_kill,
                    get_logs=self.get_logs,
                    progress_interval=self.progress_interval,
                    torchx_home=self.hook.settings.torchx_home,
                ),
                method_name="execute_complete",
            )
        emit = self._emit if self.get_logs else None
        try:
            status = core.wait_or_cancel(
                runner,
                handle,
                self.poll_interval,
                emit,
                on_progress=self._progress,
                progress_interval=self.progress_interval,
            )
        except core.StageFailed as e:
            return self._finish(context, handle, e.status, runner)
        return self._finish(context, handle, status, runner)

    def execute_complete(self, context: Any, event: Optional[Dict[str, Any]] = None) -> str:
        """Resume after the trigger fired: check the event, copy the log lines the trigger
        did not stream (its event counts them per replica), raise on failure."""
        if not event or "app_handle" not in event or "state" not in event:
            raise AirflowException(f"invalid event from TorchXTrigger: {event!r}")
        handle = event["app_handle"]
        self._remember(context["ti"], handle)
        runner = self._runner()
        if self.get_logs:
            core.follow_logs(runner, handle, self._unstreamed(event.get("streamed")), tail=False)
        status = runner.status(handle)
        self._link(context["ti"], TorchXAppLink(), status.ui_url if status is not None else None)
        return self._finish(context, handle, status, runner)

    def _remember(self, ti: Any, handle: str) -> None:
        """Keep the app and its task instance: ``on_kill`` cancels only a job this one owns."""
        self.app_handle = handle
        self._task_instance = (ti.dag_id, ti.run_id, ti.task_id, map_index_of(ti))

    def _emit(self, role: str, replica: int, line: str) -> None:
        self.log.info("%s/%d %s", role, replica, line)

    def _progress(self, report: Any) -> None:
        self.log.info("%s", core.progress_line(report))

    def _unstreamed(self, streamed: Optional[Mapping[str, int]]) -> core.Emit:
        """``_emit`` for the lines past the first ``streamed[role/replica]`` of each replica
        (an older trigger's event has no counts: every line)."""
        skip = dict(streamed or {})
        seen: Dict[str, int] = {}

        def emit(role: str, replica: int, line: str) -> None:
            key = f"{role}/{replica}"
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > skip.get(key, 0):
                self._emit(role, replica, line)

        return emit

    def _finish(
        self, context: Mapping[str, Any], handle: str, status: Optional[AppStatus], runner: Any
    ) -> str:
        """Push the final status and the tracker link, read the stage's lineage back; the
        handle if the app SUCCEEDED (its Asset events emitted), else ``AirflowException``."""
        ti = context["ti"]
        if status is not None:
            ti.xcom_push(key="app_status", value=status.to_json())
        self.stage_lineage = read_stage_lineage(handle, runner.trackers())
        self._link(ti, TorchXMLflowLink(), self.stage_lineage.tracker_run_url)
        try:
            core.check_succeeded(handle, status)
        except core.StageFailed as e:
            raise AirflowException(str(e)) from None
        self._emit_asset_events(context, self.stage_lineage)
        self.log.info("%s SUCCEEDED", handle)
        return handle

    def _emit_asset_events(self, context: Mapping[str, Any], lineage: StageLineage) -> None:
        """A recorded output that is a declared Asset extends that Asset's event; the others
        go into the extra of the task's stable Asset's event (when ``record_assets``)."""
        events = context.get("outlet_events")
        if events is None:
            return
        mine = stage_asset(self.dag_id, self.task_id)
        declared = {o.uri: o for o in self.outlets if isinstance(o, Asset) and o != mine}
        # a mapped task's outlets come from .partial(): it has no stage Asset
        has_stage_asset = self.record_assets and any(o == mine for o in self.outlets)
        rest: List[Dict[str, str]] = []
        for output in lineage.outputs:
            extra = {**lineage.event_extra(output), "uri": output.uri}
            try:
                asset = declared.get(Asset(uri=output.uri).uri)
                if asset is not None:
                    events[asset].extra.update(extra)
                    continue
            except ValueError as e:  # Airflow's URI checks: never worth failing the stage
                self.log.warning("no Asset event for %s: %s", output.uri, e)
            rest.append(extra)
        if not has_stage_asset:
            return
        stage: Dict[str, Any] = {"torchx_app_handle": lineage.handle}
        if rest:
            stage.update(rest[0])
        if len(rest) > 1:
            stage["outputs"] = rest
        events[mine].extra.update(stage)

    def on_kill(self) -> None:
        ti, handle = self._task_instance, self.app_handle
        if not self.cancel_on_kill or not handle or ti is None:
            return
        job = Reapable(handle, *ti, state="killed")
        try:
            with self._runner() as runner:
                cancel_if_owned(runner, handle, job.is_owner, job.what(), "was killed", self.log)
        except Exception as e:  # on_kill must not raise: Airflow is ending the task anyway
            self.log.warning("could not cancel %s: %s", handle, e)

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage START: the declared inlets and outlets, and the torchx run facet."""
        return self._facets(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage COMPLETE: the datasets the stage read and wrote (as it recorded them)
        and a run facet with the app handle and its MLflow run id and link."""
        return self._facets(self._lineage_for(task_instance))

    # OpenLineage FAIL: as on complete, with whatever the stage recorded before failing
    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete

    def _facets(self, lineage: Optional[StageLineage]) -> Any:
        from torchx.pipelines.airflow.openlineage import operator_lineage

        inlets, outlets = _declared_uris(self.inlets), _declared_uris(self.outlets)
        return operator_lineage(self.component, self.scheduler, lineage, inlets, outlets)

    def _lineage_for(self, task_instance: Any) -> Optional[StageLineage]:
        if self.stage_lineage is not None:
            return self.stage_lineage
        handle = self.app_handle
        if handle is None:  # a failure here is caught and logged by Airflow's OpenLineage
            handle = task_instance.xcom_pull(task_ids=self.task_id, key="app_handle")
        if not handle:
            return None
        return read_stage_lineage(str(handle), self._runner().trackers())


def _declared_uris(assets: Sequence[Any]) -> List[str]:
    """The URIs of the Assets that name a dataset (not one named without a URI, nor a
    stage's own Asset, which names the task)."""
    return [
        a.uri
        for a in assets
        if isinstance(a, Asset) and "://" in a.uri and not a.uri.startswith(STAGE_SCHEME)
    ]


def stage_asset(dag_id: str, task_id: str) -> Asset:
    """A task's stable Asset ``x-torchx://<dag_id>/<task_id>`` (``x-``: a user scheme,
    which Airflow keeps as written)."""
    return Asset(name=f"torchx/{dag_id}/{task_id}", uri=f"{STAGE_SCHEME}{dag_id}/{task_id}")


def is_retry(ti: Any, retries: Optional[int]) -> bool:
    """Whether this try retries a failed or crashed one (not the first try since the run
    started or a clear): a clear sets ``max_tries = try_number + retries``, so a series
    starts at ``max_tries - retries + 1``, as the task SDK computes it."""
    try_number, max_tries = ti.try_number, ti.max_tries
    if not isinstance(try_number, int) or not isinstance(max_tries, int):
        return False
    return try_number > max_tries - (retries or 0) + 1


def run_name(ti: Any) -> str:
    """The job's tracker run name: the task id (with the map index of a mapped task)."""
    map_index = map_index_of(ti)
    if map_index >= 0:
        return f"{ti.task_id}[{map_index}]"
    return str(ti.task_id)


def run_params(context: Mapping[str, Any]) -> Dict[str, object]:
    """The job's tracker-run params: the task instance's identity, the DAG's params (which
    hold the run's conf by default) and conf keys that are not params."""
    ti = context["ti"]
    params: Dict[str, object] = {
        "airflow.dag_id": ti.dag_id,
        "airflow.task_id": ti.task_id,
        "airflow.run_id": ti.run_id,
    }
    if ti.try_number is not None:
        params["airflow.try_number"] = ti.try_number
    map_index = map_index_of(ti)
    if map_index >= 0:
        params["airflow.map_index"] = map_index
    dag_params = context.get("params") or {}
    for key in list(dag_params):
        params[f"airflow.params.{key}"] = dag_params[key]
    dag_run = context.get("dag_run")
    conf = (dag_run.conf if dag_run is not None else None) or {}
    for key, value in dict(conf).items():
        if key not in dag_params:
            params[f"airflow.conf.{key}"] = value
    return params
