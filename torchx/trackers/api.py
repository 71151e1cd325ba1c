"""Tracker API (upstream's names, plus lineage, metrics and run status): a ``TrackerBase``
records and reads runs (ranks, pipelines); a ``TrackerBackend`` is what the ``Runner`` holds
per tracker to open a job's run before the submit and end it with the app."""

from __future__ import annotations

import abc
import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)

from torchx.specs.api import TorchXError
from torchx.trackers.env import (  # noqa: F401 (this module's public names)
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    UNDEFINED_RUN_ID,
    tracker_config_env_var_name,
)

Latest = Dict[str, Tuple[float, int]]  # {metric: (value, timestamp ms)}
MetricRow = Tuple[str, float, int, int]  # (key, value, timestamp ms, step)
# metrics taken at one step and time: (metrics, step, timestamp ms)
StepMetrics = Tuple[Mapping[str, float], int, int]


class TrackerConfigError(TorchXError, ValueError):
    """An unknown tracker backend or an unusable tracker config."""


def read_config_file(path: str, keys: Iterable[str] = ()) -> Dict[str, str]:
    """``key=value`` lines (``#`` comments); with ``keys``, any other key is an error."""
    out: Dict[str, str] = {}
    with open(path) as f:
        for line in (raw.strip() for raw in f):
            if line and not line.startswith("#") and "=" in line:
                k, v = (part.strip() for part in line.split("=", 1))
                if keys and k not in keys:
                    raise TrackerConfigError(f"{path}: unknown key {k!r}; use {', '.join(keys)}")
                out[k] = v
    return out


class AmbiguousRunError(TorchXError, ValueError):
    """A run prefix that matches more than one run (``candidates``: the first few)."""

    SHOWN = 5

    def __init__(self, prefix: str, candidates: Sequence[str]) -> None:
        shown = ", ".join(candidates[: self.SHOWN])
        more = f" and {len(candidates) - self.SHOWN} more" if len(candidates) > self.SHOWN else ""
        super().__init__(f"{prefix!r} matches several tracked runs: {shown}{more}; give more of it")
        self.prefix, self.candidates = prefix, list(candidates)


@dataclass
class TrackerSource:
    """A run this run consumed from, optionally through one of its artifacts."""

    source_run_id: str
    artifact_name: Optional[str]


@dataclass
class TrackerArtifact:
    name: str
    path: str
    metadata: Optional[Mapping[str, object]]


@dataclass(frozen=True)
class LineageEdge:
    """``source`` produced ``artifact``, which ``target`` consumed."""

    source: str
    target: str
    artifact: Optional[str]


@dataclass
class Lineage:
    """The graph around one run: every run upstream and downstream, and the edges between."""

    run_id: str
    edges: List[LineageEdge] = field(default_factory=list)
    runs: Dict[str, Dict[str, object]] = field(default_factory=dict)
    stages: List[str] = field(default_factory=list)  # for a pipeline run: its stage runs

    def upstream(self, run_id: Optional[str] = None) -> List[LineageEdge]:
        return [e for e in self.edges if e.target == (run_id or self.run_id)]

    def downstream(self, run_id: Optional[str] = None) -> List[LineageEdge]:
        return [e for e in self.edges if e.source == (run_id or self.run_id)]


