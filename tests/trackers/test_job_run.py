"""The job's run on the embedded sqlite store: real MLflow, real local_cwd jobs, real CLI.

The Runner opens the run before it submits the job (so it is there when submit returns)
and ends it in-process when it sees the app end, so every check reads at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pydantic
import pytest

from tests.polling import poll_until
from torchx import specs
from torchx.pipelines.core import open_pipeline_run, submit_or_attach
from torchx.pipelines.kfp.launch import launch
from torchx.runner import get_runner
from torchx.runner.tracking import redact_args
from torchx.schedulers import get_scheduler_factories
from torchx.specs.api import parse_app_handle
from torchx.specs.states import is_terminal
from torchx.trackers.mlflow_backend import MLflowTracker

SECRET = "s3cr3t-value-4711"
TAIL = "t4il-of-the-s3cr3t-9931"  # after a comma in the same env value
USER_MLFLOW = (
    "import mlflow; mlflow.start_run(); mlflow.log_metric('m', 1);"
    " from torchx.tracker import app_run_from_env as r; r().add_metadata(stage='s');"
    " mlflow.end_run()"
)


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return uri


def job_runs(uri: str, handle: str = "") -> List[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    flt = f"tags.`torchx.job_id` = '{handle}'" if handle else ""
    return list(client.search_runs(exps, filter_string=flt, max_results=1000))


def the_run(uri: str, handle: str) -> Any:
    runs = job_runs(uri, handle)
    assert len(runs) == 1, f"runs of {handle}: {runs}"
    return runs[0]


def test_a_job_that_never_calls_the_tracker_gets_one_finished_run(store: str) -> None:
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.sh",
            ["echo", "hi"],
            "local_cwd",
            run_name="prep",
            run_params={"dag_id": "d1", "epochs": 3},
        )
        assert the_run(store, handle).info.status == "RUNNING"  # there when submit returns
        assert runner.wait(handle, wait_interval=1, timeout=120).state == specs.AppState.SUCCEEDED
    run = the_run(store, handle)
    assert run.info.status == "FINISHED" and run.info.run_name == "prep"
    assert run.data.params == {
        "dag_id": "d1",
        "epochs": "3",
        "component": "utils.sh",
        "args": "echo hi",
        "scheduler": "local_cwd",
        "cfg": "{}",
        "resources.sh.replicas": "1",
        "resources.sh.cpu": "1",
        "resources.sh.memMB": "1024",
        "resources.sh.gpu": "0",
    }
    assert run.info.start_time <= run.info.end_time


def test_a_failing_job_ends_failed_and_a_cancelled_one_killed(store: str) -> None:
    with get_runner() as runner:
        failing = runner.run_component("utils.sh", ["exit", "3"], "local_cwd")
        sleeping = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd")
        assert runner.wait(failing, wait_interval=1, timeout=120).state == specs.AppState.FAILED
        runner.cancel(sleeping)
    assert the_run(store, failing).info.status == "FAILED"
    run = the_run(store, sleeping)
    assert run.info.status == "KILLED" and run.info.run_name == "sh"


def test_on_a_current_store_submit_and_wait_never_import_mlflow(store: str) -> None:
    """The first job creates the store and its experiment (MlflowClient); the next ones
    open and end their runs with a few SQL rows."""
    with get_runner() as runner:
        runner.wait(runner.run_component("utils.sh", ["true"], "local_cwd"), timeout=120)
    code = (
        "import sys; from torchx.runner import get_runner\n"
        "with get_runner() as r:\n"
        "    h = r.run_component('utils.sh', ['true'], 'local_cwd')\n"
        "    r.wait(h, wait_interval=1, timeout=120)\n"
        "print(h, 'mlflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    handle, imported = out.stdout.split()
    assert imported == "False", out.stderr
    run = the_run(store, handle)
    assert run.info.status == "FINISHED" and run.data.params["component"] == "utils.sh"
    assert run.info.artifact_uri.endswith(f"/{run.info.run_id}/artifacts")


def test_another_runner_ends_the_run_by_the_id_in_the_apps_env(store: str) -> None:
    with get_runner() as submitter:
        handle = submitter.run_component("utils.sh", ["true"], "local_cwd")
    with get_runner() as watcher:  # e.g. `torchx status` in another process
        assert watcher.wait(handle, wait_interval=1, timeout=120).state == specs.AppState.SUCCEEDED
    assert the_run(store, handle).info.status == "FINISHED"


def _ended(handle: str) -> specs.AppState:
    """The app's end, as its scheduler sees it (no Runner looks at it)."""
    _, session, app_id = parse_app_handle(handle)
    sched = get_scheduler_factories()["local_cwd"](session)
    desc = poll_until(lambda: sched.describe(app_id), lambda d: d is None or is_terminal(d.state))
    assert desc is not None
    return desc.state


