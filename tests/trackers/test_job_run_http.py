"""The job's run over http: one real ``mlflow server`` (tests/trackers/conftest.py), real
local_cwd jobs.

The Runner opens and ends runs with REST calls (no ``import mlflow`` in the submitter);
ranks record into the same run by ``MLFLOW_RUN_ID``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from tests.mlflow_server import free_port
from torchx import specs
from torchx.pipelines.core import open_pipeline_run
from torchx.runner import get_runner
from torchx.trackers.api import TrackerConfigError, build_trackers

USER_MLFLOW = (
    "import mlflow; mlflow.start_run(); mlflow.log_metric('m', 1);"
    " from torchx.tracker import app_run_from_env as r; r().add_metadata(stage='s');"
    " mlflow.end_run()"
)


@pytest.fixture()
def url(mlflow_http_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    server = mlflow_http_server
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return server


def job_runs(uri: str, handle: str) -> List[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(exps, filter_string=f"tags.`torchx.job_id` = '{handle}'"))


def the_run(uri: str, handle: str) -> Any:
    runs = job_runs(uri, handle)
    assert len(runs) == 1, f"runs of {handle}: {runs}"
    return runs[0]


def test_the_run_exists_when_submit_returns_and_ends_killed_on_cancel(url: str) -> None:
    with get_runner() as runner:
        handle = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd", run_name="long")
        assert the_run(url, handle).info.status == "RUNNING"
        runner.cancel(handle)
    run = the_run(url, handle)
    assert run.info.status == "KILLED" and run.info.run_name == "long"
    assert run.data.params["component"] == "utils.sh"
    tracker = build_trackers({"mlflow": url})[0]
    assert tracker.run_url(handle) == (
        f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    )


def test_submitting_and_waiting_never_imports_mlflow_nor_prints(url: str) -> None:
    code = (
        "import sys; from torchx.runner import get_runner\n"
        "with get_runner() as r:\n"
        "    h = r.run_component('utils.sh', ['true'], 'local_cwd')\n"
        "    r.wait(h, wait_interval=1, timeout=120)\n"
        "print(h, 'mlflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    handle, imported = out.stdout.split()  # no "View run ..." line on stdout
    assert imported == "False", out.stderr
    assert the_run(url, handle).info.status == "FINISHED"


def test_user_mlflow_code_lands_in_the_job_run_under_the_pipeline_run(url: str) -> None:
    open_pipeline_run("prefect://flow/run-7", {"mlflow": url})
    parent = build_trackers({"mlflow": url})[0]
    parent_id = parent.mlflow_run_id("prefect://flow/run-7")  # type: ignore[attr-defined]
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.python", ["--c", USER_MLFLOW], "local_cwd", parent_run_id="prefect://flow/run-7"
        )
        status = runner.wait(handle, wait_interval=1, timeout=240)
        assert status.state == specs.AppState.SUCCEEDED, status
    run = the_run(url, handle)
    metrics = dict(run.data.metrics)  # the user's, and torchx's resource-hours at the end
    assert metrics.pop("cpu_hours") > 0 and metrics.pop("gpu_hours") == 0
    assert metrics == {"m": 1.0} and run.data.tags["stage"] == "s"
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.info.status == "FINISHED"


def test_a_rank_records_tags_and_metrics_without_importing_mlflow(url: str, tmp_path: Path) -> None:
    code = (
        "import sys; from torchx.tracker import app_run_from_env as r; "
        "r().add_metadata(stage='s'); r().log_metrics({'m': 2.0}, step=3); "
        f"open({str(tmp_path / 'imported')!r}, 'w').write(str('mlflow' in sys.modules))"
    )
    with get_runner() as runner:
        h = runner.run(
            specs.AppDef("srv", [specs.Role("w", ".", entrypoint="python", args=["-c", code])]),
            "local_cwd",
        )
        assert runner.wait(h, timeout=120).state == specs.AppState.SUCCEEDED
    run = the_run(url, h)
    assert run.data.tags["stage"] == "s" and run.data.metrics["m"] == 2.0
    assert run.info.status == "FINISHED"
    assert (tmp_path / "imported").read_text() == "False"


def test_a_server_gone_at_submit_is_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"TORCHX_TRACKERS": "mlflow", "TORCHX_TRACKER_MLFLOW_CONFIG": dead}
    out = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh", "echo", "hi"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**__import__("os").environ, **env, "TORCHX_HOME": str(tmp_path / "h")},
    )  # fmt: skip
    assert out.returncode == 1 and "hi" not in out.stdout
    assert out.stderr.count("\n") == 1 and dead in out.stderr, out.stderr


@pytest.mark.parametrize("path", ["sqlite", "rest", "mlflow_client"])
def test_a_deleted_experiment_takes_no_runs_and_says_what_to_do(
    tmp_path: Path, mlflow_http_server: str, path: str
) -> None:
    """Its runs would be hidden, and destroyed by ``mlflow gc``: an error naming it, through
    the sqlite store, REST and the MlflowClient fallback alike. A store that cached its id
    looks it up again once a run cannot be created in it."""
    from mlflow import MlflowClient

    from torchx.trackers.mlflow_backend import MLflowTracker
    from torchx.trackers.mlflow_store import ClientStore

    uri = mlflow_http_server if path == "rest" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(tracking_uri=uri)
    store = ClientStore(lambda: tracker.client) if path == "mlflow_client" else tracker.store
    name = f"gone-{tmp_path.name}"
    exp_id = store.experiment_id(name)
    store.create_run(exp_id, "before", {}, {}, 1)
    MlflowClient(uri).delete_experiment(exp_id)
    with pytest.raises(TrackerConfigError):  # ours, or the server's refusal
        store.create_run(store.experiment_id(name), "after", {}, {}, 2)
    for fresh in (store, MLflowTracker(tracking_uri=uri).store):
        with pytest.raises(TrackerConfigError) as e:
            fresh.experiment_id(name)
        assert str(e.value) == (
            f"the MLflow experiment '{name}' (id {exp_id}) is deleted; restore it (mlflow"
            f" experiments restore --experiment-id {exp_id}) or set another experiment name"
            " (experiment_name in the tracker config, or $TORCHX_TRACKING_EXPERIMENT_NAME)"
        )
    runs = MlflowClient(uri).search_runs([exp_id], run_view_type=3)  # ViewType.ALL
    assert [r.info.run_name for r in runs] == ["before"]
