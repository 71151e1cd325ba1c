"""MLflow tracker (registered as ``mlflow``): one MLflow run per torchx job, with lineage.

Config (``[tracker:mlflow] config=`` or ``TORCHX_TRACKER_MLFLOW_CONFIG``): a tracking
URI (``sqlite:///...``, ``http://host:5000``), or a file of ``key=value`` lines
(``tracking_uri``, ``experiment_name``, ``artifact_location``, ``ui_url``); unset means
``$MLFLOW_TRACKING_URI``, else an embedded sqlite store under ``$TORCHX_HOME/mlflow``
(MLflow >= 3.13 refuses plain ``file:`` stores).

- a job submitted through the Runner gets its run from the launcher (named after the
  stage, with params, nested, ended with the app: see ``mlflow_launch``); its ranks only
  attach to it by the ``torchx.job_id`` tag. Without a launcher-opened run, rank 0
  creates one named by the job id and the other ranks attach (never a duplicate);
- a pipeline run nests its stage runs (``mlflow.parentRunId``);
- ``add_source`` records the producing run in tags and as an MLflow dataset input whose
  source points at the producer (``runs:/<id>/<artifact>``), so the UI shows which
  dataset or model each run consumed;
- a run rank 0 created ends FINISHED when its process exits normally and FAILED on an
  uncaught exception; a launcher-opened run ends with the app instead.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from torchx.trackers import mlflow_launch
from torchx.trackers.api import (
    ENV_TORCHX_RUN_OWNER,
    LAUNCHER,
    TrackerArtifact,
    TrackerBase,
    TrackerConfigError,
    TrackerSource,
)
from torchx.trackers.mlflow_launch import DEFAULT_EXPERIMENT, TAG_JOB_ID, TAG_KIND, TAG_PARENT
from torchx.util.modules import import_optional
from torchx.util.paths import torchx_home

logger = logging.getLogger(__name__)

TAG_SOURCES = "torchx.sources"
ARTIFACT_PREFIX = "torchx.artifact."
ATTACH_TIMEOUT = 120.0


def default_tracking_uri() -> str:
    d = torchx_home() / "mlflow"
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


def _bound_http_retries() -> None:
    # MLflow's client retries a dead server for minutes by default: fail within seconds.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def _sqlite_file(uri: str) -> Optional[str]:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return uri[len("sqlite:///") :].split("?", 1)[0]


@contextlib.contextmanager
def _schema_lock(uri: str) -> Iterator[None]:
    """One process at a time opens a sqlite store: MLflow creates or migrates its schema
    on open without a lock, and processes that race on a new store can leave it unusable
    (``table _alembic_tmp_latest_metrics already exists``)."""
    path = _sqlite_file(uri)
    if path is None:
        yield
        return
    try:
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:  # a read-only place: nobody can create the schema there either
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def parse_config(config: Optional[str]) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {
        "tracking_uri": None,
        "experiment_name": None,
        "artifact_location": None,
        "ui_url": None,
    }
    if config and os.path.isfile(config):
        with open(config) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    if k.strip() not in out:
                        raise TrackerConfigError(
                            f"mlflow tracker config {config}: unknown key {k.strip()!r};"
                            f" use {', '.join(out)}"
                        )
                    out[k.strip()] = v.strip()
    elif config:
        out["tracking_uri"] = config
    out["tracking_uri"] = (
        out["tracking_uri"] or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    )
    db = _sqlite_file(str(out["tracking_uri"]))
    if out["artifact_location"] is None and db is not None:
        out["artifact_location"] = os.path.join(os.path.dirname(os.path.abspath(db)), "artifacts")
    return out


def ui_url_for(tracking_uri: str, ui_url: Optional[str] = None) -> Optional[str]:
    """The MLflow UI base: ``ui_url`` (or ``$TORCHX_MLFLOW_UI_URL``), else the tracking URI
    when it is an http(s) server; None for a store without a UI (a link would be fake)."""
    base = ui_url or os.environ.get("TORCHX_MLFLOW_UI_URL")
    if not base and str(tracking_uri).startswith(("http://", "https://")):
        base = str(tracking_uri)
    return base.rstrip("/") if base else None


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _creates_runs() -> bool:
    """Whether this process may create its job's run: not when the launcher owns it (then
    every rank attaches), else rank 0 only."""
    return _is_rank0() and os.environ.get(ENV_TORCHX_RUN_OWNER) != LAUNCHER


class MLflowTracker(TrackerBase):
    def __init__(
        self,
        experiment_name: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        artifact_location: Optional[str] = None,
        ui_url: Optional[str] = None,
    ) -> None:
        import_optional("mlflow", "mlflow")
        _bound_http_retries()
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri or default_tracking_uri()
        with _schema_lock(self.tracking_uri):
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_name = experiment_name
        self.artifact_location = artifact_location
        self.ui_url = ui_url_for(self.tracking_uri, ui_url)
        self._runs: Dict[str, str] = {}  # torchx job id -> mlflow run id
        self._lock = threading.Lock()
        self._owned: List[str] = []
        self._failed = False

    # -------------------------------------------------------------- run lookup

    def _experiment_id(self, name: Optional[str] = None) -> str:
        name = name or self.experiment_name or DEFAULT_EXPERIMENT
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            location = f"{self.artifact_location}/{name}" if self.artifact_location else None
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another process
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _find(self, job_id: str) -> Optional[str]:
        if job_id in self._runs:
            return self._runs[job_id]
        exp_ids = [e.experiment_id for e in self.client.search_experiments()]
        if not exp_ids:
            return None
        found = self.client.search_runs(
            exp_ids, filter_string=f"tags.`{TAG_JOB_ID}` = '{_q(job_id)}'", max_results=2
        )
        if not found:
            return None
        oldest = min(found, key=lambda r: r.info.start_time)
        self._runs[job_id] = oldest.info.run_id
        return self._runs[job_id]

    def _run(self, job_id: str, create: bool = True) -> Optional[str]:
        """The MLflow run of ``job_id``: rank 0 creates it; other ranks wait for it to appear."""
        with self._lock:
            rid = self._find(job_id)
            if rid is not None or not create:
                return rid
            if not _creates_runs():
                deadline = time.monotonic() + ATTACH_TIMEOUT
                while rid is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    rid = self._find(job_id)
                if rid is None:
                    raise RuntimeError(
                        f"rank {os.environ.get('RANK', '0')}: no MLflow run of {job_id}"
                        f" appeared within {ATTACH_TIMEOUT:.0f} s (its launcher or rank 0"
                        " opens it)"
                    )
                return rid
            run = self.client.create_run(
                self._experiment_id(), tags={TAG_JOB_ID: job_id}, run_name=job_id
            )
            rid = run.info.run_id
            self._runs[job_id] = rid
            if os.environ.get("TORCHX_JOB_ID") == job_id:
                self._own(rid)
            return rid

    def _ensure(self, job_id: str) -> str:
        rid = self._run(job_id)
        assert rid is not None  # _run(create=True) either returns a run or raises
        return rid

    def _own(self, mlflow_run_id: str) -> None:
        """This process is the job: end its run when the process ends (FAILED on an exception)."""
        if not self._owned:
            atexit.register(self._finish_owned)
            previous = sys.excepthook

            def hook(*exc: Any) -> None:
                self._failed = True
                previous(*exc)

            sys.excepthook = hook
        self._owned.append(mlflow_run_id)

    def _finish_owned(self) -> None:
        for rid in self._owned:
            try:
                self.client.set_terminated(rid, "FAILED" if self._failed else "FINISHED")
            except Exception as e:  # never break interpreter exit
                logger.warning("could not end MLflow run %s: %s", rid, e)

    # -------------------------------------------------------------- TrackerBase

    def mlflow_run_id(self, job_id: str) -> Optional[str]:
        return self._run(job_id, create=False)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        rid = self._ensure(run_id)
        for k, v in kwargs.items():
            self.client.set_tag(rid, k if k != "kind" else TAG_KIND, str(v))

    def metadata(self, run_id: str) -> Mapping[str, object]:
        rid = self._run(run_id, create=False)
        if rid is None:
            return {}
        tags = self.client.get_run(rid).data.tags
        out: Dict[str, object] = {
            k: v for k, v in tags.items() if not k.startswith(("mlflow.", ARTIFACT_PREFIX))
        }
        out.pop(TAG_SOURCES, None)
        if TAG_KIND in out:
            out["kind"] = out.pop(TAG_KIND)
        return out

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        rid = self._ensure(run_id)
        meta = {"path": path, **{k: v for k, v in (metadata or {}).items()}}
        for k, v in meta.items():
            self.client.set_tag(rid, f"{ARTIFACT_PREFIX}{name}.{k}", str(v))
        local = path[len("file://") :] if path.startswith("file://") else path
        if "://" not in local and os.path.exists(local):
            if os.path.isdir(local):
                self.client.log_artifacts(rid, local, artifact_path=name)
            else:
                self.client.log_artifact(rid, local, artifact_path=name)
        if (metadata or {}).get("type") == "dataset":
            self._log_dataset(rid, name, path, meta, context="output")

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        rid = self._run(run_id, create=False)
        if rid is None:
            return {}
        grouped: Dict[str, Dict[str, object]] = {}
        for key, value in self.client.get_run(rid).data.tags.items():
            if key.startswith(ARTIFACT_PREFIX):
                name, _, field = key[len(ARTIFACT_PREFIX) :].rpartition(".")
                grouped.setdefault(name, {})[field] = value
        return {
            name: TrackerArtifact(name, str(fields.pop("path", "")), fields)
            for name, fields in grouped.items()
        }

    def _log_dataset(
        self, rid: str, name: str, source: str, meta: Mapping[str, object], context: str
    ) -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag

        digest = str(meta.get("digest") or hashlib.sha256(source.encode()).hexdigest())[:36]
        dataset = Dataset(
            name=name, digest=digest, source_type="torchx", source=json.dumps({"uri": source})
        )
        self.client.log_inputs(
            rid, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
        )

    def add_source(self, run_id: str, source_id: str, artifact_name: Optional[str] = None) -> None:
        rid = self._ensure(run_id)
        tags = self.client.get_run(rid).data.tags
        sources = json.loads(tags.get(TAG_SOURCES, "[]"))
        entry = {"run": source_id, "artifact": artifact_name}
        if entry not in sources:
            sources.append(entry)
            self.client.set_tag(rid, TAG_SOURCES, json.dumps(sources))
        producer = self._run(source_id, create=False)
        meta = self.artifacts(source_id).get(artifact_name or "") if producer else None
        where = f"runs:/{producer}/{artifact_name or ''}" if producer else source_id
        self.client.set_tag(rid, f"torchx.source.{artifact_name or 'run'}", where)
        metadata: Dict[str, object] = dict(meta.metadata or {}) if meta else {}
        self._log_dataset(rid, artifact_name or "run", where, metadata, context="input")

    def sources(self, run_id: str, artifact_name: Optional[str] = None) -> Iterable[TrackerSource]:
        rid = self._run(run_id, create=False)
        if rid is None:
            return []
        sources = json.loads(self.client.get_run(rid).data.tags.get(TAG_SOURCES, "[]"))
        return [
            TrackerSource(s["run"], s["artifact"])
            for s in sources
            if artifact_name is None or s["artifact"] == artifact_name
        ]

    def descendants(self, run_id: str) -> Iterable[TrackerSource]:
        exp_ids = [e.experiment_id for e in self.client.search_experiments()]
        if not exp_ids:
            return []
        runs = self.client.search_runs(
            exp_ids, filter_string=f"tags.`{TAG_SOURCES}` LIKE '%\"{_q(run_id)}\"%'"
        )
        out = []
        for run in runs:
            for s in json.loads(run.data.tags.get(TAG_SOURCES, "[]")):
                if s["run"] == run_id:
                    out.append(TrackerSource(run.data.tags[TAG_JOB_ID], s["artifact"]))
        return out

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        rid = self._ensure(run_id)
        now = int(time.time() * 1000)
        for k, v in metrics.items():
            self.client.log_metric(rid, k, float(v), timestamp=now, step=step or 0)

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        parent = self._run(parent_run_id, create=False)
        if parent is not None and self._find(run_id) is None and _creates_runs():
            # create the child in the parent's experiment, nested under it
            exp_id = self.client.get_run(parent).info.experiment_id
            with self._lock:
                run = self.client.create_run(
                    exp_id,
                    tags={
                        TAG_JOB_ID: run_id,
                        TAG_PARENT: parent_run_id,
                        "mlflow.parentRunId": parent,
                    },
                    run_name=run_id,
                )
                self._runs[run_id] = run.info.run_id
                if os.environ.get("TORCHX_JOB_ID") == run_id:
                    self._own(run.info.run_id)
            return
        rid = self._ensure(run_id)
        self.client.set_tag(rid, TAG_PARENT, parent_run_id)
        if parent is not None:
            self.client.set_tag(rid, "mlflow.parentRunId", parent)

    def end_run(self, run_id: str, status: str) -> None:
        rid = self._run(run_id, create=False)
        if rid is not None:
            self.client.set_terminated(rid, status)

    def open_job_run(
        self,
        job_id: str,
        name: str,
        params: Mapping[str, str],
        parent_run_id: Optional[str] = None,
        experiment_name: Optional[str] = None,
        start_ms: Optional[int] = None,
    ) -> None:
        with self._lock:
            self._runs[job_id] = mlflow_launch.open_job_run(
                mlflow_launch.ClientStore(self),
                job_id,
                name,
                params,
                parent_run_id,
                experiment_name,
                start_ms,
                configured_experiment=self.experiment_name,
            )

    def close_job_run(
        self, job_id: str, status: str, end_ms: Optional[int] = None, wait: bool = False
    ) -> None:
        mlflow_launch.close_job_run(mlflow_launch.ClientStore(self), job_id, status, end_ms, wait)

    def resolve_run_id(self, run_id: str) -> str:
        """Accepts an MLflow run id too (32 hex digits): returns its torchx job id."""
        import re

        if re.fullmatch(r"[0-9a-f]{32}", run_id) and self._find(run_id) is None:
            try:
                tags = self.client.get_run(run_id).data.tags
            except Exception:
                return run_id
            return str(tags.get(TAG_JOB_ID, run_id))
        return run_id

    def run_url(self, run_id: str) -> Optional[str]:
        """``<ui>/#/experiments/<exp>/runs/<run>`` in the run's own experiment; None without
        a UI (an embedded sqlite store has none unless ``ui_url`` is configured)."""
        if not self.ui_url:
            return None
        rid = self._run(run_id, create=False)
        if rid is None:
            return None
        exp = self.client.get_run(rid).info.experiment_id
        return f"{self.ui_url}/#/experiments/{exp}/runs/{rid}"

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        exp_ids = [e.experiment_id for e in self.client.search_experiments()]
        if not exp_ids:
            return []
        parent = kwargs.get("parent_run_id")
        flt = f"tags.`{TAG_PARENT}` = '{_q(parent)}'" if parent else ""
        runs = self.client.search_runs(
            exp_ids, filter_string=flt, order_by=["attributes.start_time ASC"]
        )
        return [r.data.tags[TAG_JOB_ID] for r in runs if TAG_JOB_ID in r.data.tags]


def _q(value: str) -> str:
    return value.replace("'", "\\'")


def create(config: Optional[str] = None) -> MLflowTracker:
    cfg = parse_config(config)
    experiment = cfg["experiment_name"] or os.environ.get("TORCHX_TRACKING_EXPERIMENT_NAME")
    if experiment == "default-experiment":  # dist.ddp's placeholder: keep pipeline stages together
        experiment = None
    return MLflowTracker(experiment, cfg["tracking_uri"], cfg["artifact_location"], cfg["ui_url"])


def _validate(config: Optional[str]) -> None:
    """Submit-time check, without importing mlflow (seconds per import): the package is
    installed and the store is reachable or creatable."""
    import importlib.util

    from torchx.util.modules import MissingExtraError

    if importlib.util.find_spec("mlflow") is None:
        raise MissingExtraError("mlflow", "mlflow")
    cfg = parse_config(config)
    uri = str(cfg["tracking_uri"])
    db = _sqlite_file(uri)
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).read()
        except (urllib.error.URLError, OSError) as e:
            raise TrackerConfigError(
                f"MLflow tracking server {uri} is unreachable ({getattr(e, 'reason', e)});"
                " start it or fix the tracker config"
            ) from None
    elif db is not None:
        parent = os.path.dirname(os.path.abspath(db))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise TrackerConfigError(
                f"MLflow sqlite store {uri}: directory {parent} does not exist or is not writable"
            )
    elif uri.startswith("file:"):
        raise TrackerConfigError(
            f"MLflow >= 3 refuses file stores ({uri}); use sqlite:///path/mlflow.db"
        )


_launcher_agent: Optional[Any] = None
_opened: Dict[Any, str] = {}  # (REST base, job id) -> run id of runs this process opened


def _agent() -> Any:
    """This process's detached tracker agent (one for all the jobs it launches)."""
    global _launcher_agent
    if _launcher_agent is None:
        from torchx.trackers.agent import Agent

        _launcher_agent = Agent(detach=True)
    return _launcher_agent