SUBMIT_KEYED = (
    "import sys; from torchx.runner import get_runner\n"
    "with get_runner() as r:\n"
    "    print(r.run_component('utils.sh', sys.argv[1:], 'local_cwd', idempotency_key='k'))\n"
)


def _submit_and_die(*args: str) -> str:
    """A keyed submit from a process that ends before its app (its waiter died)."""
    cmd = [sys.executable, "-c", SUBMIT_KEYED, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_retry_ends_the_runs_of_its_keys_ended_apps_whose_waiters_died(store: str) -> None:
    """Apps of the key that a retry does not re-attach to (FAILED; SUCCEEDED without
    reattach_succeeded) and nobody saw end: the retry ends their runs."""
    failed = _submit_and_die("exit", "3")
    assert _ended(failed) == specs.AppState.FAILED
    assert the_run(store, failed).info.status == "RUNNING"
    succeeded = _submit_and_die("true")  # a retry: the FAILED app is not re-attached
    assert succeeded != failed
    assert the_run(store, failed).info.status == "FAILED"
    assert _ended(succeeded) == specs.AppState.SUCCEEDED
    with get_runner() as third:
        third_try = third.run_component("utils.sh", ["true"], "local_cwd", idempotency_key="k")
        assert third_try not in (failed, succeeded)
        third.wait(third_try, wait_interval=1, timeout=120)
    assert the_run(store, succeeded).info.status == "FINISHED"
    assert the_run(store, third_try).info.status == "FINISHED"


def test_a_tracked_keyed_retry_in_the_same_process_submits_at_once(store: str) -> None:
    """A Prefect task retried in its flow-run process: the first try's app FAILED and its
    submitter is alive. The key's claim names the app that was launched (the request
    made again with the run's env has a new app id), so the retry sees that app ended and
    launches; it used to wait 120 s for an app that never existed, then fail."""
    with get_runner() as runner:
        first = runner.run_component("utils.sh", ["exit", "3"], "local_cwd", idempotency_key="k")
        assert runner.wait(first, wait_interval=0.1, timeout=60).state == specs.AppState.FAILED
        claims = Path(os.environ["TORCHX_HOME"]).glob("local_cwd/torchx/.tokens/*/.claim.*")
        named = {json.loads(c.read_text())["app_id"] for c in claims if c.suffix != ".void"}
        assert named == {parse_app_handle(first).app_id}
        retry = runner.run_component("utils.sh", ["true"], "local_cwd", idempotency_key="k")
        assert retry != first
        assert runner.wait(retry, wait_interval=0.1, timeout=60).state == specs.AppState.SUCCEEDED
    assert the_run(store, first).info.status == "FAILED"
    assert the_run(store, retry).info.status == "FINISHED"


def test_a_request_that_fails_with_the_runs_env_ends_the_opened_run(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is made again with the run's id in every role's env; if that fails,
    nothing is submitted and the opened run ends FAILED (not RUNNING forever)."""
    from torchx.schedulers.local.scheduler import LocalScheduler

    real = LocalScheduler.submit_dryrun

    def refuses_the_runs_env(self: Any, app: specs.AppDef, cfg: Any) -> Any:
        if "MLFLOW_RUN_ID" in app.roles[0].env:
            raise ValueError("env refused")
        return real(self, app, cfg)

    monkeypatch.setattr(LocalScheduler, "submit_dryrun", refuses_the_runs_env)
    with get_runner() as runner, pytest.raises(ValueError, match="env refused"):
        runner.run_component("utils.sh", ["true"], "local_cwd")
    (run,) = job_runs(store)
    assert run.info.status == "FAILED" and run.info.end_time


@pytest.mark.parametrize("config", ["relative", "unset", "file"])
def test_the_run_is_ended_in_the_jobs_store_not_the_looking_processs(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str
) -> None:
    """The submitter's store is a relative ``sqlite:///mlflow.db`` (or none configured:
    its $MLFLOW_TRACKING_URI; or a config file naming a relative one); `torchx status` runs
    elsewhere (another cwd, another $MLFLOW_TRACKING_URI): it ends the run in the job's store."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv("TORCHX_TRACKER_MLFLOW_CONFIG")
    if config == "relative":
        monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", "sqlite:///mlflow.db")
    elif config == "unset":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{here / 'mlflow.db'}")
    else:
        (here / "tracker.conf").write_text("tracking_uri = sqlite:///mlflow.db\n")
        monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", "tracker.conf")
    with get_runner() as submitter:  # detached: it does not wait
        handle = submitter.run_component("utils.sh", ["true"], "local_cwd")
    jobs_store = f"sqlite:///{here / 'mlflow.db'}"
    assert the_run(jobs_store, handle).info.status == "RUNNING"
    assert _ended(handle) == specs.AppState.SUCCEEDED
    monkeypatch.chdir(there)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{there / 'mlflow.db'}")
    with get_runner() as looker:
        looker.status(handle)
    assert the_run(jobs_store, handle).info.status == "FINISHED"
    assert not (there / "mlflow.db").exists()


def test_ending_a_run_the_sqlite_store_does_not_have_is_one_warning(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:

    job_runs(store)  # a whole store
    missing = "0" * 32
    MLflowTracker(tracking_uri=store).store.terminate(missing, "FINISHED")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"could not end run {missing} in {store}: no such run"]


def test_user_mlflow_code_and_torchx_api_land_in_the_job_run_under_the_pipeline(
    store: str,
) -> None:
    open_pipeline_run("airflow://dag/run-1", {"mlflow": store})
    parent = MLflowTracker(tracking_uri=store)
    parent_id = parent.mlflow_run_id("airflow://dag/run-1")
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.python",
            ["--c", USER_MLFLOW],
            "local_cwd",
            parent_run_id="airflow://dag/run-1",
            run_name="train-stage",
        )
        status = runner.wait(handle, wait_interval=1, timeout=240)
        assert status.state == specs.AppState.SUCCEEDED, status
    run = the_run(store, handle)
    metrics = dict(run.data.metrics)  # the user's, and torchx's resource-hours at the end
    assert metrics.pop("cpu_hours") > 0 and metrics.pop("gpu_hours") == 0
    assert metrics == {"m": 1.0} and run.data.tags["stage"] == "s"
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.data.tags["torchx.parent_run_id"] == "airflow://dag/run-1"
    assert run.info.status == "FINISHED" and len(job_runs(store)) == 2  # no stray user run
    assert list(parent.run_ids(parent_run_id="airflow://dag/run-1")) == [handle]


