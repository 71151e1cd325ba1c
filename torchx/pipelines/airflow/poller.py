"""The poller shared by the ``TorchXTrigger``s of one event loop (one Airflow triggerer).

A triggerer holds up to 1,000 triggers. One round per poll interval serves them all: one
``Scheduler.list()`` per scheduler and session (one ``squeue`` on Slurm), then the new log
lines (a log file that did not grow is not read) and progress reports, in a small fixed
pool of daemon threads (never on the loop; a stopping triggerer never waits for them).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, TypeVar

from torchx.pipelines import core
from torchx.pipelines.settings import home_param
from torchx.runner.api import DEFAULT_SESSION_NAME, Runner, get_runner
from torchx.runner.logs import LogCursor
from torchx.runtime.progress import Progress
from torchx.schedulers.api import Scheduler, Stream
from torchx.specs.api import (
    AppState,
    AppStatus,
    MalformedAppHandleException,
    is_terminal,
    parse_app_handle,
)
from torchx.specs.errors import backend_errors
from torchx.specs.secrets import env_secrets

T = TypeVar("T")

POOL_SIZE = 4
# triggers woken per step of the loop after a round (each logs what the round found and
# fires its event, which Airflow logs in its executor's threads); the pause between the
# batches lets that work drain before the next batch, so the loop never runs behind it
WAKE_BATCH = 50
WAKE_PAUSE = 0.01
_Future = concurrent.futures.Future[Any]
_Group = Tuple[str, str, Optional[str]]  # scheduler, session, torchx_home
# schedulers whose "combined" log is stdout then stderr, not one log in write order: each
# stream is followed on its own (a line counted in one must not shift the other)
STREAMS_APART = {"slurm": (Stream.STDOUT, Stream.STDERR)}


@dataclass(eq=False)
class Watch:
    """One trigger's app, as the poller sees it; the trigger reads it when ``changed``."""

    handle: str
    poll_interval: float
    get_logs: bool
    progress_interval: Optional[float]
    torchx_home: Optional[str] = None  # the operator's Connection's (None: the environment's)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lines: List[Tuple[str, str]] = field(default_factory=list)  # ("role/replica", line)
    progress: List[Progress] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    ended: bool = False  # then ``status`` (None: app not found) or ``error``
    status: Optional[AppStatus] = None
    error: Optional[BaseException] = None
    # the poller's, touched by one pool thread at a time (one round at a time)
    seen: bool = False
    cursors: List[LogCursor] = field(default_factory=list)
    follower: Optional[core.ProgressFollower] = None
    next_look: float = 0.0
    # the app's secret env values, from the first look: the trigger has Airflow mask them
    secrets: List[str] = field(default_factory=list)


@dataclass
class _Look:
    """What one round found for one watch (made in a pool thread, applied on the loop)."""

    lines: List[Tuple[str, str]] = field(default_factory=list)
    progress: Optional[Progress] = None
    warnings: List[str] = field(default_factory=list)
    ended: bool = False
    status: Optional[AppStatus] = None
    error: Optional[BaseException] = None


