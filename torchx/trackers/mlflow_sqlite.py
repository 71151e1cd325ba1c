"""The Runner's MLflow calls on a sqlite store: a few rows with ``sqlite3``, no ``import mlflow``.

Only on a store whose schema revision is the installed MLflow's head (read from its
migration scripts, not imported): rows as MLflow's own store writes them (``runs``,
``tags``, ``params``). A new or older store is first created or migrated by MlflowClient.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sqlite3
import time
import uuid
from importlib.util import find_spec
from typing import Any, Callable, Mapping, Optional, Set, Tuple

_REVISION = re.compile(r'^(down_)?revision\s*=\s*"([0-9a-f]+)"', re.M)


@functools.cache
def mlflow_head_revision() -> Optional[str]:
    """The schema revision the installed MLflow creates (None: cannot tell)."""
    spec = find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    revisions: Set[str] = set()
    parents: Set[str] = set()
    for path in glob.glob(os.path.join(root, "store", "db_migrations", "versions", "*.py")):
        with open(path) as f:
            for down, rev in _REVISION.findall(f.read()):
                (parents if down else revisions).add(rev)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def is_current(path: str) -> bool:
    """The store exists and its schema is the installed MLflow's head."""
    if not os.path.isfile(path) or mlflow_head_revision() is None:
        return False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == mlflow_head_revision()


class SqliteStore:
    def __init__(self, path: str, client: Callable[[], Any]) -> None:
        self.path, self._client = path, client  # client(): MLflowTracker, for the rest

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        with self._db() as db:
            row = db.execute(
                "SELECT experiment_id FROM experiments WHERE name = ? AND workspace = 'default'"
                " AND lifecycle_stage = 'active'",
                (name,),
            ).fetchone()
        return str(row[0]) if row else str(self._client().experiment_id(name, artifact_location))

    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]:
        with self._db() as db:
            row = db.execute(
                "SELECT r.run_uuid, r.experiment_id FROM tags t JOIN runs r USING (run_uuid)"
                " WHERE t.key = ? AND t.value = ? AND r.lifecycle_stage = 'active'"
                " ORDER BY r.start_time LIMIT 1",
                (tag, value),
            ).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def run_experiment(self, run_id: str) -> str:
        with self._db() as db:
            row = db.execute("SELECT experiment_id FROM runs WHERE run_uuid = ?", (run_id,))
            return str(row.fetchone()[0])

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start_ms: int,
    ) -> str:
        run_id = uuid.uuid4().hex
        with self._db() as db:
            (location,) = db.execute(
                "SELECT artifact_location FROM experiments WHERE experiment_id = ?",
                (int(experiment_id),),
            ).fetchone()
            db.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name,"
                " user_id, status, start_time, source_version, lifecycle_stage, artifact_uri,"
                " experiment_id) VALUES (?, ?, 'UNKNOWN', '', '', 'unknown', 'RUNNING', ?, '',"
                " 'active', ?, ?)",
                (run_id, name, start_ms, f"{location}/{run_id}/artifacts", int(experiment_id)),
            )
            rows = [(k, v, run_id) for k, v in {**tags, "mlflow.runName": name}.items()]
            db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", rows)
            rows = [(k, v, run_id) for k, v in params.items()]
            db.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)", rows)
        return run_id

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                (key, value, run_id),
            )

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], ts: int, step: int) -> None:
        rows = [(k, float(v), ts, step, run_id) for k, v in metrics.items()]
        with self._db() as db:  # latest_metrics keeps the greatest (step, timestamp, value)
            db.executemany(
                "INSERT OR IGNORE INTO metrics (key, value, timestamp, step, run_uuid, is_nan)"
                " VALUES (?, ?, ?, ?, ?, 0)",
                rows,
            )
            db.executemany(
                "INSERT INTO latest_metrics (key, value, timestamp, step, run_uuid, is_nan)"
                " VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (key, run_uuid) DO UPDATE SET"
                " value = excluded.value, timestamp = excluded.timestamp, step = excluded.step,"
                " is_nan = 0 WHERE (excluded.step, excluded.timestamp, excluded.value)"
                " > (step, timestamp, value)",
                rows,
            )

    def has_metric(self, run_id: str, key: str) -> bool:
        with self._db() as db:
            sql = "SELECT 1 FROM latest_metrics WHERE run_uuid = ? AND key = ?"
            return db.execute(sql, (run_id, key)).fetchone() is not None

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?",
                (status, end_ms or int(time.time() * 1000), run_id),
            )