READER = """
import os, sys, time
from mlflow import MlflowClient
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
print(len(MlflowClient("sqlite:///" + sys.argv[1]).search_experiments()))
"""


def test_a_new_store_read_at_once_after_each_submit_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    """A reader (``mlflow ui``) that opens the store the moment its file appears, while the
    submit creates it, and one after the submit returns, both find a whole store."""
    from mlflow import MlflowClient

    for i in range(5):
        path = tmp_path / f"new{i}.db"
        uri = f"sqlite:///{path}"
        monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
            with get_runner() as runner:
                handle = runner.run_component("utils.sh", ["echo", str(i)], "local_cwd")
                assert MlflowClient(uri).search_experiments()  # what `mlflow ui` does first
                assert the_run(uri, handle).info.status == "RUNNING"
                runner.wait(handle, wait_interval=1, timeout=120)
            out, _ = reader.communicate(timeout=120)
        finally:
            reader.kill()
        assert reader.returncode == 0 and int(out) >= 1, out
        assert the_run(uri, handle).info.status == "FINISHED"


def test_thirty_concurrent_jobs_on_a_new_store(store: str) -> None:
    with get_runner() as runner:

        def one(i: int) -> str:
            handle = runner.run_component("utils.sh", ["echo", str(i)], "local_cwd")
            runner.wait(handle, wait_interval=1, timeout=300)
            return handle

        with concurrent.futures.ThreadPoolExecutor(30) as pool:
            handles = list(pool.map(one, range(30)))
    runs = job_runs(store)
    assert sorted(r.data.tags["torchx.job_id"] for r in runs) == sorted(handles)
    assert {r.info.status for r in runs} == {"FINISHED"}


