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
from typing import TYPE_CHECKING, Callable, Optional, Tuple

from torchx.specs.api import AppHandle, AppState, UnknownAppException, is_terminal

if TYPE_CHECKING:
    from torchx.schedulers.api import Scheduler

logger = logging.getLogger(__name__)

HandleOf = Callable[[str], AppHandle]  # an app id's handle under the runner's session


def reusable_app(
    sched: Scheduler,
    handle_of: HandleOf,
    token: str,
    reattach_succeeded: bool,
    status: Callable[[AppHandle], object],
    cancel: Callable[[AppHandle], None],
) -> Optional[AppHandle]:
    """The app with ``token`` on ``sched`` (scoped to the caller's cfg) to re-attach to:
    the oldest live one, which is the one convergence keeps (so a re-attached app is never
    cancelled as a race's loser), else with ``reattach_succeeded`` the newest SUCCEEDED
    one. Newer live ones are ``cancel``led; ended ones get a ``status`` call, which ends a
    tracker run its waiter never ended."""
    apps = sched.find_by_idempotency_token(token)
    for app in (a for a in apps if is_terminal(a.state)):
        try:
            status(handle_of(app.app_id))
        except Exception as e:  # a run left open is never worth failing a re-attach or submit
            logger.warning("could not end the tracker run of %s: %s", app.app_id, e)
    live = [a for a in apps if not is_terminal(a.state)]
    if live:
        sched.settle_idempotency_token(live)
        winner = handle_of(live[0].app_id)
        for app in live[1:]:  # its submitter did not live to cancel it
            loser = handle_of(app.app_id)
            cancel_loser(loser, winner, functools.partial(_cancel_if_known, cancel, loser))
        return winner
    if reattach_succeeded:
        done = [a for a in apps if a.state == AppState.SUCCEEDED]
        if done:
            return handle_of(done[-1].app_id)
    return None


def converge(
    sched: Scheduler, handle_of: HandleOf, token: str, ours: str
) -> Tuple[AppHandle, bool]:
    """After a keyed submission of app ``ours``: the token's oldest live app (the winner),
    and whether ours, if it lost, was cancelled (else a later caller that finds it live
    cancels it)."""
    listed = sched.find_by_idempotency_token(token)
    live = [a for a in listed if not is_terminal(a.state) or a.app_id == ours]
    if not live:  # ours is not listed yet and no other app is live
        return handle_of(ours), False
    sched.settle_idempotency_token([a for a in live if not is_terminal(a.state)])
    if live[0].app_id == ours:
        return handle_of(ours), False
    winner = handle_of(live[0].app_id)
    return winner, cancel_loser(handle_of(ours), winner, lambda: sched.cancel(ours))


def cancel_loser(loser: AppHandle, winner: AppHandle, cancel: Callable[[], None]) -> bool:
    """Cancel a race's loser; False (and a warning naming it) if that failed."""
    logger.info("%s lost a submission race to %s: cancelling it", loser, winner)
    try:
        cancel()
        return True
    except Exception as e:  # any scheduler's failure: the caller still gets the winner
        logger.warning(
            "could not cancel %s, a duplicate of %s (%s); cancel it with: torchx cancel %s",
            *(loser, winner, e, loser),
        )
        return False


def _cancel_if_known(cancel: Callable[[AppHandle], None], handle: AppHandle) -> None:
    try:
        cancel(handle)  # ends its tracker run (KILLED) as a cancel does
    except UnknownAppException:  # gone meanwhile (cancelled by its own submitter)
        pass