class TrackerBase(abc.ABC):
    """A backend that stores runs (keyed by torchx job id)."""

    keeps_metrics = False  # whether ``latest_metrics`` reads a run's metrics back (MLflow)

    @abc.abstractmethod
    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None: ...
    @abc.abstractmethod
    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]: ...
    @abc.abstractmethod
    def add_metadata(self, run_id: str, **kwargs: object) -> None: ...
    @abc.abstractmethod
    def metadata(self, run_id: str) -> Mapping[str, object]: ...
    @abc.abstractmethod
    def add_source(
        self, run_id: str, source_id: str, artifact_name: Optional[str] = None
    ) -> None: ...
    @abc.abstractmethod
    def sources(
        self, run_id: str, artifact_name: Optional[str] = None
    ) -> Iterable[TrackerSource]: ...
    # runs that consumed this one (``source_run_id`` is the consumer here)
    @abc.abstractmethod
    def descendants(self, run_id: str) -> Iterable[TrackerSource]: ...
    @abc.abstractmethod
    def run_ids(self, **kwargs: str) -> Iterable[str]: ...

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        """Per-step metrics; backends without metrics ignore them."""

    def log_metrics_batch(self, run_id: str, batch: Sequence[StepMetrics]) -> None:
        """Many steps' metrics at once; a backend that can sends them in one call."""
        for metrics, step, _ in batch:
            self.log_metrics(run_id, metrics, step)

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        """Nest this run under a pipeline run (distinct from data sources)."""

    def end_run(self, run_id: str, status: str) -> None:
        """Mark the run ``FINISHED``, ``FAILED`` or ``KILLED``."""

    def resolve_run_id(self, run_id: str) -> str:
        """The torchx run id for ``run_id`` (backends may also accept their own run ids)."""
        return run_id

    def find_run_id(self, text: str) -> str:
        """The run a person named: a run id, or (backends that can) a unique prefix of one;
        raises ``AmbiguousRunError`` for a prefix of several; ``text`` itself if none."""
        return self.resolve_run_id(text)

    def batched_reads(self) -> ContextManager[object]:
        """A block whose reads may share what they fetched (a backend's cache of one command)."""
        return contextlib.nullcontext()

    def pipeline_lineage(self, run_id: str) -> Lineage:
        """The lineage of a run; for a pipeline run, of all its stages together."""
        run_id = self.resolve_run_id(run_id)
        stages = list(self.run_ids(parent_run_id=run_id))
        if not stages:
            return self.lineage(run_id)
        merged = Lineage(run_id, stages=stages)
        merged.runs[run_id] = dict(self.metadata(run_id))
        for stage in stages:
            part = self.lineage(stage)
            merged.edges.extend(e for e in part.edges if e not in merged.edges)
            merged.runs.update(part.runs)
        return merged

    def run_url(self, run_id: str) -> Optional[str]:
        """A URL a person can open for the run, or None where the backend has no UI."""
        return None

    def backend_run_id(self, run_id: str) -> Optional[str]:
        """The backend's own id of the run (MLflow's run id); None where it has none."""
        return None

    def stage_metrics(self, run_id: str) -> Optional[List[Mapping[str, float]]]:
        """Each stage run's latest metrics under the pipeline run ``run_id`` in a bounded
        number of requests; None: the backend reads its stages one by one."""
        return None

    def latest_metrics(self, backend_run_id: str, by_time: Sequence[str] = ()) -> Latest:
        """Each metric's latest value (the ``by_time`` keys' newest by time); {} in a backend
        that keeps no metrics."""
        return {}

    def lineage(self, run_id: str) -> Lineage:
        """Walk sources (upstream) and descendants (downstream) transitively."""
        lineage, seen = Lineage(run_id), {run_id}
        for upstream in (True, False):
            todo, visited = [run_id], {run_id}
            while todo:
                rid = todo.pop()
                for s in self.sources(rid) if upstream else self.descendants(rid):
                    other = s.source_run_id  # the producer upstream, the consumer downstream
                    ends = (other, rid) if upstream else (rid, other)
                    lineage.edges.append(LineageEdge(*ends, s.artifact_name))
                    if other not in visited:
                        visited.add(other)
                        todo.append(other)
            seen |= visited
        lineage.edges = list(dict.fromkeys(lineage.edges))
        for rid in seen:
            lineage.runs[rid] = dict(self.metadata(rid))
        return lineage


@dataclass
class JobRun:
    """What the Runner tells a backend about a job whose run it opens."""

    name: str
    params: Dict[str, str]
    parent_run_id: Optional[str] = None
    experiment_name: Optional[str] = None
    start_ms: int = 0