class TriggerPoller:
    """One per event loop (``of_running_loop``); triggers ``watch`` and ``unwatch``."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TriggerPoller] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:
        self._watches: Dict[Watch, None] = {}  # insertion-ordered set
        self._task: Optional[asyncio.Task[None]] = None
        self._wake = asyncio.Event()
        self._pool: Optional[_Pool] = None
        self._runners: Dict[Tuple[str, Optional[str]], Runner] = {}  # by (session, home)
        self.rounds = 0  # poll rounds so far (for benchmarks)
        # (start, seconds) of the recent rounds (for benchmarks)
        self.round_times: Deque[Tuple[float, float]] = collections.deque(maxlen=1000)

    @classmethod
    def of_running_loop(cls) -> TriggerPoller:
        loop = asyncio.get_running_loop()
        poller = cls._by_loop.get(loop)
        if poller is None:
            poller = cls._by_loop[loop] = cls()
        return poller

    def unseen(self) -> int:
        """How many watched apps have not had their first look yet (for benchmarks)."""
        return sum(1 for w in self._watches if not w.seen and not w.ended)

    def watch(self, watch: Watch) -> Watch:
        """Poll ``watch.handle`` from the next round on, until ``unwatch``."""
        self._watches[watch] = None
        if self._task is None or self._task.done():
            self._pool = _Pool(POOL_SIZE)
            # in a context of its own: the triggerer routes a log by the trigger's context
            loop = asyncio.get_running_loop()
            self._task = contextvars.Context().run(loop.create_task, self._run())
        return watch

    def unwatch(self, watch: Watch) -> None:
        self._watches.pop(watch, None)
        if not self._watches:
            self._wake.set()  # the poller ends now rather than after its interval

    async def _run(self) -> None:
        try:
            while self._watches:
                started = time.monotonic()
                await self._round()
                self.round_times.append((started, time.monotonic() - started))
                if not self._watches:
                    break
                tick = min(w.poll_interval for w in self._watches)
                self._wake.clear()
                delay = max(0.0, started + tick - time.monotonic())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
        finally:  # no await from the last check of ``_watches`` on: a new watch restarts it
            self._close()

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        for runner in self._runners.values():
            runner.close()  # and its scheduler clients
        self._runners.clear()

    async def _round(self) -> None:
        self.rounds += 1
        groups: Dict[_Group, List[Watch]] = {}
        for watch in list(self._watches):
            try:
                scheduler, session, _ = parse_app_handle(watch.handle)
            except MalformedAppHandleException as e:
                self._apply(watch, _Look(error=e))  # fails its own trigger only
                continue
            group = (scheduler, session or DEFAULT_SESSION_NAME, watch.torchx_home)
            groups.setdefault(group, []).append(watch)
        await asyncio.gather(*(self._poll(key, watches) for key, watches in groups.items()))

    async def _poll(self, key: _Group, watches: List[Watch]) -> None:
        try:
            await self._poll_group(key, watches)
        except Exception as e:  # the scheduler cannot answer, or its round breaks: its own
            # triggers fail rather than wait for ever (their apps run on, for the retry)
            for watch in watches:
                if not watch.ended:
                    self._apply(watch, _Look(error=e))

    async def _poll_group(self, key: _Group, watches: List[Watch]) -> None:
        """One scheduler's round: its list, then each due app's own calls in the pool."""
        pool = self._pool
        assert pool is not None
        runner = self._runner(key[1], key[2])
        sched = runner.scheduler(key[0])
        # every app's state, by app id, in one scheduler call
        states = await pool.run(lambda: {app.app_id: app.state for app in sched.list()})
        now = time.monotonic()
        due: List[Tuple[Watch, Optional[AppState]]] = []
        for watch in watches:
            state = states.get(parse_app_handle(watch.handle).app_id)
            ending = state is None or is_terminal(state)
            if not watch.ended and (ending or now >= watch.next_look):
                watch.next_look = now + watch.poll_interval
                due.append((watch, state))

        def look_all(chunk: List[Tuple[Watch, Optional[AppState]]]) -> List[_Look]:
            return [_look(runner, sched, watch, state) for watch, state in chunk]

        chunks = [due[i::POOL_SIZE] for i in range(min(POOL_SIZE, len(due)))]
        found = await asyncio.gather(
            *(pool.run(functools.partial(look_all, chunk)) for chunk in chunks)
        )
        woken = 0
        for chunk, looks in zip(chunks, found, strict=True):
            for (watch, _), look in zip(chunk, looks, strict=True):
                woken += self._apply(watch, look)
                if woken == WAKE_BATCH:
                    woken = 0
                    await asyncio.sleep(WAKE_PAUSE)

    def _apply(self, watch: Watch, look: _Look) -> bool:
        """Hand ``look`` to the watch's trigger; whether that wakes it."""
        watch.lines.extend(look.lines)
        watch.warnings.extend(look.warnings)
        if look.progress is not None:
            watch.progress.append(look.progress)
        if look.error is not None or look.ended:
            watch.ended, watch.status, watch.error = True, look.status, look.error
        if look.lines or look.warnings or look.progress is not None or watch.ended:
            watch.changed.set()
            return True
        return False

    def _runner(self, session: str, torchx_home: Optional[str]) -> Runner:
        key = (session, torchx_home)
        if key not in self._runners:
            self._runners[key] = get_runner(session, **home_param(torchx_home))
        return self._runners[key]