def _no_secret_anywhere(store_dir: Path) -> None:
    for path in store_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
            assert TAIL.encode() not in path.read_bytes(), path


def test_env_values_reach_no_tracker_on_the_sdk_pipeline_and_cli_paths(
    store: str, tmp_path: Path
) -> None:
    with get_runner() as runner:
        sdk = runner.run_component(
            "utils.sh", ["--env", f"AWS_SECRET_ACCESS_KEY={SECRET}", "true"], "local_cwd"
        )
        as_dict = runner.run_component(
            "utils.sh",
            {"env": {"AWS_SECRET_ACCESS_KEY": SECRET}, "args": ["true"]},
            "local_cwd",
        )
        pipeline = submit_or_attach(
            runner,
            "utils.sh",
            [f"--env=AWS_SECRET_ACCESS_KEY={SECRET}", "true"],
            "local_cwd",
            {},
            key="k1",
            run_name="stage",
        )
        comma = runner.run_component(  # the value is "s3cr3t...,t4il...", one value
            "utils.sh", ["--env", f"AWS_SECRET_ACCESS_KEY={SECRET},{TAIL}", "true"], "local_cwd"
        )
        for h in (sdk, as_dict, pipeline, comma):
            runner.wait(h, wait_interval=1, timeout=120)
    kfp, _ = launch("utils.sh", ["--env", f"HF_TOKEN={SECRET},{TAIL}", "true"])
    cli = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh",
         "--env", f"AWS_SECRET_ACCESS_KEY={SECRET}", "true"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    runs = job_runs(store)
    assert len(runs) == 6 and {r.info.status for r in runs} == {"FINISHED"}
    by_handle: Dict[str, Any] = {r.data.tags["torchx.job_id"]: r for r in runs}
    assert "AWS_SECRET_ACCESS_KEY=***" in by_handle[sdk].data.params["args"]
    assert '"AWS_SECRET_ACCESS_KEY": "***"' in by_handle[as_dict].data.params["args"]
    args = by_handle[comma].data.params["args"]
    assert args == "--env 'AWS_SECRET_ACCESS_KEY=***' true"
    assert redact_args([f"--env={SECRET}", "true"]) == ["--env=***", "true"]  # no K=V
    kfp_args = by_handle[kfp].data.params["kfp.component_args"]
    assert kfp_args == '["--env", "HF_TOKEN=***", "true"]'
    cli_run = by_handle[cli.stdout.split()[0]]
    assert cli_run.data.params["component"] == "utils.sh"  # the name given, not "sh"
    _no_secret_anywhere(tmp_path / "store")


@dataclasses.dataclass
class _Creds:
    dsn: str
    host: str


class _Settings(pydantic.BaseModel):  # a pydantic flow parameter, as Prefect passes it
    api_key: str
    host: str


def test_orchestrator_params_under_sensitive_names_are_redacted(store: str) -> None:
    """Airflow conf, Prefect flow parameters and any caller's ``run_params`` pass one rule:
    a value under a name Airflow treats as sensitive is never recorded."""
    params = {
        "prefect.param.hf_token": SECRET,
        "prefect.param.config": {"db": {"Password": SECRET, "host": "h"}, "lr": [0.1]},
        "prefect.param.apiToken": SECRET,
        "prefect.param.HFToken": SECRET,
        "prefect.param.slack-webhook-url": SECRET,
        "prefect.param.db": _Creds(dsn=SECRET, host="h"),
        "prefect.param.settings": _Settings(api_key=SECRET, host="h"),
        "prefect.param.tokenizer": "bert",  # "token" counts only as a word
        "prefect.param.max_tokens": 512,
        "prefect.param.epochs": 3,
    }
    with get_runner() as runner:
        handle = runner.run_component("utils.sh", ["true"], "local_cwd", run_params=params)
        runner.wait(handle, wait_interval=0.2, timeout=120)
    recorded = the_run(store, handle).data.params
    assert recorded["prefect.param.hf_token"] == "***"
    config = json.loads(recorded["prefect.param.config"])
    assert config == {"db": {"Password": "***", "host": "h"}, "lr": [0.1]}
    assert recorded["prefect.param.apiToken"] == "***"
    assert recorded["prefect.param.HFToken"] == "***"
    assert recorded["prefect.param.slack-webhook-url"] == "***"
    assert json.loads(recorded["prefect.param.db"]) == {"dsn": "***", "host": "h"}
    settings = json.loads(recorded["prefect.param.settings"])
    assert settings == {"api_key": "***", "host": "h"}
    assert recorded["prefect.param.tokenizer"] == "bert"
    assert recorded["prefect.param.max_tokens"] == "512"
    assert recorded["prefect.param.epochs"] == "3"
    assert SECRET not in json.dumps(recorded)


