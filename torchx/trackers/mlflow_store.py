"""Where an MLflow run's rows go: one ``RunStore``, chosen by ``open_store`` from the tracking
URI (REST, sqlite rows, else MLflow's own client; docs/tracking.md)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

from torchx.trackers.api import Latest, MetricRow
from torchx.trackers.mlflow_rest import DeletedExperimentError, MlflowRest, quote
from torchx.trackers.mlflow_runs import TaggedRun, create_once, oldest_first
from torchx.trackers.mlflow_sqlite import SqliteStore, ensure_store, is_checked

logger = logging.getLogger(__name__)
SQLITE = "sqlite:///"


class RunStore(Protocol):
    """Experiments, runs, tags and metrics by MLflow id."""

    # found, or created (``artifact_location``: the parent of its artifacts)
    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str: ...
    # (run id, experiment id) of the oldest run whose ``tag`` is ``value``
    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]: ...
    # (experiment id, status, artifact URI); None: no such run
    def run_info(self, run_id: str) -> Optional[Tuple[str, str, str]]: ...
    # every active run (in an active experiment) whose ``tag`` is ``value``, oldest first by
    # (start time, run id), with its latest metrics: one paged search, never a read per run
    def search_tagged(self, tag: str, value: str) -> List[TaggedRun]: ...
    def create_run(
        self, exp_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, str], start: int
    ) -> str: ...
    # the one run whose tag ``key`` is ``tags[key]`` however many callers create it at once:
    # the oldest found, else created (atomically where the store can, else created, then
    # converged on the oldest, the caller's own loser deleted)
    def create_tagged_run(
        self,
        exp_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start: int,
        key: str,
    ) -> str: ...
    # MLflow's ``delete_run``: lifecycle stage ``deleted`` (``mlflow gc`` destroys it)
    def delete_run(self, run_id: str) -> None: ...
    def tag_run(self, run_id: str, key: str, value: str) -> None: ...
    # many steps at once, each ``(key, value, timestamp ms, step)``: as few requests as it can
    def log_metric_rows(self, run_id: str, rows: Sequence[MetricRow]) -> None: ...
    # ``{key: (value, timestamp ms)}``, each key's newest by time (see SqliteStore's)
    def latest_metrics(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest: ...
    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None: ...


def metric_rows(metrics: Mapping[str, float], ts: int, step: int) -> List[MetricRow]:
    """``log_metric_rows``' rows of one report: every metric at ``ts`` and ``step``."""
    return [(k, float(v), ts, step) for k, v in metrics.items()]


def sqlite_file(uri: str) -> Optional[str]:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    return uri[len(SQLITE) :].split("?", 1)[0] if uri.startswith(SQLITE) else None


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def open_store(uri: str, client: Callable[[], Any]) -> RunStore:
    """The store of ``uri``; ``client`` gives an ``MlflowClient`` for it (imported late)."""
    db = sqlite_file(uri)
    if is_http(uri):
        return MlflowRest(uri)
    if db is not None:
        ensure_store(db)  # a missing one is created whole (MLflow creates one without a lock)
        if is_checked(db):
            return SqliteStore(db, lambda: ClientStore(client))
        logger.debug("%s: a schema torchx has not checked; through MLflow's client", uri)
    return ClientStore(client)


def search_runs(client: Any, flt: str = "", limit: int = 1000) -> List[Any]:
    """Runs matching ``flt`` in any experiment, oldest first."""
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    order = ["attributes.start_time ASC"]
    return list(client.search_runs(exp_ids, flt, max_results=limit, order_by=order))


class ClientStore:
    """By MLflow's own ``MlflowClient`` (any store MLflow knows)."""

    def __init__(self, client: Callable[[], Any]) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        return self._client()

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                location = f"{artifact_location}/{name}" if artifact_location else None
                return str(self.client.create_experiment(name, artifact_location=location))
            except MlflowException:  # created concurrently by another process
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":  # MLflow refuses runs in it
            raise DeletedExperimentError(name, exp.experiment_id)
        return str(exp.experiment_id)

    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]:
        runs = self.search_tagged(tag, value)
        return (runs[0].run_id, runs[0].experiment_id) if runs else None

    def search_tagged(self, tag: str, value: str) -> List[TaggedRun]:
        client, out, token = self.client, [], None
        exp_ids = [e.experiment_id for e in client.search_experiments()]
        flt, order = f"tags.`{tag}` = '{quote(value)}'", ["attributes.start_time ASC"]
        while exp_ids:
            page = client.search_runs(
                exp_ids, flt, max_results=1000, order_by=order, page_token=token
            )
            for run in page:
                info = run.info
                out.append(
                    TaggedRun(
                        str(info.run_id), str(info.experiment_id), str(info.status),
                        int(info.start_time or 0), dict(run.data.metrics),
                    )
                )  # fmt: skip
            token = page.token
            if not token:
                break
        return oldest_first(out)

    def run_info(self, run_id: str) -> Optional[Tuple[str, str, str]]:
        from mlflow.exceptions import MlflowException

        try:
            info = self.client.get_run(run_id).info
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return str(info.experiment_id), str(info.status), str(info.artifact_uri)

    def create_run(
        self, exp_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, str], start: int
    ) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(exp_id, start_time=start, tags=dict(tags), run_name=name)
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run.info.run_id, params=items[i : i + 100])
        return str(run.info.run_id)

    def create_tagged_run(
        self,
        exp_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start: int,
        key: str,
    ) -> str:
        return create_once(self, exp_id, name, tags, params, start, key)

    def delete_run(self, run_id: str) -> None:
        self.client.delete_run(run_id)

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        self.client.set_terminated(run_id, status, end_time=end_ms)

    def log_metric_rows(self, run_id: str, rows: Sequence[MetricRow]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(k, float(v), ts, step) for k, v, ts, step in rows]
        self.client.log_batch(run_id, metrics=metrics)  # splits past the server's limits

    def latest_metrics(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest:
        """Every key's newest by time (its history is a database query)."""
        out = {}
        for key in self.client.get_run(run_id).data.metrics:
            history = self.client.get_metric_history(run_id, key)
            last = max(history, key=lambda m: (m.timestamp, m.step, m.value))
            out[key] = (float(last.value), int(last.timestamp))
        return out