def _look(runner: Runner, sched: Scheduler, watch: Watch, listed: Optional[AppState]) -> _Look:
    """One app's part of a round (in a pool thread): its description the first time, its
    status where the list does not tell all, its new log lines and its progress report."""
    look = _Look()
    try:
        if not watch.seen and not _first_look(runner, sched, watch):
            look.ended = True  # not found
            return look
        status: Optional[AppStatus] = None
        # a listed SUCCEEDED or CANCELLED is all the event needs; a failure needs its reason
        final_word = listed in (AppState.SUCCEEDED, AppState.CANCELLED)
        if listed is None or (is_terminal(listed) and not final_word):
            status = runner.status(watch.handle)  # ends the job's tracker run if it ended
            if status is None:
                look.ended = True  # not found
                return look
        elif is_terminal(listed):
            status = AppStatus(state=listed)
        ended = status is not None and status.is_terminal()
        look.lines = _new_lines(sched, watch, look.warnings, final=ended)
        if watch.follower is not None:  # read when its interval passed, or the app ended
            look.progress = watch.follower.poll(force=ended)
        if ended:
            look.ended, look.status = True, status
    except backend_errors() as e:  # handed to the trigger, which fails (its app runs on)
        look.error = e
    return look


def _first_look(runner: Runner, sched: Scheduler, watch: Watch) -> bool:
    """Read what the app needs polled for (roles, its log files), in one
    scheduler call; False if the scheduler does not know it."""
    app_id = parse_app_handle(watch.handle).app_id
    desc = sched.describe(app_id)
    if desc is None:
        return False
    if watch.progress_interval is not None:
        # the follower returns the report; the trigger logs it, on the loop
        watch.follower = core.ProgressFollower(
            runner, watch.handle, lambda _: None, watch.progress_interval
        )
    if watch.get_logs:
        watch.secrets = [secret for role in desc.roles for secret in env_secrets(role.env)]
        streams = STREAMS_APART.get(sched.backend, (Stream.COMBINED,))
        watch.cursors = [
            LogCursor(
                role.name,
                k,
                stream,
                path=_log_file(sched.backend, desc.ui_url, app_id, role.name, k, stream),
            )
            for role in desc.roles
            for k in range(role.num_replicas)
            for stream in streams
        ]
    watch.seen = True
    return True


def _log_file(
    backend: str, ui_url: Optional[str], app_id: str, role: str, k: int, stream: Stream
) -> Optional[str]:
    """The replica's log file where its scheduler keeps one here (``ui_url`` ``file://``):
    a stat tells whether it grew, so a quiet log is not read. None: read it each round."""
    if not ui_url or not ui_url.startswith("file://"):
        return None
    root = ui_url[len("file://") :]
    if backend == "local_cwd":  # {log_dir}/{role}/{replica}/{stream}.log
        return os.path.join(root, role, str(k), f"{stream.value}.log")
    if backend == "slurm":  # {job_dir}/slurm-{job}-{role}-{replica}.{out,err}
        ext = "err" if stream == Stream.STDERR else "out"
        return os.path.join(root, f"slurm-{app_id}-{role}-{k}.{ext}")
    return None


def _new_lines(
    sched: Scheduler, watch: Watch, warnings: List[str], final: bool
) -> List[Tuple[str, str]]:
    app_id = parse_app_handle(watch.handle).app_id
    lines: List[Tuple[str, str]] = []
    for cursor in watch.cursors:
        if not final and not cursor.grew():
            continue
        key = f"{cursor.role}/{cursor.replica}"
        try:
            log = sched.log_iter(app_id, cursor.role, cursor.replica, streams=cursor.stream)
            lines += [(key, line) for line in cursor.read_new(log, final)]
        except backend_errors() as e:  # a log that cannot be read is reported, never fatal
            warnings.append(f"could not read logs of {watch.handle} ({key}): {e}")
    return lines


class _Pool:
    """``size`` daemon threads running calls for the loop: unlike ``ThreadPoolExecutor``'s,
    a triggerer that stops (its loop closes, its process exits) never waits for them."""

    def __init__(self, size: int) -> None:
        self._jobs: queue.SimpleQueue[Optional[Tuple[Callable[[], Any], _Future]]] = (
            queue.SimpleQueue()
        )
        self._size = size
        for i in range(size):
            name = f"torchx-trigger-poll-{i}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    async def run(self, fn: Callable[[], T]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return await asyncio.wrap_future(future)

    def stop(self) -> None:
        """Each thread ends after its current call."""
        for _ in range(self._size):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():  # its awaiter was cancelled
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: B036 - handed to the awaiting coroutine
                future.set_exception(e)
