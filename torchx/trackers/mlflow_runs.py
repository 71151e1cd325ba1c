"""One MLflow run per tag value (a pipeline run's ``torchx.job_id``) on stores without a
unique constraint on tags: create, then converge on the oldest (docs/tracking.md)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, NamedTuple

if TYPE_CHECKING:  # the store module calls these: no import cycle at run time
    from torchx.trackers.mlflow_store import RunStore

logger = logging.getLogger(__name__)


class TaggedRun(NamedTuple):
    """An active run a ``RunStore.search_tagged`` found, with its latest metrics (MLflow's
    row per key: the highest step's)."""

    run_id: str
    experiment_id: str
    status: str
    start_time: int
    metrics: Dict[str, float]


def oldest_first(runs: Iterable[TaggedRun]) -> List[TaggedRun]:
    """By (start time, run id): the order every process agrees on (the first one wins)."""
    return sorted(runs, key=lambda r: (r.start_time, r.run_id))


def create_once(
    store: RunStore,
    exp_id: str,
    name: str,
    tags: Mapping[str, str],
    params: Mapping[str, str],
    start: int,
    key: str,
) -> str:
    """The run whose tag ``key`` is ``tags[key]``: the oldest existing one, else one created
    here; when callers created several at once, all return the oldest and each deletes
    the one it created if it lost (a RunStore's ``create_tagged_run`` without a lock)."""
    found = store.search_tagged(key, tags[key])
    if found:
        return str(found[0].run_id)
    mine = store.create_run(exp_id, name, tags, params, max(start, int(time.time() * 1000)))
    return converge(store, key, tags[key], mine)


def converge(store: RunStore, key: str, value: str, mine: str) -> str:
    """The oldest active run tagged ``key=value`` (``mine``, the run this caller just
    created, included); ``mine`` is ended and deleted if it is not that one."""
    runs = store.search_tagged(key, value)
    winner = str(runs[0].run_id) if runs else mine
    if winner != mine:
        logger.info("%s=%s: run %s was created at once with %s; keeping %s", key, value, mine,
                    winner, winner)  # fmt: skip
        retire(store, mine)
    return winner


def retire(store: RunStore, run_id: str, status: str = "KILLED") -> None:
    """End a duplicate run, then delete it (MLflow's lifecycle stage ``deleted``); a store
    that refuses the delete leaves it ended, never RUNNING."""
    from torchx.specs.errors import backend_errors

    try:
        store.terminate(run_id, status)
        store.delete_run(run_id)
    except backend_errors() as e:
        logger.warning("could not retire the duplicate run %s: %s", run_id, e)
