"""The process Airflow's listener starts to cancel what it recorded, so that no cancel
runs in Airflow's own loops (see ``torchx.pipelines.airflow.listener``).

It is detached (its own session, reaped by init) so nothing in Airflow waits for it. It
imports no Airflow unless it must read the ``torchx_default`` Connection: a task process's
environment cannot configure Airflow's database, so a task hands it its settings.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from typing import Any, List, Optional

from torchx.pipelines.owner import Owner, is_airflow_task
from torchx.pipelines.settings import TorchXSettings
from torchx.specs.errors import backend_errors

logger = logging.getLogger("torchx.pipelines.airflow.listener")  # the listener's lines


@dataclass(frozen=True)
class Reapable:
    """A task instance that ended (failed, or killed: ``on_kill``) and the job it pushed."""

    handle: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str

    def what(self) -> str:
        return f"task {self.dag_id}.{self.task_id} (run {self.run_id}, map {self.map_index})"

    def is_owner(self, owner: Owner) -> bool:
        return is_airflow_task(owner, self.dag_id, self.run_id, self.task_id, self.map_index)


def start(found: List[Reapable], settings: Optional[TorchXSettings] = None) -> None:
    """Start the process that cancels ``found`` (see the module doc). ``settings``: a task
    process's operator's; its log then goes nowhere, as Airflow's supervisor would wait
    for it to close the task's log pipes."""
    fd, path = tempfile.mkstemp(prefix="torchx-reap-", suffix=".json")  # 0600
    with os.fdopen(fd, "w") as f:
        given = asdict(settings) if settings is not None else None
        json.dump({"settings": given, "found": [asdict(r) for r in found]}, f)
    command = [sys.executable, "-m", "torchx.pipelines.airflow.reaper", path]
    out = subprocess.DEVNULL if settings is not None else None
    sh = subprocess.Popen(
        ["/bin/sh", "-c", '"$@" </dev/null &', "sh", *command],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )
    # sh exits once it has started the process: a thread collects it, so that the
    # caller's loop does not wait on a busy machine for sh to be scheduled
    threading.Thread(target=sh.wait, name="torchx-reaper-start", daemon=True).start()


def reap_recorded(runner: Any, found: List[Reapable]) -> List[str]:
    """Cancel the jobs of ``found`` that the shared decision allows; their handles."""
    from torchx.pipelines.reap import cancel_if_owned

    cancelled = []
    for r in found:
        try:
            owned = cancel_if_owned(
                runner, r.handle, r.is_owner, r.what(), f"ended {r.state}", logger
            )
        except backend_errors():  # one job's failure stops no other's cancel; reap retries
            logger.exception("torchx: could not cancel the job of %s", r.what())
            continue
        if owned:
            cancelled.append(r.handle)
    return cancelled


def main(argv: List[str]) -> int:
    """``python -m torchx.pipelines.airflow.reaper <records file>``: the started process."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logger.setLevel(logging.INFO)
    with open(argv[1]) as f:
        doc = json.load(f)
    os.unlink(argv[1])
    found = [Reapable(**r) for r in doc["found"]]
    given = doc.get("settings")
    if given is not None:
        runner = TorchXSettings(**given).runner()
    else:  # started by the scheduler or the api-server: Airflow's database is readable
        from torchx.pipelines.airflow.hook import TorchXHook

        runner = TorchXHook().runner()
    with runner:
        reap_recorded(runner, found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