def _rest(config: Optional[str]) -> Optional[Any]:
    """A REST client when the tracking URI is an http(s) server (else None)."""
    cfg = parse_config(config)
    uri = str(cfg["tracking_uri"])
    if not uri.startswith(("http://", "https://")):
        return None
    from torchx.trackers.mlflow_rest import MlflowRest

    return MlflowRest(uri)


def _open_job_run(config: Optional[str], **job: Any) -> None:
    """Launcher: open the job's run without importing mlflow (REST, or the agent)."""
    rest = _rest(config)
    if rest is None:
        _agent().call("mlflow", config, "open_job_run", **job)
        return
    if job.get("params", {}).get("scheduler") == "local_cwd":
        from torchx.trackers import agent_host

        # the job's ranks run on this machine: they will find a warm agent
        agent_host.ensure_host(["mlflow"])
    cfg = parse_config(config)
    experiment = cfg["experiment_name"] or os.environ.get("TORCHX_TRACKING_EXPERIMENT_NAME")
    run_id = mlflow_launch.open_job_run(
        rest, **job, configured_experiment=experiment, find_existing=False
    )
    _opened[(rest.base, job["job_id"])] = run_id


def _close_job_run(
    config: Optional[str], job_id: str, status: str, end_ms: Optional[int], wait: bool
) -> None:
    rest = _rest(config)
    if rest is None:
        kwargs = {"job_id": job_id, "status": status, "end_ms": end_ms, "wait": wait}
        _agent().call("mlflow", config, "close_job_run", **kwargs)
        return
    run_id = _opened.pop((rest.base, job_id), None)
    if run_id is not None:  # opened by this process and not ended since: one request
        rest.end_run(run_id, status, end_ms)
        return
    mlflow_launch.close_job_run(rest, job_id, status, end_ms, wait)


create.validate = _validate  # type: ignore[attr-defined]
create.open_job_run = _open_job_run  # type: ignore[attr-defined]
create.close_job_run = _close_job_run  # type: ignore[attr-defined]
