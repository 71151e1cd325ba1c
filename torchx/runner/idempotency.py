"""Keyed submissions (``Runner.run(..., idempotency_key=K)``): which app a key names, and
how racing submitters converge on one.

One rule for every caller in every process: the oldest live app of the key's token wins
(``find_by_idempotency_token`` gives every process the same order). A newer live app of the
token is a race's loser. Its submitter cancels it once it sees the winner; a later caller
that still finds it live (its submitter died between launch and convergence) cancels it
too. A loser that cannot be cancelled is a warning naming it, never the caller's failure:
the caller still gets the winner.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from torchx.specs.api import (
    AppHandle,
    AppState,
    CfgVal,
    UnknownAppException,
    is_terminal,
    make_app_handle,
    parse_app_handle,
)

if TYPE_CHECKING:
    from torchx.runner.api import Runner
    from torchx.runner.tracker_session import OpenedJobRun

logger = logging.getLogger(__name__)


def reusable_app(
    runner: Runner,
    scheduler: str,
    token: str,
    reattach_succeeded: bool,
    cfg: Optional[Mapping[str, CfgVal]] = None,
) -> Optional[AppHandle]:
    """The app with ``token`` (submitted with ``cfg``) to re-attach to: the oldest live
    one, which is the one convergence keeps (so a re-attached app is never cancelled as a
    race's loser), else with ``reattach_succeeded`` the newest SUCCEEDED one. Newer live
    ones are cancelled."""
    base = runner._scheduler(scheduler)
    base.run_opts().check_known(cfg or {}, scheduler)  # a typo never re-attaches either
    sched = base.scoped(cfg or {})
    apps = sched.find_by_idempotency_token(token)
    for app in (a for a in apps if is_terminal(a.state)):  # a run its waiter never ended
        try:  # is ended as status() would; never worth failing a re-attach or a submit
            runner.status(make_app_handle(scheduler, runner.name(), app.app_id))
        except Exception as e:
            logger.warning("could not end the tracker run of %s: %s", app.app_id, e)
    live = [a for a in apps if not is_terminal(a.state)]
    if live:
        sched.settle_idempotency_token(live)
        winner = make_app_handle(scheduler, runner.name(), live[0].app_id)
        for app in live[1:]:  # its submitter did not live to cancel it
            loser = make_app_handle(scheduler, runner.name(), app.app_id)
            cancel_loser(loser, winner, functools.partial(_cancel_if_known, runner, loser))
        return winner
    if reattach_succeeded:
        done = [a for a in apps if a.state == AppState.SUCCEEDED]
        if done:
            return make_app_handle(scheduler, runner.name(), done[-1].app_id)
    return None


def converge(
    runner: Runner,
    scheduler: str,
    token: str,
    handle: AppHandle,
    opened: Optional[OpenedJobRun],
    cfg: Optional[Mapping[str, CfgVal]] = None,
) -> AppHandle:
    """After a keyed submission (with ``cfg``): if the token's oldest live app is not
    ours, cancel ours (its run ends KILLED, naming the winner) and return the winner."""
    sched = runner._scheduler(scheduler).scoped(cfg or {})
    ours = parse_app_handle(handle).app_id
    listed = sched.find_by_idempotency_token(token)
    live = [a for a in listed if not is_terminal(a.state) or a.app_id == ours]
    if not live:  # ours is not listed yet and no other app is live
        return handle
    sched.settle_idempotency_token([a for a in live if not is_terminal(a.state)])
    if live[0].app_id == ours:
        return handle
    winner = make_app_handle(scheduler, runner.name(), live[0].app_id)
    cancelled = cancel_loser(handle, winner, lambda: sched.cancel(ours))
    runner._tracking.supersede(opened, winner, end=False)
    if cancelled:  # else its run ends when a later caller finds it and cancels it
        runner._end_job_run(handle, AppState.CANCELLED, [])
    return winner


def cancel_loser(loser: AppHandle, winner: AppHandle, cancel: Callable[[], None]) -> bool:
    """Cancel a race's loser; False (and a warning naming it) if that failed."""
    logger.info("%s lost a submission race to %s: cancelling it", loser, winner)
    try:
        cancel()
        return True
    except Exception as e:
        logger.warning(
            "could not cancel %s, a duplicate of %s (%s); cancel it with: torchx cancel %s",
            *(loser, winner, e, loser),
        )
        return False


def _cancel_if_known(runner: Runner, handle: AppHandle) -> None:
    try:
        runner.cancel(handle)  # ends its tracker run (KILLED) as a cancel does
    except UnknownAppException:  # gone meanwhile (cancelled by its own submitter)
        pass
