"""Write ``torchx/trackers/mlflow_schema.json``: what the installed MLflow creates for a new
sqlite store (its schema and rows), so torchx creates new stores without ``import mlflow``
and its migrations (seconds of CPU). Run it after changing the pinned MLflow:

    .venv/bin/python scripts/mlflow_schema.py

torchx uses the snapshot only while the installed MLflow's schema head is the snapshot's;
for another head, MLflow creates the store (seconds). ``tests/trackers/test_mlflow_store.py``
checks that a store made from it is what the installed MLflow creates. (MLflow's own
migrations order some table constraints and indexes differently from one run to the next,
so a regenerated file may differ from the last one in that order only.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchx.trackers.mlflow_sqlite import SNAPSHOT, create_with_mlflow  # noqa: E402


def snapshot(path: str) -> Dict[str, Any]:
    """The schema (``sqlite_master``'s SQL in creation order) and the rows of a store."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    master = "SELECT sql, type, name FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
    objects = db.execute(master).fetchall()
    rows = {
        name: [dict(r) for r in db.execute(f'SELECT * FROM "{name}"')]
        for _, kind, name in objects
        if kind == "table"
    }
    (head,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    db.close()
    schema = [sql for sql, _, _ in objects]
    return {"head": head, "schema": schema, "rows": {k: v for k, v in rows.items() if v}}


def main() -> None:
    import mlflow

    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        create_with_mlflow(os.path.join(work, "mlflow.db"))
        snap = snapshot(os.path.join(work, "mlflow.db"))
    for row in snap["rows"].get("experiments", []):  # set when a store is made
        row.update(artifact_location=None, creation_time=None, last_update_time=None)
    snap["mlflow"] = mlflow.__version__
    Path(SNAPSHOT).write_text(json.dumps(snap, indent=1) + "\n")
    print(f"{SNAPSHOT}: MLflow {snap['mlflow']}, head {snap['head']}")


if __name__ == "__main__":
    main()