@dataclass
class OpenedRun:
    """A job's run as its backend opened it: the backend's id, and the env that carries it
    to the job's ranks (MLflow: ``MLFLOW_RUN_ID``, ``MLFLOW_TRACKING_URI``, ...)."""

    run_id: str
    env: Dict[str, str] = field(default_factory=dict)


class TrackerBackend(Protocol):
    """One configured tracker as the Runner that submits jobs uses it (in-process). The
    ``job_run_*`` readers answer None where the backend cannot tell."""

    name: str
    config: Optional[str]
    store: str  # where its runs live, for messages

    # a cheap submit-time check (seconds): the backend exists and its store is usable
    def validate(self) -> None: ...
    # the job's run, made before the submit (raises if it cannot)
    def open_job_run(self, job: JobRun) -> OpenedRun: ...
    # the scheduler accepted the job: record its handle on the run
    def bind_job_run(self, run_id: str, job_id: str) -> None: ...
    # the id of the job's run, from the env its roles were given
    def job_run_id(self, job_id: str, env: Mapping[str, str]) -> Optional[str]: ...
    # end the job's run as FINISHED, FAILED or KILLED
    def close_job_run(
        self, job_id: str, run_id: Optional[str], status: str, end_ms: Optional[int] = None
    ) -> None: ...
    # tags, and metrics at ``step`` taken at ``timestamp_ms`` (None: now), on the job's run
    # (where the backend keeps them)
    def log_job_run(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        step: int,
        tags: Mapping[str, str],
        timestamp_ms: Optional[int] = None,
    ) -> None: ...
    # each metric's newest value by time (keys not in ``by_time``: may be the highest step's)
    def job_run_latest(
        self, run_id: str, by_time: Optional[Iterable[str]] = None
    ) -> Optional[Latest]: ...
    def job_run_status(self, run_id: str) -> Optional[str]: ...  # RUNNING, FINISHED, ...
    # the reading and recording side, built on first use
    def tracker(self) -> TrackerBase: ...
    def close(self) -> None: ...  # release clients (connections, engines)


class FactoryBackend:
    """A ``TrackerBackend`` over any ``create(config) -> TrackerBase`` (fsspec, users' own):
    the run id is the job id, and it cannot read a run back."""

    def __init__(self, name: str, config: Optional[str], create: Callable[..., Any]) -> None:
        self.name, self.config, self._create = name, config, create
        self.store = f"{name} ({config})"
        self._tracker: Optional[TrackerBase] = None
        self._pending: Dict[str, JobRun] = {}  # opened, not yet bound to a handle

    def tracker(self) -> TrackerBase:
        if self._tracker is None:
            self._tracker = self._create(self.config)
        return self._tracker

    def validate(self) -> None:
        self.tracker()

    def open_job_run(self, job: JobRun) -> OpenedRun:
        token = f"pending-{id(job)}"  # the handle becomes the run id in bind_job_run
        self._pending[token] = job
        return OpenedRun(token)

    def bind_job_run(self, run_id: str, job_id: str) -> None:
        job = self._pending.pop(run_id)
        if job.parent_run_id:
            self.tracker().set_parent(job_id, job.parent_run_id)
        self.tracker().add_metadata(job_id, run_name=job.name, **job.params)

    def job_run_id(self, job_id: str, env: Mapping[str, str]) -> Optional[str]:
        return job_id

    def close_job_run(self, job_id: str, run_id: Optional[str], status: str, *_: Any) -> None:
        if run_id is not None and self._pending.pop(run_id, None) is not None:
            return  # its submit failed: the run was never recorded, there is nothing to end
        self.tracker().end_run(job_id, status)

    def log_job_run(self, *_: Any, **__: Any) -> None: ...

    def job_run_latest(self, *_: Any) -> Optional[Latest]:
        return None

    def job_run_status(self, run_id: str) -> Optional[str]:
        return None

    def close(self) -> None:
        self._tracker = None


