"""The Runner: one entry point to submit, watch, log and cancel apps on any scheduler.

Upstream-compatible (``get_runner``, ``Runner.run_component``, ``wait``, ...); its
differences on purpose are listed in docs/differences.md.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Union

from torchx.runner import config as torchx_config
from torchx.runner.config import (  # noqa: F401 (upstream's names in this module)
    get_config,
    get_configs,
    get_configured_trackers,
)
from torchx.runner.events import log_event
from torchx.runner.resource_hours import ENV_JOB_START_MS, ResourceHours
from torchx.runner.tracker_session import OpenedJobRun, TrackerSession
from torchx.runner.tracking import JobRecorder, RunRequest, job_run, trackers_of, with_env
from torchx.runtime.progress import Progress, read_progress
from torchx.schedulers import SchedulerFactories, SchedulerFactory
from torchx.schedulers.api import (
    IDEMPOTENCY_GENERATION,
    IDEMPOTENCY_TOKEN,
    OWNER,
    STALL_TIMEOUT,
    GenerationTaken,
    ListAppResponse,
    Scheduler,
    Stream,
    cancel_loser,
    idempotency_token,
    validate_app,
)
from torchx.specs.api import (
    NONE,  # noqa: F401 (upstream's torchx.runner.api.NONE)
    AppDef,
    AppDryRunInfo,
    AppHandle,
    AppState,
    AppStatus,
    CfgVal,
    UnknownAppException,
    UnknownSchedulerException,
    is_terminal,
    macros,
    make_app_handle,
    parse_app_handle,
    runopts,
)
from torchx.trackers.env import ENV_TORCHX_JOB_ID, ENV_TORCHX_PARENT_RUN_ID, tracker_env
from torchx.workspace.api import Workspace, apply_workspace

if TYPE_CHECKING:
    from datetime import datetime

logger = logging.getLogger(__name__)

DEFAULT_SESSION_NAME = "torchx"
# a keyed submission whose app id an ended app took meanwhile tries the next one, this often
STALE_GENERATIONS = 3

ENV_TORCHX_INTERNAL_SESSION_ID = "TORCHX_INTERNAL_SESSION_ID"


class Runner:
    """Submits and manages apps; holds one scheduler client per backend."""

    def __init__(
        self,
        name: str,
        scheduler_factories: Mapping[str, SchedulerFactory],
        component_defaults: Optional[Dict[str, Dict[str, str]]] = None,
        scheduler_params: Optional[Dict[str, Any]] = None,
        trackers: Optional[Mapping[str, Optional[str]]] = None,
    ) -> None:
        self._name = name
        # None: the configured set (.torchxconfig / $TORCHX_TRACKERS), read at each dry run
        self._trackers = None if trackers is None else dict(trackers)
        self._scheduler_factories = scheduler_factories
        self._component_defaults = component_defaults or {}
        self._scheduler_params = scheduler_params or {}
        self._scheduler_instances: Dict[str, Scheduler] = {}
        self._apps: Dict[AppHandle, AppDef] = {}
        self._ended: set[AppHandle] = set()  # apps whose tracker run this runner ended
        self._reattached: set[AppHandle] = set()  # apps run() returned without launching
        self._tracking = TrackerSession()  # tracker clients, built once, closed with the runner
        # progress, resource-hours and failure reasons onto the runs of the apps it watches
        self._recorder = JobRecorder(self._tracking, self._apps, self.trackers, self.progress)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release scheduler and tracker clients. Jobs keep running: they are tracked on
        their scheduler, and any Runner that sees one end ends its tracker run."""
        for scheduler in self._scheduler_instances.values():
            scheduler.close()
        self._scheduler_instances.clear()
        self._tracking.close()

    def name(self) -> str:
        return self._name

    def run_component(
        self,
        component: str,
        component_args: Union[List[str], Dict[str, Any]],
        scheduler: str,
        cfg: Optional[Mapping[str, CfgVal]] = None,
        workspace: Optional[Union[Workspace, str]] = None,
        parent_run_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        reattach_succeeded: bool = False,
        run_name: Optional[str] = None,
        run_params: Optional[Mapping[str, object]] = None,
        stall_timeout: Optional[float] = None,
        owner: Optional[str] = None,
    ) -> AppHandle:
        """Materialize a component (``utils.echo``, ``file.py:fn``) and submit it.

        With ``idempotency_key``, ``run_name`` and ``run_params`` see :meth:`run`; the
        job's tracker run also records the component and its args.
        """
        app = self.materialize_component(component, component_args)
        return self.run(
            app,
            scheduler,
            cfg,
            workspace,
            parent_run_id,
            idempotency_key=idempotency_key,
            reattach_succeeded=reattach_succeeded,
            run_name=run_name,
            run_params=run_params,
            stall_timeout=stall_timeout,
            owner=owner,
            _component=(component, component_args),
        )

    def dryrun_component(
        self,
        component: str,
        component_args: Union[List[str], Dict[str, Any]],
        scheduler: str,
        cfg: Optional[Mapping[str, CfgVal]] = None,
        workspace: Optional[Union[Workspace, str]] = None,
        parent_run_id: Optional[str] = None,
        stall_timeout: Optional[float] = None,
    ) -> AppDryRunInfo[Any]:
        app = self.materialize_component(component, component_args)
        info = self.dryrun(
            app, scheduler, cfg, workspace, parent_run_id, stall_timeout=stall_timeout
        )
        # the tracker run records the component as the caller named it (utils.sh, not sh)
        info._run_request = RunRequest(component=(component, component_args), cfg=dict(cfg or {}))
        return info

    def materialize_component(
        self, component: str, component_args: Union[List[str], Dict[str, Any]]
    ) -> AppDef:
        """The ``AppDef`` a component returns for these args (defaults from .torchxconfig apply)."""
        fn = get_component(component).fn
        defaults = dict(torchx_config.get_configs("component", component))
        defaults.update(self._component_defaults.get(component, {}))
        if isinstance(component_args, dict):
            return materialize_appdef(fn, [], defaults, config=component_args)
        return materialize_appdef(fn, list(component_args), defaults)

    def run(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Optional[Mapping[str, CfgVal]] = None,
        workspace: Optional[Union[Workspace, str]] = None,
        parent_run_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        reattach_succeeded: bool = False,
        run_name: Optional[str] = None,
        run_params: Optional[Mapping[str, object]] = None,
        stall_timeout: Optional[float] = None,
        owner: Optional[str] = None,
        _component: Optional[tuple[str, Union[List[str], Dict[str, Any]]]] = None,
    ) -> AppHandle:
        """Submit ``app``; returns ``scheduler://session/app_id``.

        With trackers configured, the job's tracker run is opened here (not by its ranks),
        named ``run_name`` (default: the app's name), nested under ``parent_run_id``, with
        the component, args, scheduler, cfg, resources and ``run_params`` as params; it ends
        with the app when this runner sees it end (``wait``, ``status``, ``cancel``).

        With ``idempotency_key``, at most one live app runs per key on the scheduler: a
        pending or running app of the key (submitted from any process or machine) is
        returned and nothing is submitted; a SUCCEEDED one only with ``reattach_succeeded``;
        a FAILED or CANCELLED one never. Racing callers get one handle
        (``Scheduler.schedule_keyed``; how, per scheduler: docs/differences.md).

        With ``stall_timeout`` (seconds), stored with the job, an app that neither prints
        nor reports progress (``report_progress``) for that long is stopped and ends FAILED
        (``stalled: ...``) by the watchdog that runs with it (``torchx.runtime.watchdog``).
        ``owner``: alike.
        """
        token = idempotency_token(idempotency_key) if idempotency_key else None
        generation = 0  # how many apps of the key the lookup found (all ended)
        if idempotency_key:
            existing, generation = self._find_key(
                scheduler, idempotency_key, reattach_succeeded, cfg
            )
            if existing is not None:
                logger.info("re-attaching to %s (idempotency key %r)", existing, idempotency_key)
                self._reattached.add(existing)
                return existing
        request = RunRequest(
            name=run_name, params=dict(run_params or {}), component=_component, cfg=dict(cfg or {})
        )
        named = token and self._scheduler(scheduler).names_keyed_apps
        stale = 0
        while True:
            meta = {IDEMPOTENCY_TOKEN: token, OWNER: owner}
            meta[IDEMPOTENCY_GENERATION] = str(generation) if named else None
            info = self.dryrun(app, scheduler, cfg, workspace, parent_run_id, stall_timeout, meta)
            info._run_request = request
            info, opened = self._open_job_run(scheduler, info)
            try:
                return self._launch(scheduler, info, opened, token, reattach_succeeded)
            except GenerationTaken as e:  # our lookup was stale: the next generation
                stale += 1
                if stale == STALE_GENERATIONS:
                    raise
                generation = max(e.generation, generation + 1)

    def find_by_idempotency_key(
        self,
        scheduler: str,
        idempotency_key: str,
        reattach_succeeded: bool = False,
        cfg: Optional[Mapping[str, CfgVal]] = None,
    ) -> Optional[AppHandle]:
        """The app :meth:`run` (with ``cfg``: e.g. the Kubernetes namespace it looks in)
        would re-attach to for this key (None: it would submit): the oldest live one, else
        with ``reattach_succeeded`` the newest SUCCEEDED one. As :meth:`run`, it cancels the
        key's newer live apps (a race's losers whose submitter died before cancelling them),
        and ends the tracker runs of its ended ones that no waiter ended."""
        return self._find_key(scheduler, idempotency_key, reattach_succeeded, cfg)[0]

    def _find_key(
        self,
        scheduler: str,
        idempotency_key: str,
        reattach_succeeded: bool,
        cfg: Optional[Mapping[str, CfgVal]],
    ) -> tuple[Optional[AppHandle], int]:
        """``find_by_idempotency_key``, and how many apps the key has."""
        sched = self._scheduler(scheduler)
        sched.run_opts().check_known(cfg or {}, scheduler)  # a typo never re-attaches either
        apps = sched.find_by_idempotency_token(idempotency_token(idempotency_key), cfg or {})
        handle_of = functools.partial(make_app_handle, scheduler, self._name)
        for app in (a for a in apps if is_terminal(a.state)):
            try:
                self.status(handle_of(app.app_id))
            except Exception as e:  # a run left open is never worth failing a re-attach or submit
                logger.warning("could not end the tracker run of %s: %s", app.app_id, e)
        live = [handle_of(a.app_id) for a in apps if not is_terminal(a.state)]
        for loser in live[1:]:
            cancel_loser(loser, live[0], functools.partial(self._cancel_if_known, loser))
        done = [a for a in apps if reattach_succeeded and a.state == AppState.SUCCEEDED]
        return live[0] if live else handle_of(done[-1].app_id) if done else None, len(apps)

    def _cancel_if_known(self, handle: AppHandle) -> None:
        try:
            self.cancel(handle)  # ends its tracker run (KILLED) as a cancel does
        except UnknownAppException:  # gone meanwhile (cancelled by its own submitter)
            pass

    def reattached(self, app_handle: AppHandle) -> bool:
        """Whether :meth:`run` returned this app without launching it (a keyed re-attach)."""
        return app_handle in self._reattached

    def dryrun(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Optional[Mapping[str, CfgVal]] = None,
        workspace: Optional[Union[Workspace, str]] = None,
        parent_run_id: Optional[str] = None,
        stall_timeout: Optional[float] = None,
        _meta: Optional[Mapping[str, Optional[str]]] = None,
    ) -> AppDryRunInfo[Any]:
        """The scheduler request for ``app`` (on a copy: the caller's AppDef is untouched).

        Offline: trackers are checked by :meth:`schedule`, not here."""
        validate_app(app)
        app = copy.deepcopy(app)
        sched = self._scheduler(scheduler)
        trackers = self.trackers()
        app.metadata.update({k: v for k, v in (_meta or {}).items() if v})  # token, owner
        if stall_timeout is not None:
            if not stall_timeout > 0:
                raise ValueError(f"stall_timeout must be > 0 seconds, got {stall_timeout!r}")
            app.metadata[STALL_TIMEOUT] = f"{float(stall_timeout):g}"
        parent = os.environ.get(ENV_TORCHX_PARENT_RUN_ID) or parent_run_id
        job_id = make_app_handle(scheduler, self._name, macros.app_id)
        for role in app.roles:
            role.env[ENV_TORCHX_JOB_ID] = job_id
            role.env.setdefault(ENV_TORCHX_INTERNAL_SESSION_ID, self._name)
            if parent:
                role.env[ENV_TORCHX_PARENT_RUN_ID] = parent
            role.env.update(tracker_env(trackers))
        resolved = dict(cfg or {})
        torchx_config.apply(scheduler, resolved)
        with log_event(
            "dryrun",
            scheduler,
            app_image=app.roles[0].image,  # validate_app: it has roles
            runcfg=resolved,
            workspace=str(workspace) if workspace else None,
        ):
            sched._pre_build_validate(app, scheduler, resolved)
            build = apply_workspace(sched, app, workspace, resolved)
            info = sched.submit_dryrun(app, resolved)
            info._scheduler = scheduler  # the name it was asked under (as upstream)
            info._workspace = build
        return info

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> AppHandle:
        """Submit a request made by ``dryrun``; returns ``scheduler://session/app_id``."""
        scheduler = dryrun_info._scheduler
        if scheduler is None:
            raise ValueError("dryrun_info has no scheduler; create it with Runner.dryrun")
        dryrun_info, opened = self._open_job_run(scheduler, dryrun_info)
        return self._launch(scheduler, dryrun_info, opened)

    def _open_job_run(
        self, scheduler: str, info: AppDryRunInfo[Any]
    ) -> tuple[AppDryRunInfo[Any], Optional[OpenedJobRun]]:
        """Open the job's tracker runs (if it has trackers) and make the request again
        with their ids in every role's env; a failure ends the opened runs."""
        app = info.app
        if app is None or not (trackers := trackers_of(app)):
            return info, None
        self._tracking.validate(trackers)
        request = info._run_request or RunRequest(cfg=dict(info.cfg))
        job = job_run(app, scheduler, request, int(time.time() * 1000))
        opened = self._tracking.open(trackers, job)
        try:
            env = {**opened.env, ENV_JOB_START_MS: str(job.start_ms)}
            return with_env(self._scheduler(scheduler), info, env), opened
        except BaseException:  # nothing to launch: the opened runs end, then it is raised
            self._tracking.abort(opened)
            raise

    def _launch(
        self,
        scheduler: str,
        dryrun_info: AppDryRunInfo[Any],
        opened: Optional[OpenedJobRun],
        token: Optional[str] = None,
        reattach_succeeded: bool = False,
    ) -> AppHandle:
        """Submit the request (with ``token``: as the token's app, unless another submission
        holds it); a failure ends the runs opened for it (nothing was submitted)."""
        app, submitted = dryrun_info.app, time.time()
        sched = self._scheduler(scheduler)
        try:
            with log_event("schedule", scheduler) as event:
                if token:
                    winner, ours = sched.schedule_keyed(token, dryrun_info, reattach_succeeded)
                else:
                    winner = ours = sched.schedule(dryrun_info)
                event.app_id = ours
        except BaseException:  # nothing launched: the opened runs end, then it is raised
            if opened is not None:
                self._tracking.abort(opened)
            raise
        handle_of = functools.partial(make_app_handle, scheduler, self._name)
        if ours is None:  # the token's holder: this launches nothing, its run ends
            logger.info("re-attaching to %s (claimed)", handle_of(winner))
            self._tracking.supersede(opened, handle_of(winner))
            self._reattached.add(handle_of(winner))
            return handle_of(winner)
        handle = handle_of(ours)
        if app is not None:
            self._apps[handle] = app
            self._recorder.watch(handle, app.roles, submitted)
        if opened is not None:
            self._tracking.bind(opened, handle)
        logger.info("launched %s", handle)
        if winner != ours:  # ours lost a race and was cancelled: its run names the winner
            self._tracking.supersede(opened, handle_of(winner), end=False)
            self._end_job_run(handle, AppState.CANCELLED, [])
            self._reattached.add(handle_of(winner))
        return handle_of(winner)

    def status(self, app_handle: AppHandle) -> Optional[AppStatus]:
        """The app's status, or None if its scheduler does not know it."""
        sched, app_id = self._scheduler_app_id(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            return None
        if is_terminal(desc.state):
            self._end_job_run(app_handle, desc.state, desc.roles, desc.msg)
        else:  # seen running: this runner records its end (and knows when that was)
            self._recorder.watch(app_handle, desc.roles)
        return AppStatus(
            state=desc.state,
            num_restarts=max(desc.num_restarts, 0),
            msg=desc.msg,
            structured_error_msg=desc.structured_error_msg,
            ui_url=desc.ui_url,
            roles=desc.roles_statuses,
        )

    def wait(
        self, app_handle: AppHandle, wait_interval: float = 10, timeout: Optional[float] = None
    ) -> Optional[AppStatus]:
        """Block until the app is terminal (or ``timeout`` s); None if the app is unknown.

        ``wait_interval`` bounds the time between status checks, but schedulers that
        can see the app end (local) wake up at once. A stalled app is ended by its own
        watchdog (``torchx.runtime.watchdog``), FAILED like any failure.
        """
        sched, app_id = self._scheduler_app_id(app_handle)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(app_handle)
            if status is None or status.is_terminal():
                return status
            remaining = wait_interval
            if deadline is not None:
                remaining = min(remaining, deadline - time.monotonic())
                if remaining <= 0:
                    return status
            sched.wait_for_change(app_id, remaining)

    def progress(self, app_handle: AppHandle) -> Optional[Progress]:
        """The app's last progress report (``report_progress`` from rank 0), if any: from
        its progress file, else from its tracker run (a scheduler without a shared file)."""
        sched, app_id = self._scheduler_app_id(app_handle)
        report = read_progress(sched.progress_path(app_id))
        return report or self._recorder.tracked_progress(app_handle, self.describe)

    def resource_hours(self, app_handle: AppHandle) -> Optional[ResourceHours]:
        """The app's requested cpu- and gpu-hours, once this runner saw it end (None if it
        did not watch it run); see ``torchx.runner.resource_hours`` for the times."""
        return self._recorder.hours.get(app_handle)

    def describe(self, app_handle: AppHandle) -> Optional[AppDef]:
        """The AppDef of a submitted app (from this runner's cache or the scheduler)."""
        if app_handle in self._apps:
            return self._apps[app_handle]
        sched, app_id = self._scheduler_app_id(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            return None
        return AppDef(name=app_id, roles=desc.roles, metadata=desc.metadata)

    def log_lines(
        self,
        app_handle: AppHandle,
        role_name: str,
        k: int = 0,
        regex: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        should_tail: bool = False,
        streams: Optional[Stream] = None,
    ) -> Iterable[str]:
        """Log lines of replica ``k`` of ``role_name`` (each ending in ``\\n``)."""
        sched, app_id = self._scheduler_app_id(app_handle)
        if sched.describe(app_id) is None:
            raise UnknownAppException(app_handle)
        return sched.log_iter(
            app_id, role_name, k, regex, since, until, should_tail, streams=streams
        )

    def list(self, scheduler: str) -> List[ListAppResponse]:
        """Apps the scheduler knows, with their handles."""
        apps = self._scheduler(scheduler).list()
        for app in apps:
            app.app_handle = make_app_handle(scheduler, self._name, app.app_id)
        return apps

    def cancel(self, app_handle: AppHandle) -> None:
        """Cancel the app if it is still running (idempotent); unknown apps raise."""
        sched, app_id = self._scheduler_app_id(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            raise UnknownAppException(app_handle)
        # always ask the scheduler: an app reported FAILED may still hold resources (e.g. a
        # Kubernetes job whose image cannot be pulled); schedulers make cancel idempotent
        with log_event("cancel", sched.backend, app_id):
            sched.cancel(app_id)
        after = sched.describe(app_id) or desc
        state = after.state if is_terminal(after.state) else AppState.CANCELLED
        self._end_job_run(app_handle, state, after.roles or desc.roles, after.msg)

    def stop(self, app_handle: AppHandle) -> None:
        """Deprecated alias of :meth:`cancel`."""
        self.cancel(app_handle)

    def scheduler_backends(self) -> List[str]:
        return list(self._scheduler_factories.keys())

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        return self._scheduler(scheduler).run_opts()

    def cfg_from_str(self, scheduler: str, *cfg_literal: str) -> Dict[str, CfgVal]:
        """Parse ``"k=v,k2=v2"`` literals against the scheduler's run options."""
        opts = self.scheduler_run_opts(scheduler)
        cfg: Dict[str, CfgVal] = {}
        for literal in cfg_literal:
            cfg.update(opts.cfg_from_str(literal, strict=True))
        return cfg

    def trackers(self) -> Dict[str, Optional[str]]:
        """``{tracker: config}`` that jobs submitted by this runner report to."""
        if self._trackers is not None:
            return dict(self._trackers)
        return torchx_config.get_configured_trackers()

    def _end_job_run(
        self, handle: AppHandle, state: AppState, roles: List[Any], msg: str = ""
    ) -> None:
        """End the job's tracker run with the app (once per handle in this runner), after
        its last progress report, resource-hours and failure reason (``JobRecorder``)."""
        if handle not in self._ended:
            self._ended.add(handle)
            self._recorder.end(handle, roles, state, msg)

    def scheduler(self, scheduler: str) -> Scheduler:
        """This runner's client of ``scheduler`` (made on first use, closed with the runner),
        for a caller that needs more than the app-level calls (the Airflow trigger poller)."""
        return self._scheduler(scheduler)

    def _scheduler(self, scheduler: str) -> Scheduler:
        sched = self._scheduler_instances.get(scheduler)
        if sched is None:
            if scheduler not in self._scheduler_factories:
                raise UnknownSchedulerException(scheduler, sorted(self._scheduler_factories))
            sched = self._scheduler_factories[scheduler](self._name, **self._scheduler_params)
            self._scheduler_instances[scheduler] = sched
        return sched

    def _scheduler_app_id(self, app_handle: AppHandle) -> tuple[Scheduler, str]:
        scheduler, _, app_id = parse_app_handle(app_handle)
        return self._scheduler(scheduler), app_id

    def __repr__(self) -> str:
        return f"Runner(name={self._name!r}, schedulers={self.scheduler_backends()})"


def get_runner(
    name: Optional[str] = None,
    component_defaults: Optional[Dict[str, Dict[str, str]]] = None,
    trackers: Optional[Mapping[str, Optional[str]]] = None,
    **scheduler_params: Any,
) -> Runner:
    """A Runner over every registered scheduler; ``name`` is the session (default ``torchx``).

    ``trackers`` (``{name: config}``) overrides the configured trackers for jobs this
    runner submits; ``{}`` turns tracking off.
    """
    return Runner(
        name or DEFAULT_SESSION_NAME,
        get_scheduler_factories(),
        component_defaults,
        scheduler_params,
        trackers,
    )


def get_component(name: str) -> Any:
    """Upstream's ``torchx.runner.api.get_component``: the component's ``_Component``."""
    from torchx.specs.finder import get_component as find

    return find(name)


def materialize_appdef(*args: Any, **kwargs: Any) -> AppDef:
    """Upstream's ``torchx.runner.api.materialize_appdef`` (see ``torchx.specs.builders``)."""
    from torchx.specs.builders import materialize_appdef as materialize

    return materialize(*args, **kwargs)


def get_scheduler_factories(
    group: str = "torchx.schedulers", skip_defaults: bool = False
) -> Mapping[str, SchedulerFactory]:
    """Upstream's ``torchx.runner.api.get_scheduler_factories``, which ``get_runner`` calls
    (upstream's tests patch it here). Lazy: no entry-point scan until a plugin is needed."""
    if skip_defaults:
        from torchx.schedulers import get_scheduler_factories as eager

        return eager(group, skip_defaults)
    return SchedulerFactories(group)
