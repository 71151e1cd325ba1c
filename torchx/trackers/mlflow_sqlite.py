"""MLflow on a sqlite store without ``import mlflow`` (seconds of CPU): rows with ``sqlite3``,
only on a schema revision the tests checked (docs/tracking.md, "A new sqlite store")."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import json
import logging
import math
import os
import re
import sqlite3
import tempfile
import time
import uuid
from importlib.util import find_spec
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from torchx.trackers.api import Latest, MetricRow
from torchx.trackers.mlflow_rest import DeletedExperimentError
from torchx.trackers.mlflow_runs import TaggedRun, converge

logger = logging.getLogger(__name__)
SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlflow_schema.json")
# the schema revisions tests/trackers checked these rows on, one a line (``#``: a comment)
CHECKED = os.path.join(os.path.dirname(SNAPSHOT), "mlflow_schema_checked.txt")
_MAX = 1.7976931348623157e308  # a float's largest
# the active runs (in active experiments) whose tag ``?`` is ``?``, oldest first
_TAGGED = (
    "SELECT r.run_uuid, r.experiment_id, r.status, r.start_time FROM runs r JOIN experiments"
    " e USING (experiment_id) JOIN tags t ON t.run_uuid = r.run_uuid WHERE r.lifecycle_stage"
    " = 'active' AND e.lifecycle_stage = 'active' AND t.key = ? AND t.value = ?"
    " ORDER BY r.start_time, r.run_uuid"
)
_REVISION = re.compile(r'^(down_)?revision\s*=\s*"([0-9a-f]+)"', re.M)


@functools.cache
def mlflow_head_revision() -> Optional[str]:
    """The schema revision the installed MLflow creates (None: cannot tell)."""
    spec = find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    revisions, parents = set[str](), set[str]()
    for path in glob.glob(os.path.join(root, "store", "db_migrations", "versions", "*.py")):
        with open(path) as f:
            for down, rev in _REVISION.findall(f.read()):
                (parents if down else revisions).add(rev)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def checked_revisions() -> Set[str]:
    with contextlib.suppress(OSError), open(CHECKED) as f:
        return {line.split("#")[0].strip() for line in f} - {""}
    return set()


def is_checked(path: str) -> bool:
    """The store exists, its schema is the installed MLflow's head, and the tests checked
    the rows on that revision (else MLflow's own client writes them)."""
    head, uri = mlflow_head_revision(), f"file:{path}?mode=ro"  # ro: nothing is created
    if head not in checked_revisions():
        return False
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return False
    return head is not None and row == (head,)


def ensure_store(path: str) -> None:
    """A missing store is created here, under its lock (one torchx process at a time), so
    no reader ever sees a half-made schema (MLflow creates one in place, without a lock)."""
    if os.path.exists(path):
        return
    try:
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:  # a read-only place: nobody can create a store there either
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.exists(path):
            create_store(path)
    finally:
        os.close(fd)


def create_store(path: str, head: Optional[str] = None) -> None:
    """Create the missing store ``path`` under its lock: built in a 0600 file beside it, then
    linked into place, so a reader (``mlflow ui``) sees no store or a whole one. From the
    snapshot if it is for the installed MLflow's head (or ``head``); else MLflow creates it."""
    head, snap = head or mlflow_head_revision(), {}
    with contextlib.suppress(OSError, ValueError), open(SNAPSHOT) as f:
        snap = json.load(f)
    fd, tmp = tempfile.mkstemp(".db", ".mlflow-", os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        if head and snap.get("head") == head:
            _replay(tmp, snap)
        else:
            create_with_mlflow(tmp)
        with contextlib.suppress(FileExistsError):  # made meanwhile by MLflow itself
            os.link(tmp, path)
    finally:
        for leftover in (tmp, tmp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def create_with_mlflow(path: str) -> None:
    """MLflow creates a store (tables, migrations, default experiment) at ``path``."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{path}")
    client.search_experiments()
    client._tracking_client.store.engine.dispose()  # nothing keeps the file open


def _replay(path: str, snap: Dict[str, Any]) -> None:
    """The snapshot into an empty file, as MLflow fills it from this directory now (the
    default experiment's artifacts in ``./mlruns/0``, created now)."""
    now, mlruns = now_ms(), os.path.abspath("mlruns")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN")
        for sql in snap["schema"]:
            db.execute(sql)
        for table, rows in snap["rows"].items():
            for row in rows:
                if table == "experiments":
                    row = {**row, "artifact_location": f"{mlruns}/{row['experiment_id']}"}
                    row.update(creation_time=now, last_update_time=now)
                cols, marks = ", ".join(f'"{c}"' for c in row), ", ".join("?" * len(row))
                db.execute(f'INSERT INTO "{table}" ({cols}) VALUES ({marks})', list(row.values()))
        db.execute("COMMIT")


class SqliteStore:
    """Experiments, runs, tags, params and metrics, written as MLflow's sqlalchemy store
    writes them; ``client()`` (a ``ClientStore``) creates an experiment elsewhere."""

    def __init__(self, path: str, client: Callable[[], Any]) -> None:
        self.path, self._client = path, client

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction (committed, or rolled back on error), closed."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            yield db

    def _one(self, sql: str, *args: Any) -> Any:
        """The first row of one statement, in a transaction of its own."""
        with self._db() as db:
            return db.execute(sql, args).fetchone()

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        """Found, or created as ``create_experiment`` with a local artifact location does;
        a deleted one is an error (MLflow refuses runs in it too)."""
        find = "SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ?"
        find += " AND workspace = 'default'"
        local, now = artifact_location and "://" not in artifact_location, now_ms()
        with self._db() as db:
            if name and local and not db.execute(find, (name,)).fetchone():
                db.execute(
                    "INSERT OR IGNORE INTO experiments (name, artifact_location, lifecycle_stage,"
                    " creation_time, last_update_time, workspace) VALUES (?, ?, 'active', ?, ?,"
                    " 'default')",
                    (name, os.path.abspath(f"{artifact_location}/{name}"), now, now),
                )
            row = db.execute(find, (name,)).fetchone()
        if row is not None and row[1] == "deleted":
            raise DeletedExperimentError(name, row[0])
        return str(row[0]) if row else str(self._client().experiment_id(name, artifact_location))

    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]:
        with self._db() as db:
            row = db.execute(_TAGGED + " LIMIT 1", (tag, value)).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def search_tagged(self, tag: str, value: str) -> List[TaggedRun]:
        """Every active run whose ``tag`` is ``value``, oldest first, with its metrics
        (MLflow's ``latest_metrics`` rows): two queries."""
        metrics = (
            "SELECT m.run_uuid, m.key, m.value FROM latest_metrics m JOIN tags t ON"
            " t.run_uuid = m.run_uuid WHERE t.key = ? AND t.value = ?"
        )
        with self._db() as db:
            runs = db.execute(_TAGGED, (tag, value)).fetchall()
            found: Dict[str, Dict[str, float]] = {str(r[0]): {} for r in runs}
            for run_id, key, v in db.execute(metrics, (tag, value)):
                found.get(run_id, {})[key] = float(v)
        return [TaggedRun(str(r), str(e), str(s), int(t or 0), found[r]) for r, e, s, t in runs]

    def tagged_runs(self, key: str, value: str, like: bool = False) -> Dict[str, Dict[str, str]]:
        """{run id: its tags} of each run whose tag ``key`` is ``value`` (``like``: a LIKE
        pattern), oldest first: the runs ``search_runs`` finds in the active experiments."""
        sql = (
            "SELECT r.run_uuid, a.key, a.value FROM runs r JOIN experiments e USING"
            " (experiment_id) JOIN tags t ON t.run_uuid = r.run_uuid JOIN tags a ON a.run_uuid"
            " = r.run_uuid WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'"
            f" AND t.key = ? AND t.value {'LIKE' if like else '='} ?"
            " ORDER BY r.start_time, r.run_uuid"
        )
        runs: Dict[str, Dict[str, str]] = {}
        with self._db() as db:
            for run_id, k, v in db.execute(sql, (key, value)):
                runs.setdefault(run_id, {})[k] = v
        return runs

    def runs_by_id(self, ids: Sequence[str], prefix: bool = False) -> Dict[str, Dict[str, str]]:
        """{run id: its tags} of the active runs among ``ids`` (``prefix``: whose id starts
        with one of them), oldest first."""
        runs: Dict[str, Dict[str, str]] = {}
        sql = (
            "SELECT r.run_uuid, t.key, t.value FROM runs r JOIN experiments e USING"
            " (experiment_id) LEFT JOIN tags t ON t.run_uuid = r.run_uuid WHERE"
            " r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active' AND"
            f" {'substr(r.run_uuid, 1, length(?)) = ?' if prefix else 'r.run_uuid = ?'}"
            " ORDER BY r.start_time"
        )
        with self._db() as db:
            for value in ids:
                for run_id, k, v in db.execute(sql, (value, value) if prefix else (value,)):
                    tags = runs.setdefault(run_id, {})
                    if k is not None:
                        tags[k] = v
        return runs

    def run_info(self, run_id: str) -> Optional[Tuple[str, str, str]]:
        """(experiment id, status, artifact URI); None: no such run."""
        row = self._one(
            "SELECT experiment_id, status, artifact_uri FROM runs WHERE run_uuid = ?", run_id
        )
        return (str(row[0]), str(row[1]), str(row[2])) if row else None

    def create_run(
        self, exp_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, str], start: int
    ) -> str:
        with self._db() as db:
            return self._insert_run(db, exp_id, name, tags, params, start)

    def create_tagged_run(
        self,
        exp_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start: int,
        key: str,
    ) -> str:
        """The run whose tag ``key`` is ``tags[key]``: found, else created, in one
        ``BEGIN IMMEDIATE`` transaction (one writer at a time: no two callers create it)."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(_TAGGED + " LIMIT 1", (key, tags[key])).fetchone()
                run_id = (
                    str(row[0]) if row else self._insert_run(db, exp_id, name, tags, params, start)
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        # one created by a writer without this lock (MLflow's own client) converges too
        return run_id if row else converge(self, key, tags[key], run_id)

    def _insert_run(
        self,
        db: sqlite3.Connection,
        exp_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start: int,
    ) -> str:
        run_id, exp = uuid.uuid4().hex, int(exp_id)
        find = "SELECT artifact_location FROM experiments WHERE experiment_id = ?"
        (location,) = db.execute(find, (exp,)).fetchone()
        db.execute(
            "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name,"
            " user_id, status, start_time, source_version, lifecycle_stage, artifact_uri,"
            " experiment_id) VALUES (?, ?, 'UNKNOWN', '', '', 'unknown', 'RUNNING', ?, '',"
            " 'active', ?, ?)",
            (run_id, name, start, f"{location}/{run_id}/artifacts", exp),
        )
        rows = [(k, v, run_id) for k, v in {**tags, "mlflow.runName": name}.items()]
        db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", rows)
        rows = [(k, v, run_id) for k, v in params.items()]
        db.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)", rows)
        return run_id

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        tag = "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)"
        self._one(tag, key, value, run_id)

    def log_metric_rows(self, run_id: str, metric_rows: Sequence[MetricRow]) -> None:
        """A row per metric, and the latest one per key: the greatest (step, time, value);
        all in one transaction."""
        rows = []
        for key, value, ts, step in metric_rows:  # NaN as 0 and is_nan, +-inf as +-max
            nan, value = math.isnan(float(value)), max(min(float(value), _MAX), -_MAX)
            rows.append((key, 0.0 if nan else value, ts, run_id, step, nan))
        cols = "(key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)"
        with self._db() as db:
            db.executemany(f"INSERT OR IGNORE INTO metrics {cols}", rows)
            db.executemany(
                f"INSERT INTO latest_metrics {cols} ON CONFLICT (key, run_uuid) DO UPDATE SET"
                " value = excluded.value, timestamp = excluded.timestamp, step = excluded.step,"
                " is_nan = excluded.is_nan WHERE (excluded.step, excluded.timestamp,"
                " excluded.value) > (step, timestamp, value)",
                rows,
            )

    def latest_metrics(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest:
        """``{key: (value, timestamp ms)}``: each key's newest by time, in one query (steps go
        back on a resume); ``by_time=()``: MLflow's ``latest_metrics`` rows (highest step's)."""
        sql = (
            "SELECT key, value, timestamp FROM (SELECT key, value, timestamp, ROW_NUMBER()"
            " OVER (PARTITION BY key ORDER BY timestamp DESC, step DESC, value DESC) AS n"
            " FROM metrics WHERE run_uuid = ?) WHERE n = 1"
        )
        if by_time is not None and not tuple(by_time):
            sql = "SELECT key, value, timestamp FROM latest_metrics WHERE run_uuid = ?"
        with self._db() as db:
            return {k: (float(v), int(t)) for k, v, t in db.execute(sql, (run_id,))}

    def run_tags(self, run_id: str) -> Dict[str, str]:
        with self._db() as db:
            return dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)))

    def log_dataset(self, run_id: str, dataset: Tuple[str, str, str, str], context: str) -> None:
        """A run's input ``(name, digest, source type, source)`` as MLflow's ``log_inputs``
        writes it: one dataset per experiment, name and digest; one edge per run."""
        edge, cols = uuid.uuid4().hex, "name, digest, dataset_source_type, dataset_source"
        with self._db() as db:
            db.execute(
                f"INSERT OR IGNORE INTO datasets (dataset_uuid, experiment_id, {cols}) SELECT ?,"
                " experiment_id, ?, ?, ?, ? FROM runs WHERE run_uuid = ?",
                (uuid.uuid4().hex, *dataset, run_id),
            )
            if db.execute(
                "INSERT OR IGNORE INTO inputs (input_uuid, source_type, source_id,"
                " destination_type, destination_id) SELECT ?, 'DATASET', dataset_uuid, 'RUN',"
                " run_uuid FROM runs JOIN datasets USING (experiment_id) WHERE run_uuid = ?"
                " AND datasets.name = ? AND digest = ?",
                (edge, run_id, *dataset[:2]),
            ).rowcount:
                tag = "INSERT INTO input_tags (input_uuid, name, value) VALUES (?, ?, ?)"
                db.execute(tag, (edge, "mlflow.data.context", context))

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        end = "UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?"
        with self._db() as db:
            ended = db.execute(end, (status, end_ms or now_ms(), run_id)).rowcount
        if not ended:
            logger.warning("could not end run %s in sqlite:///%s: no such run", run_id, self.path)

    def delete_run(self, run_id: str) -> None:
        """As MLflow's ``delete_run``: lifecycle stage ``deleted``, with its time."""
        delete = "UPDATE runs SET lifecycle_stage = 'deleted', deleted_time = ? WHERE run_uuid = ?"
        self._one(delete, now_ms(), run_id)


def now_ms() -> int:
    return int(time.time() * 1000)
