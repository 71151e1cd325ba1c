"""MLflow tracker (``mlflow``): one MLflow run per torchx job, with lineage (docs/tracking.md).

Config: a tracking URI or a file of ``key=value`` lines (``tracking_uri``, ``experiment_name``,
``artifact_location``, ``ui_url``). ``MlflowBackend`` (the Runner's) opens and ends a job's
run; ``MLflowTracker`` (ranks, pipelines, ``torchx tracker``) records into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from torchx.specs.secrets import mask_urls
from torchx.trackers.api import (
    AmbiguousRunError,
    JobRun,
    Latest,
    Lineage,
    OpenedRun,
    StepMetrics,
    TrackerArtifact,
    TrackerBase,
    TrackerConfigError,
    TrackerSource,
    read_config_file,
    tracker_config_env_var_name,
)
from torchx.trackers.mlflow_http import client_env, redact
from torchx.trackers.mlflow_rest import MlflowRest, quote
from torchx.trackers.mlflow_sqlite import SqliteStore, now_ms
from torchx.trackers.mlflow_store import (
    SQLITE,
    RunStore,
    is_http,
    metric_rows,
    open_store,
    search_runs,
    sqlite_file,
)
from torchx.util.modules import MissingExtraError, import_optional
from torchx.util.paths import torchx_home

logger = logging.getLogger(__name__)
TAG_JOB_ID = "torchx.job_id"
TAG_PARENT = "torchx.parent_run_id"
TAG_KIND = "torchx.kind"
TAG_SOURCES = "torchx.sources"
TAG_NESTED = "mlflow.parentRunId"
ARTIFACT_PREFIX = "torchx.artifact."
DEFAULT_EXPERIMENT = "torchx"
ENV_RUN_ID = "MLFLOW_RUN_ID"
ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT_ID = "MLFLOW_EXPERIMENT_ID"
_MLFLOW_ID = re.compile(r"[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-f]{1,32}")
PREFIX_LIMIT = 50  # runs read per prefix search: enough to name the candidates


@dataclass
class _Reads:
    """What one command read (``MLflowTracker.batched_reads``): tags by torchx job id, the
    runs consuming a job, a pipeline's stages, and the experiments searched."""

    exp_ids: Optional[List[str]] = None
    tags: Dict[str, Mapping[str, str]] = field(default_factory=dict)  # {} : no such run
    consumers: Dict[str, List[Mapping[str, str]]] = field(default_factory=dict)
    children: Dict[str, List[str]] = field(default_factory=dict)


def default_tracking_uri() -> str:
    d = torchx_home() / "mlflow"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


def parse_config(config: Optional[str]) -> Dict[str, Optional[str]]:
    keys = ("tracking_uri", "experiment_name", "artifact_location", "ui_url")
    out: Dict[str, Optional[str]] = dict.fromkeys(keys)
    if config and os.path.isfile(config):
        out.update(read_config_file(config, keys))
    elif config:
        out["tracking_uri"] = config
    uri = out["tracking_uri"] or os.environ.get(ENV_TRACKING_URI) or default_tracking_uri()
    db = sqlite_file(uri)
    if db is not None:  # made absolute: a job and whoever ends its run name the same file
        uri, db = SQLITE + os.path.abspath(db) + uri[len(SQLITE + db) :], os.path.abspath(db)
        out["artifact_location"] = out["artifact_location"] or f"{os.path.dirname(db)}/artifacts"
    out["tracking_uri"] = uri
    experiment = os.environ.get("TORCHX_TRACKING_EXPERIMENT_NAME")
    if out["experiment_name"] is None and experiment != "default-experiment":  # dist.ddp's
        out["experiment_name"] = experiment  # placeholder is not an experiment
    return out