def _factory(name: str) -> Any:
    """The ``create`` of a tracker: builtin, an entry point, or ``module:function``."""
    from torchx.util.entrypoints import load_group, load_object

    backends = {
        "fsspec": lambda: load_object("torchx.trackers.fsspec_backend:create"),
        "mlflow": lambda: load_object("torchx.trackers.mlflow_backend:create"),
        **load_group("torchx.tracker"),
    }
    if name in backends:
        return backends[name]()
    if ":" in name or "." in name:
        try:
            return load_object(name)
        except (ImportError, AttributeError) as e:
            raise TrackerConfigError(f"cannot load tracker {name!r}: {e}") from None
    raise TrackerConfigError(
        f"unknown tracker {name!r}; known trackers: {', '.join(sorted(backends))}"
        " (or give module:function)"
    )


# trackers with a backend of their own (the others are adapted from their factory)
BUILTIN_BACKENDS = {"mlflow": "torchx.trackers.mlflow_backend:MlflowBackend"}


def tracker_backend(name: str, config: Optional[str]) -> TrackerBackend:
    """The ``TrackerBackend`` of a configured tracker, loaded in this process (with its env)."""
    if name in BUILTIN_BACKENDS:  # by name, as the builtin factories: loaded on first use
        from torchx.util.entrypoints import load_object

        backend: TrackerBackend = load_object(BUILTIN_BACKENDS[name])(name, config)
        return backend
    return FactoryBackend(name, config, _factory(name))


def build_trackers(entrypoint_and_config: Mapping[str, Optional[str]]) -> List[TrackerBase]:
    """Instantiate trackers from ``{name or module:fn: config}``."""
    return [_factory(name)(config) for name, config in entrypoint_and_config.items()]


def trackers_from_environ() -> List[TrackerBase]:
    names = [n.strip() for n in os.environ.get(ENV_TORCHX_TRACKERS, "").split(",") if n.strip()]
    return build_trackers({n: os.environ.get(tracker_config_env_var_name(n)) for n in names})


@dataclass
class AppRunTrackableSource:
    parent: AppRun
    artifact_name: Optional[str]


@dataclass
class AppRun:
    """The tracked run of the current torchx job (its backends built on the first call);
    does nothing outside a torchx job."""

    id: str
    backends: List[TrackerBase]

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def run_from_env() -> AppRun:
        job_id = os.environ.get(ENV_TORCHX_JOB_ID)
        if not job_id:
            return AppRun(UNDEFINED_RUN_ID, [])
        run = AppRun(job_id, trackers_from_environ())
        parent = os.environ.get(ENV_TORCHX_PARENT_RUN_ID)
        if parent and not os.environ.get("MLFLOW_RUN_ID"):  # no Runner nested it already
            for backend in run.backends:
                backend.set_parent(job_id, parent)
        return run

    def job_id(self) -> str:
        return self.id

    def add_metadata(self, **kwargs: object) -> None:
        for b in self.backends:
            b.add_metadata(self.id, **kwargs)

    def add_artifact(
        self, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        for b in self.backends:
            b.add_artifact(self.id, name, path, metadata)

    def add_source(self, source_id: str, artifact_name: Optional[str] = None) -> None:
        for b in self.backends:
            b.add_source(self.id, source_id, artifact_name)

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        for b in self.backends:
            b.log_metrics(self.id, metrics, step)

    def log_metrics_batch(self, batch: Sequence[StepMetrics]) -> None:
        """``(metrics, step, timestamp ms)`` of many steps, in one call per backend."""
        for b in self.backends:
            b.log_metrics_batch(self.id, batch)

    def sources(self) -> Iterable[AppRunTrackableSource]:
        return [
            AppRunTrackableSource(AppRun(s.source_run_id, self.backends), s.artifact_name)
            for s in (self.backends[0].sources(self.id) if self.backends else [])
        ]

    def children(self) -> Iterable[AppRun]:
        ids = self.backends[0].run_ids(parent_run_id=self.id) if self.backends else []
        return [AppRun(rid, self.backends) for rid in ids]


def app_run_from_env() -> AppRun:
    return AppRun.run_from_env()
