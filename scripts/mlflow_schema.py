"""Write ``torchx/trackers/mlflow_schema.json``: what the installed MLflow creates for a new
sqlite store (its schema and rows), so torchx creates new stores without ``import mlflow``
and its migrations (seconds of CPU). Run it after changing the pinned MLflow:

    .venv/bin/python scripts/mlflow_schema.py

torchx uses the snapshot only while the installed MLflow's schema head is the snapshot's;
for another head, MLflow creates the store and torchx caches its snapshot under
``$TORCHX_HOME/mlflow``. ``tests/trackers/test_mlflow_store.py`` checks the two agree.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchx.trackers.mlflow_sqlite import SNAPSHOT, create_with_mlflow, snapshot  # noqa: E402


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