class MLflowTracker(TrackerBase):
    """Records and reads runs: runs, tags and metrics by ``store``; the rest with
    ``MlflowClient``, imported at its first use (seconds of CPU)."""

    keeps_metrics = True

    def __init__(
        self,
        experiment_name: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        artifact_location: Optional[str] = None,
        ui_url: Optional[str] = None,
    ) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self._client: Any = None
        self._store: Optional[RunStore] = None
        self.experiment_name, self.artifact_location = experiment_name, artifact_location
        # the UI: configured, else an http store's own (a store without one gets no links)
        ui_url = ui_url or os.environ.get("TORCHX_MLFLOW_UI_URL")
        ui_url = ui_url or (redact(self.tracking_uri) if is_http(self.tracking_uri) else None)
        self.ui_url = ui_url.rstrip("/") if ui_url else None
        self._runs: Dict[str, str] = {}  # torchx job id -> mlflow run id
        self._lock = threading.RLock()
        self._reads: Optional[_Reads] = None  # inside ``batched_reads``
        job_id, run_id = os.environ.get("TORCHX_JOB_ID"), os.environ.get(ENV_RUN_ID)
        if job_id and run_id and os.environ.get(ENV_TRACKING_URI) == self.tracking_uri:
            self._runs[job_id] = run_id  # this process is a rank of a job its Runner opened

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import_optional("mlflow", "mlflow")
                from mlflow import MlflowClient

                _ = self.store  # a missing sqlite store is created whole, not by MLflow
                self._client = MlflowClient(tracking_uri=self.tracking_uri)
            return self._client

    @property
    def store(self) -> RunStore:
        """Runs, tags and metrics (``open_store``: REST, rows, else MLflow's client)."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.tracking_uri, lambda: self.client)
            return self._store

    def _run(self, job_id: str, create: bool = True) -> Optional[str]:
        """The MLflow run of ``job_id``, created if asked and missing (a pipeline run, or a
        job whose Runner did not open one)."""
        with self._lock:
            if job_id not in self._runs:
                store = self.store
                found = store.find_run(TAG_JOB_ID, job_id)
                if found is not None:
                    self._runs[job_id] = found[0]
                elif create:  # one run however many stages open it at once (RunStore's)
                    name, tags = self.experiment_name or DEFAULT_EXPERIMENT, {TAG_JOB_ID: job_id}
                    exp_id = store.experiment_id(name, self.artifact_location)
                    self._runs[job_id] = store.create_tagged_run(
                        exp_id, job_id, tags, {}, now_ms(), TAG_JOB_ID
                    )
            return self._runs.get(job_id)

    def _ensure(self, job_id: str) -> str:
        return str(self._run(job_id))  # a run, or it raised

    def backend_run_id(self, run_id: str) -> Optional[str]:
        return self._run(run_id, create=False)

    mlflow_run_id = backend_run_id  # by its MLflow name

    def latest_metrics(self, backend_run_id: str, by_time: Sequence[str] = ()) -> Latest:
        """By the store (SQL, REST or MlflowClient: no ``import mlflow`` on sqlite or http)."""
        return dict(self.store.latest_metrics(backend_run_id, tuple(by_time)))

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        rid = self._ensure(run_id)
        for k, v in kwargs.items():
            self.store.tag_run(rid, k if k != "kind" else TAG_KIND, str(v))

    def _tags(self, job_id: str) -> Mapping[str, str]:
        reads = self._reads
        if reads is not None and job_id in reads.tags:
            return reads.tags[job_id]
        rid, sql = self._run(job_id, create=False), self._sql()
        return {} if not rid else sql.run_tags(rid) if sql else self.client.get_run(rid).data.tags

    def _sql(self) -> Optional[SqliteStore]:
        """The sqlite store that writes tags, inputs and artifacts too (else MlflowClient)."""
        store = self.store
        return store if isinstance(store, SqliteStore) else None

    def _tagged(self, key: str, value: str, like: bool = False) -> List[Mapping[str, str]]:
        """The tags of each run whose tag ``key`` is ``value`` (``like``: a LIKE pattern)."""
        return list(self._search_tag(key, value, like).values())

    def _exp_ids(self, rest: MlflowRest) -> List[str]:
        reads = self._reads
        if reads is None:
            return rest.experiment_ids()
        if reads.exp_ids is None:
            reads.exp_ids = rest.experiment_ids()
        return reads.exp_ids

    def _search(self, flt: str, limit: int) -> Dict[str, Dict[str, str]]:
        """{MLflow run id: tags} of the runs matching ``flt`` in any active experiment, oldest
        first: a server's by REST (a request per page), another store's by ``MlflowClient``."""
        store = self.store
        if isinstance(store, MlflowRest):
            return store.search_tags(self._exp_ids(store), flt, limit)
        runs = search_runs(self.client, flt, min(limit, 50000))
        return {str(r.info.run_id): dict(r.data.tags) for r in runs}

    def _search_tag(
        self, key: str, value: str, like: bool = False, limit: int = 50000
    ) -> Dict[str, Dict[str, str]]:
        """{MLflow run id: tags} of the runs whose tag ``key`` is ``value`` (``like``: a LIKE
        pattern), oldest first; one search (MLflow's has no IN for tags)."""
        if sql := self._sql():
            return sql.tagged_runs(key, value, like)
        return self._search(f"tags.`{key}` {'LIKE' if like else '='} '{quote(value)}'", limit)

    def _search_ids(self, ids: Sequence[str], prefix: bool = False) -> Dict[str, Dict[str, str]]:
        """{MLflow run id: tags} of the runs among ``ids`` (all in one search), or whose id
        starts with ``ids[0]`` (``prefix``)."""
        if not ids:
            return {}
        if sql := self._sql():
            return sql.runs_by_id(ids, prefix)
        if prefix:
            return self._search(f"attributes.run_id LIKE '{quote(ids[0])}%'", PREFIX_LIMIT)
        found: Dict[str, Dict[str, str]] = {}
        for i in range(0, len(ids), 100):
            listed = ", ".join(f"'{quote(rid)}'" for rid in ids[i : i + 100])
            found.update(self._search(f"attributes.run_id IN ({listed})", 50000))
        return found

    def _record(self, found: Mapping[str, Mapping[str, str]]) -> List[str]:
        """Keep what a search found (the oldest run of a job id wins, as ``_run``'s); returns
        the job ids found, in order."""
        jobs: List[str] = []
        with self._lock:
            for rid, tags in found.items():
                job = tags.get(TAG_JOB_ID)
                if job is None:
                    continue
                self._runs.setdefault(job, rid)
                if self._reads is not None and not self._reads.tags.get(job):
                    self._reads.tags[job] = tags
                jobs.append(job)
        return list(dict.fromkeys(jobs))

    @contextlib.contextmanager
    def batched_reads(self) -> Iterator[_Reads]:
        """Reads in this block share what they fetched: tags, consumers, stages (a command's
        view of the store; writes are not seen)."""
        with self._lock:
            outer = self._reads
            reads = self._reads = outer or _Reads()
            try:
                yield reads
            finally:
                self._reads = outer

    def find_run_id(self, text: str) -> str:
        """A torchx job id (a handle), or a unique prefix of one, of its app id (the handle's
        last part) or of an MLflow run id: the job id of that run; ``AmbiguousRunError`` for
        a prefix of several; ``text`` itself if no run matches. One search for a handle."""
        with self.batched_reads():
            if _MLFLOW_ID.fullmatch(text):
                for rid, tags in self._search_ids([text]).items():
                    self._record({rid: tags})
                    return tags.get(TAG_JOB_ID, rid)
            like = text  # ``_`` and ``%`` match more (LIKE has no escape on every store):
            # the matches are filtered here
            found = self._search_tag(TAG_JOB_ID, f"{like}%", like=True, limit=PREFIX_LIMIT)
            candidates = [j for j in self._record(found) if j.startswith(text)]
            if text in candidates:
                return text
            if _HEX.fullmatch(text):
                for rid, tags in self._search_ids([text], prefix=True).items():
                    if rid.startswith(text):
                        self._record({rid: tags})
                        candidates.append(tags.get(TAG_JOB_ID, rid))
            if not candidates:  # the app id: the handle's last part
                found = self._search_tag(TAG_JOB_ID, f"%/{like}%", like=True, limit=PREFIX_LIMIT)
                candidates = [
                    j for j in self._record(found) if j.rpartition("/")[2].startswith(text)
                ]
            candidates = list(dict.fromkeys(candidates))
            if len(candidates) > 1:
                raise AmbiguousRunError(text, candidates)
            return candidates[0] if candidates else text

    def _fetch_graph(self, root: str, stages: bool) -> None:
        """Read the lineage around ``root`` (and a pipeline's stages) level by level, into
        ``_reads``: its stages in one search, each level upstream in one search (MLflow run
        ids ``IN``; a source named by job id only: one search each), and each run
        downstream in one search (its consumers, with their tags)."""
        reads = self._reads
        assert reads is not None
        if not reads.tags.get(root):
            self._record(self._search_tag(TAG_JOB_ID, root))
            if not reads.tags.get(root) and _MLFLOW_ID.fullmatch(root):
                self._record(self._search_ids([root]))
            reads.tags.setdefault(root, {})
        if stages and root not in reads.children:
            reads.children[root] = self._record(self._search_tag(TAG_PARENT, root))
        starts = (reads.children.get(root) or [root]) if stages else [root]
        frontier = starts
        while frontier:  # upstream: what the frontier consumed
            tags = [reads.tags.get(rid, {}) for rid in frontier]
            wanted = [
                s["run"]
                for t in tags
                for s in json.loads(t.get(TAG_SOURCES, "[]"))
                if s["run"] not in reads.tags
            ]
            wanted = list(dict.fromkeys(wanted))
            known = [  # the producers' MLflow ids, as add_source tagged them
                v[len("runs:/") :].partition("/")[0]
                for t in tags
                for k, v in t.items()
                if k.startswith("torchx.source.") and v.startswith("runs:/")
            ]
            if wanted:
                self._record(self._search_ids(list(dict.fromkeys(known))))
            for rid in wanted:
                if rid not in reads.tags:
                    self._record(self._search_tag(TAG_JOB_ID, rid))
                reads.tags.setdefault(rid, {})
            frontier = wanted
        frontier, seen = starts, set(starts)
        while frontier:  # downstream: who consumed the frontier
            following: List[str] = []
            for rid in frontier:
                if rid in reads.consumers:
                    continue
                found = self._search_tag(TAG_SOURCES, f'%"{rid}"%', like=True)
                self._record(found)
                reads.consumers[rid] = list(found.values())
                for t in found.values():
                    job = t.get(TAG_JOB_ID)
                    if job and job not in seen:
                        seen.add(job)
                        following.append(job)
            frontier = following

    def pipeline_lineage(self, run_id: str) -> Lineage:
        """As ``TrackerBase``'s, from a handful of searches (``_fetch_graph``), not a few
        requests per run."""
        with self.batched_reads():
            self._fetch_graph(self.resolve_run_id(run_id), stages=True)
            return super().pipeline_lineage(run_id)

    def lineage(self, run_id: str) -> Lineage:
        with self.batched_reads():
            self._fetch_graph(run_id, stages=False)
            return super().lineage(run_id)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        out: Dict[str, object] = {
            k: v
            for k, v in self._tags(run_id).items()
            if not k.startswith(("mlflow.", ARTIFACT_PREFIX)) and k != TAG_SOURCES
        }
        if TAG_KIND in out:
            out["kind"] = out.pop(TAG_KIND)
        return out

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        rid = self._ensure(run_id)
        meta = {"path": path, **(metadata or {})}
        for k, v in meta.items():
            self.store.tag_run(rid, f"{ARTIFACT_PREFIX}{name}.{k}", str(v))
        local = path[len("file://") :] if path.startswith("file://") else path
        if "://" not in local and os.path.exists(local):
            self._copy_artifact(rid, local, name)
        if (metadata or {}).get("type") == "dataset":
            self._log_dataset(rid, name, path, meta, context="output")

    def _copy_artifact(self, rid: str, local: str, name: str) -> None:
        """Into a local artifact location as MLflow's local repository copies (``import
        mlflow`` costs a stage seconds of CPU); elsewhere by MlflowClient."""
        sql = self._sql()
        dest = (sql.run_info(rid) or ("", "", ""))[2].removeprefix("file://") if sql else ""
        to = os.path.normpath(os.path.join(dest, name))  # a name outside it: MLflow's error
        if not os.path.isabs(dest) or not to.startswith(dest.rstrip("/") + "/"):
            log = self.client.log_artifacts if os.path.isdir(local) else self.client.log_artifact
            log(rid, local, artifact_path=name)
            return
        os.makedirs(to, exist_ok=True)
        if os.path.isdir(local):
            shutil.copytree(local, to, dirs_exist_ok=True)
        else:
            shutil.copy2(local, to)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        grouped: Dict[str, Dict[str, object]] = {}
        for key, value in self._tags(run_id).items():
            if key.startswith(ARTIFACT_PREFIX):
                name, _, field = key[len(ARTIFACT_PREFIX) :].rpartition(".")
                grouped.setdefault(name, {})[field] = value
        return {n: TrackerArtifact(n, str(f.pop("path", "")), f) for n, f in grouped.items()}

    def _log_dataset(
        self, rid: str, name: str, source: str, meta: Mapping[str, object], context: str
    ) -> None:
        digest = str(meta.get("digest") or hashlib.sha256(source.encode()).hexdigest())[:36]
        dataset, sql = (name, digest, "torchx", json.dumps({"uri": source})), self._sql()
        if sql:
            return sql.log_dataset(rid, dataset, context)
        from mlflow.entities import Dataset, DatasetInput, InputTag

        tags = [InputTag("mlflow.data.context", context)]
        self.client.log_inputs(rid, datasets=[DatasetInput(Dataset(*dataset), tags=tags)])

    def add_source(self, run_id: str, source_id: str, artifact_name: Optional[str] = None) -> None:
        rid = self._ensure(run_id)
        sources = json.loads(self._tags(run_id).get(TAG_SOURCES, "[]"))
        entry = {"run": source_id, "artifact": artifact_name}
        if entry not in sources:
            sources.append(entry)
            self.store.tag_run(rid, TAG_SOURCES, json.dumps(sources))
        producer = self._run(source_id, create=False)
        meta = self.artifacts(source_id).get(artifact_name or "") if producer else None
        where = f"runs:/{producer}/{artifact_name or ''}" if producer else source_id
        self.store.tag_run(rid, f"torchx.source.{artifact_name or 'run'}", where)
        metadata: Dict[str, object] = dict(meta.metadata or {}) if meta else {}
        self._log_dataset(rid, artifact_name or "run", where, metadata, context="input")

    def sources(self, run_id: str, artifact_name: Optional[str] = None) -> Iterable[TrackerSource]:
        found = json.loads(self._tags(run_id).get(TAG_SOURCES, "[]"))
        return [
            TrackerSource(s["run"], s["artifact"])
            for s in found
            if artifact_name in (None, s["artifact"])
        ]

    def descendants(self, run_id: str) -> Iterable[TrackerSource]:
        out = []
        reads = self._reads
        consumers = reads.consumers.get(run_id) if reads is not None else None
        if consumers is None:
            consumers = self._tagged(TAG_SOURCES, f'%"{run_id}"%', like=True)
        for tags in consumers:
            for s in json.loads(tags.get(TAG_SOURCES, "[]")):
                if s["run"] == run_id:
                    out.append(TrackerSource(tags[TAG_JOB_ID], s["artifact"]))
        return out

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        self.store.log_metric_rows(self._ensure(run_id), metric_rows(metrics, now_ms(), step or 0))

    def log_metrics_batch(self, run_id: str, batch: Sequence[StepMetrics]) -> None:
        rows = [row for metrics, step, ts in batch for row in metric_rows(metrics, ts, step)]
        if rows:
            self.store.log_metric_rows(self._ensure(run_id), rows)

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        rid = self._ensure(run_id)
        self.store.tag_run(rid, TAG_PARENT, parent_run_id)
        parent = self._run(parent_run_id, create=False)
        if parent is not None:
            self.store.tag_run(rid, TAG_NESTED, parent)

    def end_run(self, run_id: str, status: str) -> None:
        """End the run; a duplicate still RUNNING (created at once with it on a store
        without a lock, and missed by its creator's check) ends as ``status`` too."""
        runs = self.store.search_tagged(TAG_JOB_ID, run_id)
        with self._lock:
            rid = self._runs.get(run_id) or (runs[0].run_id if runs else None)
            if rid is None:
                return
            self._runs[run_id] = rid  # the pipeline's sums are logged to it next
        self.store.terminate(rid, status)  # set_terminated prints "View run ..." to stdout
        for dup in runs:
            if dup.run_id != rid and dup.status == "RUNNING":
                logger.warning("ending duplicate run %s of %s as %s", dup.run_id, run_id, status)
                self.store.terminate(dup.run_id, status)

    def stage_metrics(self, run_id: str) -> Optional[List[Mapping[str, float]]]:
        """Each stage run's latest metrics under the pipeline run ``run_id``: one paged
        search of the runs tagged with it (never a read per stage)."""
        return [r.metrics for r in self.store.search_tagged(TAG_PARENT, run_id)]

    def resolve_run_id(self, run_id: str) -> str:
        """Accepts an MLflow run id too (32 hex digits): returns its torchx job id."""
        reads = self._reads
        if reads is not None and reads.tags.get(run_id):
            return run_id
        if _MLFLOW_ID.fullmatch(run_id) and self._run(run_id, create=False) is None:
            for rid, tags in self._search_ids([run_id]).items():
                self._record({rid: tags})
                return tags.get(TAG_JOB_ID, run_id)
        return run_id

    def run_url(self, run_id: str) -> Optional[str]:
        """``<ui>/#/experiments/<exp>/runs/<run>`` in the run's own experiment; None without
        a UI (an embedded sqlite store has none unless ``ui_url`` is configured)."""
        rid = self._run(run_id, create=False) if self.ui_url else None
        info = self.store.run_info(rid) if rid is not None else None
        return f"{self.ui_url}/#/experiments/{info[0]}/runs/{rid}" if info else None

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        reads = self._reads
        if parent and reads is not None and parent in reads.children:
            return list(reads.children[parent])
        runs = self._tagged(TAG_PARENT, parent) if parent else self._tagged(TAG_JOB_ID, "%", True)
        return [tags[TAG_JOB_ID] for tags in runs if TAG_JOB_ID in tags]


def create(config: Optional[str] = None) -> MLflowTracker:
    return MLflowTracker(**parse_config(config))


class MlflowBackend:
    """The Runner's MLflow (a ``TrackerBackend``): opens and ends job runs by MLflow id."""

    def __init__(self, name: str, config: Optional[str]) -> None:
        self.name, self.config = name, config
        self._cfg = parse_config(config)
        self.uri = str(self._cfg["tracking_uri"])
        self.store = redact(self.uri)  # for messages: no credentials
        self._tracker: Optional[MLflowTracker] = None
        self._lock = threading.RLock()
        self._job_stores: Dict[str, str] = {}  # run id -> the store its job's env names
        self._others: Dict[str, MLflowTracker] = {}  # those stores, when not this one

    def _store_of(self, run_id: str) -> RunStore:
        """The store of a job's run: the one its job's env names (``job_run_id``)."""
        uri = self._job_stores.get(run_id, self.uri)
        with self._lock:
            if uri != self.uri and uri not in self._others:
                self._others[uri] = MLflowTracker(tracking_uri=uri)
            return (self._others[uri] if uri != self.uri else self.tracker()).store

    def tracker(self) -> MLflowTracker:
        with self._lock:
            self._tracker = self._tracker or create(self.config)
            return self._tracker

    def validate(self) -> None:
        """Without importing mlflow: the package is installed and the store is reachable
        (a server answers) or creatable (a writable directory)."""
        if importlib.util.find_spec("mlflow") is None:
            raise MissingExtraError("mlflow", "mlflow")
        uri, db = mask_urls(self.uri), sqlite_file(self.uri)  # messages never show a password
        if is_http(self.uri):
            MlflowRest(self.uri).health()
        elif db is not None and not os.access(os.path.dirname(os.path.abspath(db)), os.W_OK):
            raise TrackerConfigError(
                f"MLflow sqlite store {uri}: its directory does not exist or is not writable"
            )
        elif uri.startswith("file:"):
            raise TrackerConfigError(
                f"MLflow >= 3 refuses file stores ({uri}); use sqlite:///path/mlflow.db"
            )

    def open_job_run(self, job: JobRun) -> OpenedRun:
        """By the tracker's ``store``: REST, SQL, else MlflowClient."""
        store, tags, exp_id = self.tracker().store, {TAG_KIND: "job"}, None
        if job.parent_run_id:
            tags[TAG_PARENT] = job.parent_run_id
            pid = job.parent_run_id  # a pipeline run's torchx id, or an MLflow id (KFP's run)
            info = store.run_info(pid) if _MLFLOW_ID.fullmatch(pid) else None
            parent = (pid, info[0]) if info else store.find_run(TAG_JOB_ID, pid)
            if parent is not None:  # stages live with their pipeline run, nested under it
                tags[TAG_NESTED], exp_id = parent
        if exp_id is None:
            name = self._cfg["experiment_name"] or job.experiment_name or DEFAULT_EXPERIMENT
            exp_id = store.experiment_id(name, self._cfg["artifact_location"])
        run_id = store.create_run(exp_id, job.name, tags, job.params, job.start_ms or now_ms())
        env = {ENV_RUN_ID: run_id, ENV_TRACKING_URI: self.uri, ENV_EXPERIMENT_ID: exp_id}
        if sqlite_file(self.uri) is None:  # a server's credentials, TLS: as MLflow's own
            env.update(client_env())  # client reads them, in the job's env
        # the job carries its store resolved (not this process's $MLFLOW_TRACKING_URI,
        # $TORCHX_HOME or cwd), so whichever process ends its run ends it there
        file = self.config or ""  # a config file: its absolute path, else the store's URI
        config = os.path.abspath(file) if os.path.isfile(file) else self.uri
        env[tracker_config_env_var_name(self.name)] = config
        return OpenedRun(run_id, env)

    def bind_job_run(self, run_id: str, job_id: str) -> None:
        self.tracker().store.tag_run(run_id, TAG_JOB_ID, job_id)

    def job_run_id(self, job_id: str, env: Mapping[str, str]) -> Optional[str]:
        """The run id in the job's env, in the store the env names: this tracker's, or for
        a job whose run this tracker opened (it carries its config) the job's own."""
        run_id, uri = env.get(ENV_RUN_ID) or None, env.get(ENV_TRACKING_URI)
        if run_id is None or uri is None:
            return None
        if uri != self.uri:
            if tracker_config_env_var_name(self.name) not in env:
                return None  # not a run torchx opened: leave it alone
            self._job_stores[run_id] = uri
        return run_id

    def close_job_run(
        self, job_id: str, run_id: Optional[str], status: str, end_ms: Optional[int] = None
    ) -> None:
        """End the run as ``status`` (the app's end wins over a user's own ``end_run``)."""
        if run_id is None:  # an app whose env its scheduler does not return
            found = self.tracker().store.find_run(TAG_JOB_ID, job_id) if job_id else None
            if found is None:
                return
            run_id = found[0]
        self._store_of(run_id).terminate(run_id, status, end_ms)

    def log_job_run(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        step: int,
        tags: Mapping[str, str],
        timestamp_ms: Optional[int] = None,
    ) -> None:
        store = self._store_of(run_id)
        for key, value in tags.items():
            store.tag_run(run_id, key, value)
        if metrics:
            store.log_metric_rows(run_id, metric_rows(metrics, timestamp_ms or now_ms(), step))

    def job_run_latest(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest:
        return dict(self._store_of(run_id).latest_metrics(run_id, by_time))

    def job_run_status(self, run_id: str) -> Optional[str]:  # None: no such run
        info = self._store_of(run_id).run_info(run_id)
        return str(info[1]) if info else None

    def close(self) -> None:
        with self._lock:
            self._tracker = None
            self._others.clear()


if TYPE_CHECKING:  # mypy checks that it keeps the Runner's contract (as FactoryBackend's
    from torchx.trackers.api import TrackerBackend  # is checked by ``tracker_backend``)

    _contract: TrackerBackend = MlflowBackend("mlflow", None)