def test_a_deleted_torchx_experiment_is_one_line_at_submit_and_nothing_runs(store: str) -> None:
    from mlflow import MlflowClient

    with get_runner() as runner:
        first = runner.run_component("utils.sh", ["true"], "local_cwd")
        runner.wait(first, wait_interval=1, timeout=120)
    exp_id = the_run(store, first).info.experiment_id
    MlflowClient(store).delete_experiment(exp_id)  # the user's `mlflow experiments delete`
    cli = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh", "echo", "hi"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 1 and "hi" not in cli.stdout
    assert cli.stderr.count("\n") == 1, cli.stderr
    assert f"experiment 'torchx' (id {exp_id}) is deleted; restore it" in cli.stderr
    runs = MlflowClient(store).search_runs([exp_id], run_view_type=3)  # ViewType.ALL
    assert [r.data.tags["torchx.job_id"] for r in runs] == [first]


def test_store_files_are_private(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHX_TRACKER_MLFLOW_CONFIG")  # the default: $TORCHX_HOME/mlflow
    with get_runner() as runner:
        handle = runner.run_component("utils.sh", ["true"], "local_cwd")
        runner.wait(handle, wait_interval=1, timeout=120)
    home = tmp_path / "home" / "mlflow"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "mlflow.db").stat().st_mode) == 0o600


def test_no_process_outlives_the_tracked_jobs_by_10_s(store: str) -> None:
    import psutil

    with get_runner() as runner:
        handles = [runner.run_component("utils.sh", ["true"], "local_cwd") for _ in range(3)]
        for h in handles:
            runner.wait(h, wait_interval=1, timeout=120)

    home, me = os.environ["TORCHX_HOME"], os.getpid()

    def left_behind() -> List[str]:
        """Processes started for this test (they carry its TORCHX_HOME), but this one."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid != me and p.environ().get("TORCHX_HOME") == home:
                    found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])}")
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return found

    assert poll_until(left_behind, lambda found: not found, timeout=10) == []


def _fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:  # no space left on device
            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")
def test_a_full_disk_under_the_store_is_one_line_at_submit_and_at_the_end(tmp_path: Path) -> None:
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        uri = f"sqlite:///{mnt / 'mlflow.db'}"
        job_runs(uri)  # a whole store, then no room for one more page
        _fill(mnt / "filler")
        env = dict(
            os.environ,
            TORCHX_TRACKERS="mlflow",
            TORCHX_TRACKER_MLFLOW_CONFIG=uri,
            TORCHX_HOME=str(tmp_path / "home"),
        )
        out = subprocess.run(
            [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh", "echo", "hi"],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode != 0
        errors = [line for line in out.stderr.splitlines() if line.startswith("torchx: error")]
        assert len(errors) == 1, out.stderr
        assert uri in errors[0] and "full" in errors[0], errors
        assert "hi" not in out.stdout  # nothing was submitted without its run

        # room again, a job starts with its run; the disk fills up before the job ends
        (mnt / "filler").unlink()
        go = tmp_path / "go"
        cmd = f"while [ ! -e {go} ]; do sleep 0.1; done"
        job = subprocess.Popen(
            [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh", "sh", "-c", cmd],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            assert poll_until(lambda: job_runs(uri), bool, timeout=240), job.stderr
            _fill(mnt / "filler")
            go.touch()
            _, stderr = job.communicate(timeout=240)
        finally:
            job.kill()
        assert job.returncode == 0, stderr  # the job itself succeeded
        warnings = [line for line in stderr.splitlines() if "could not end" in line]
        assert len(warnings) == 1 and uri in warnings[0] and "full" in warnings[0], stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
