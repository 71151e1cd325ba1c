"""A migrated Airflow metadata database (sqlite) for each test session and deployment, copied
from a template that ``airflow db migrate`` made once per Airflow version: each migration
costs 3-4 s of CPU, and a run made five. The template lives with pytest's cache
(``.pytest_cache``; ``pytest --cache-clear`` removes it)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / ".pytest_cache" / "torchx-templates"


def copy_migrated_db(target: Path) -> None:
    """``target``: a new copy of a migrated sqlite metadata database of this Airflow."""
    TEMPLATES.mkdir(parents=True, exist_ok=True)
    template = TEMPLATES / f"airflow-{version('apache-airflow')}.db"
    with open(TEMPLATES / "airflow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel workers: one migrates, the others wait
        if not template.exists():
            made = TEMPLATES / f".airflow-{os.getpid()}.db"
            env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
            env.update(
                AIRFLOW_HOME=str(TEMPLATES / f".airflow-home-{os.getpid()}"),
                AIRFLOW__CORE__LOAD_EXAMPLES="False",
                AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{made}",
            )
            airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
            migrate = [airflow, "db", "migrate"]
            subprocess.run(migrate, env=env, check=True, capture_output=True, timeout=300)
            os.replace(made, template)  # whole, or not at all
            shutil.rmtree(env["AIRFLOW_HOME"], ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, target)
