"""TorchXOperator with real Airflow 3 (dag.test on sqlite) and real local_cwd jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]


def _states(dag_run: Any) -> Dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def _dag(dag_id: str, **op_kwargs: Any) -> Any:
    """Write a one-job DAG file into the dags folder (dag.test needs it there) and load it."""
    import importlib.util

    code = textwrap.dedent(f"""
        from datetime import datetime
        from airflow.sdk import DAG, task
        from torchx.pipelines.airflow import TorchXOperator, close_pipeline_run

        with DAG(
            dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
            on_success_callback=close_pipeline_run, on_failure_callback=close_pipeline_run,
        ) as dag:
            job = TorchXOperator(task_id="job", **{op_kwargs!r})

            @task
            def downstream(handle: str) -> str:
                return handle

            downstream(job.output)
    """)
    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{dag_id}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(dag_id, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.dag


# a job that says hello, then reports 10 steps of progress, one every 0.5 s
JOB = (
    "import time; from torchx.trackers import report_progress\n"
    "print('hello-from-job', flush=True)\n"
    "for i in range(1, 11):\n"
    "    report_progress(i, total=10, loss=1.0 / i); time.sleep(0.5)"
)


@pytest.mark.parametrize("deferrable", [False, True])
def test_success_returns_handle_and_streams_logs_and_progress(
    torchx_env: Path, deferrable: bool, capfd: pytest.CaptureFixture
) -> None:
    """One DAG run per mode shows the job's log, its progress lines and the pipeline run."""
    dag = _dag(
        f"ok_{deferrable}",
        component="utils.python",
        component_args=["--c", JOB],
        deferrable=deferrable,
        poll_interval=0.5,
        progress_interval=1.0,
    )
    dag_run = dag.test()
    assert _states(dag_run) == {"job": "success", "downstream": "success"}
    out, err = capfd.readouterr()
    # once: a deferred task's trigger streams it, and execute_complete copies only the rest
    assert out.count("python/0 hello-from-job") == 1, out
    assert _pipeline_status(dag_run) == "FINISHED"
    # an embedded sqlite store has no UI: no link, and no error about it (also on deferral)
    assert not _xcom(dag_run, "job", "_link_TorchXMLflowLink")
    assert "XCom not found" not in out + err
    # progress lines in the task log
    lines = [ln for ln in out.splitlines() if "progress: step " in ln]
    assert lines, out
    assert any("step 10/10" in ln and "loss=0.1" in ln for ln in lines), lines
    # only changed reports are logged: no two consecutive lines report the same step
    steps = [ln.split("progress: step ")[1].split(",")[0] for ln in lines]
    assert all(a != b for a, b in zip(steps, steps[1:], strict=False)), steps


@pytest.mark.parametrize("deferrable", [False, True])
def test_failing_stage_fails_task_with_worker_error(
    torchx_env: Path, deferrable: bool, capfd: pytest.CaptureFixture
) -> None:
    dag = _dag(
        f"fail_{deferrable}",
        component="utils.python",
        component_args=["--c", "raise ValueError('bad learning rate')"],
        deferrable=deferrable,
        poll_interval=0.5,
    )
    dag_run = dag.test()
    states = _states(dag_run)
    assert states["job"] == "failed" and states["downstream"] != "success", states
    out = capfd.readouterr().out
    assert "ValueError: bad learning rate" in out
    assert "first failed: python/0" in out
    assert _pipeline_status(dag_run) == "FAILED"  # the DAG's failure callback ended it


def test_misspelled_run_option_fails_the_task_naming_it(
    torchx_env: Path, capfd: pytest.CaptureFixture
) -> None:
    """A typo in ``cfg`` fails the task with the key and the valid options; nothing runs."""
    dag = _dag(
        "misspelled_cfg",
        component="utils.sh",
        component_args=["touch", str(torchx_env / "ran")],
        cfg={"log_dri": str(torchx_env / "logs")},
    )
    dag_run = dag.test()
    assert _states(dag_run)["job"] == "failed"
    out, err = capfd.readouterr()
    assert (
        "Unknown run option 'log_dri' (did you mean 'log_dir'?); valid options of the local_cwd"
        " scheduler are: auto_set_cuda_visible_devices, log_dir, prepend_cwd" in out + err
    )
    assert not (torchx_env / "ran").exists()


def test_torchrun_line_runs_as_dist_ddp(torchx_env: Path, capfd: pytest.CaptureFixture) -> None:
    """A stage written as its torchrun line (templated), run as torchx torchrun runs it."""
    dag = _dag(
        "torchrun_line",
        torchrun="torchrun --nproc_per_node 2 --no_python sh -c 'echo r$RANK {{ task.task_id }}'",
        poll_interval=0.5,
    )
    assert dag.task_dict["job"].component == "dist.ddp"
    dag_run = dag.test()
    assert _states(dag_run) == {"job": "success", "downstream": "success"}
    out = capfd.readouterr().out
    assert "sh/0 [0]:r0 job" in out and "sh/0 [1]:r1 job" in out, out


def test_stalled_stage_fails_with_the_reason(
    torchx_env: Path, capfd: pytest.CaptureFixture
) -> None:
    dag = _dag(
        "stalled",
        component="utils.python",
        component_args=[
            "--c",
            "import time; from torchx.trackers import report_progress\n"
            "report_progress(1, total=10); time.sleep(300)",
        ],
        poll_interval=0.5,
        stall_timeout=5,
    )
    dag_run = dag.test()
    assert _states(dag_run)["job"] == "failed"
    out = capfd.readouterr().out
    assert "stalled: no progress or output for 5 s (last step 1)" in out, out


def _xcom(dag_run: Any, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(
            run_id=dag_run.run_id, key=key, task_ids=task_id, dag_ids=dag_run.dag_id
        )
        row = session.scalars(query).first()
        return None if row is None else XComModel.deserialize_value(row)


def _pipeline_status(dag_run: Any) -> str:
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    rid = tracker.mlflow_run_id(f"airflow://{dag_run.dag_id}/{dag_run.run_id}")  # type: ignore[attr-defined]
    return tracker.client.get_run(rid).info.status  # type: ignore[attr-defined]


class _TI:
    """The slice of Airflow's task-instance API that execute() uses.

    A stand-in outside a DAG run.
    """

    def __init__(self, run_id: str) -> None:
        self.dag_id, self.task_id, self.run_id, self.map_index = "d", "t", run_id, -1
        # outside a DAG run there is no try numbering: never a retry
        self.try_number: Optional[int] = None
        self.max_tries: Optional[int] = None
        self.xcoms: Dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _replica_tree(handle: str) -> List[int]:
    app_id = handle.rsplit("/", 1)[1]
    state = json.loads(
        (
            Path(os.environ["TORCHX_HOME"]) / "local_cwd" / "torchx" / app_id / "state.json"
        ).read_text()
    )
    pids = []
    for r in state["replicas"]:
        pids.append(r["pid"])
        pids += [c.pid for c in psutil.Process(r["pid"]).children(recursive=True)]
    return pids


def test_on_kill_cancels_every_process(torchx_env: Path) -> None:
    from torchx.pipelines.airflow import TorchXOperator

    op = TorchXOperator(
        task_id="t",
        component="utils.sh",
        component_args=["--num_replicas", "2", "sleep", "600"],
        poll_interval=0.5,
        trackers={},
    )
    ti = _TI("kill")
    errors: List[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(errors, op.execute, {"ti": ti}))
    thread.start()
    deadline = time.monotonic() + 60
    while "app_handle" not in ti.xcoms and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    pids = _replica_tree(ti.xcoms["app_handle"])
    op.on_kill()
    thread.join(timeout=60)
    assert not thread.is_alive() and errors and "CANCELLED" in str(errors[0])
    assert [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ] == []


def _capture(errors: List[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: B036
        errors.append(e)


def test_retry_after_worker_crash_reattaches(torchx_env: Path, tmp_path: Path) -> None:
    first_try = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_operator import _TI
        from torchx.pipelines.airflow import TorchXOperator
        op = TorchXOperator(
            task_id="t",
            component="utils.sh",
            component_args=["sh", "-c", "sleep 3; echo finished"],
            trackers={{}},
        )
        op.execute({{"ti": _TI("retry")}})
    """)
    # the retry runs on "another worker": its own $TORCHX_HOME for its own files; only the
    # scheduler's state dir is shared (the local scheduler keeps it under TORCHX_HOME)
    worker = subprocess.Popen([sys.executable, "-c", first_try], env=dict(os.environ), cwd=tmp_path)
    from torchx.pipelines.airflow import TorchXOperator
    from torchx.runner import get_runner

    deadline = time.monotonic() + 60
    with get_runner() as runner:  # the job runs (not merely launching: that is another case)
        while time.monotonic() < deadline and not any(
            a.state.name == "RUNNING" for a in runner.list("local_cwd")
        ):
            time.sleep(0.05)
    worker.kill()  # the worker dies while the job runs
    worker.wait(timeout=30)

    op = TorchXOperator(
        task_id="t",
        component="utils.sh",
        component_args=["sh", "-c", "sleep 3; echo finished"],
        trackers={},
    )
    ti = _TI("retry")
    handle = op.execute({"ti": ti})
    with get_runner() as runner:
        apps = runner.list("local_cwd")
        assert [a.app_handle for a in apps] == [handle]  # one job, not two
        assert "finished\n" in list(runner.log_lines(handle, "sh"))
    assert ti.xcoms["app_status"]["state"] == "SUCCEEDED"


def test_mlflow_link_only_where_there_is_a_ui(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchx.pipelines.airflow import TorchXMLflowLink, TorchXOperator
    from torchx.trackers.api import build_trackers

    def run(name: str) -> _TI:
        op = TorchXOperator(
            task_id="t",
            component="utils.python",
            component_args=[
                "--c",
                "from torchx.tracker import app_run_from_env as r; r().add_metadata(a=1)",
            ],
            poll_interval=0.5,
        )
        ti = _TI(name)
        op.execute({"ti": ti})
        return ti

    ti = run("no-ui")  # an embedded sqlite store has no UI: no (fake) link
    assert TorchXMLflowLink().xcom_key not in ti.xcoms
    monkeypatch.setenv("TORCHX_MLFLOW_UI_URL", "http://127.0.0.1:5999/")
    ti = run("ui")
    link = ti.xcoms[TorchXMLflowLink().xcom_key]
    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    rid = tracker.mlflow_run_id(ti.xcoms["app_handle"])  # type: ignore[attr-defined]
    exp = tracker.client.get_run(rid).info.experiment_id  # type: ignore[attr-defined]
    assert link == f"http://127.0.0.1:5999/#/experiments/{exp}/runs/{rid}"


def test_cleared_succeeded_task_runs_again_unless_reusing_success(torchx_env: Path) -> None:
    from torchx.pipelines.airflow import TorchXOperator

    def execute(**kwargs: Any) -> str:
        op = TorchXOperator(
            task_id="t",
            component="utils.sh",
            component_args=["true"],
            poll_interval=0.5,
            trackers={},
            **kwargs,
        )
        return op.execute({"ti": _TI("cleared")})

    first = execute()
    second = execute()
    assert second != first  # cleared after success: a new app
    assert execute(reuse_succeeded=True) == second  # the newest succeeded app is reused


def test_a_retry_returns_the_succeeded_app_a_clear_runs_again(torchx_env: Path) -> None:
    """Airflow's try numbering tells them apart: a clear sets ``max_tries = try_number +
    retries``, so only a try after the first of its series is a retry."""
    from torchx.pipelines.airflow import TorchXOperator

    def execute(try_number: int, max_tries: int) -> str:
        op = TorchXOperator(
            task_id="t",
            component="utils.sh",
            component_args=["true"],
            poll_interval=0.5,
            trackers={},
            retries=1,
        )
        ti = _TI("retried")
        ti.try_number, ti.max_tries = try_number, max_tries
        return op.execute({"ti": ti})

    first = execute(1, 1)  # its worker died after the app succeeded ...
    assert execute(2, 1) == first  # ... so the retry returns that app
    cleared = execute(3, 3)  # a user cleared the task after try 2: it runs again
    assert cleared != first
    assert execute(4, 3) == cleared  # and that series' retry returns its own app


def test_provider_info_and_bad_arguments() -> None:
    from torchx.pipelines.airflow import TorchXOperator, get_provider_info

    info = get_provider_info()
    assert (
        info["package-name"] == "torchx"
        and "torchx.pipelines.airflow.operator" in info["operators"][0]["python-modules"]
    )
    with pytest.raises(ValueError, match="exactly one of component=, app= or torchrun="):
        TorchXOperator(task_id="x")
    with pytest.raises(ValueError, match="torchrun= holds the script's arguments"):
        TorchXOperator(task_id="x", torchrun="torchrun t.py", component_args=["--x"])
    from importlib.metadata import entry_points

    assert "torchx.pipelines.airflow:get_provider_info" in [
        e.value for e in entry_points(group="apache_airflow_provider")
    ]


@pytest.mark.slow
@pytest.mark.slurm
def test_reference_dag_with_training_on_slurm(torchx_env: Path) -> None:
    """The same DAG, only the scheduler changed: every stage runs on the local Slurm cluster."""
    import shutil

    if (
        shutil.which("sinfo") is None
        or subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode != 0
    ):
        pytest.skip("no running Slurm cluster (bash scripts/slurm_cluster.sh start)")
    import importlib.util

    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "reference_dag.py"
    if not path.exists():
        path.symlink_to(ROOT / "examples" / "pipelines" / "airflow" / "reference_dag.py")
    spec = importlib.util.spec_from_file_location("reference_dag", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    conf = {
        "base_dir": str(torchx_env / "out"),
        "j": "2x1",
        "epochs": 3,
        "limit": 600,
        "scheduler": "slurm",
        "train_cfg": {"job_dir": str(torchx_env / "slurm-job")},
    }
    dag_run = module.dag.test(run_conf=conf)
    assert _states(dag_run) == {
        t: "success" for t in ("datapreproc", "train", "evaluate", "report")
    }, _states(dag_run)
    assert list(
        (torchx_env / "slurm-job").glob("slurm-*-train-1.out")
    )  # the training ran as a 2-node Slurm job


def test_every_parameter_is_documented() -> None:
    import inspect
    import re

    from torchx.pipelines.airflow import TorchXOperator

    doc = TorchXOperator.__doc__ or ""
    documented = set(re.findall(r":param (\w+):", doc))
    params = set(inspect.signature(TorchXOperator.__init__).parameters) - {"self"}
    assert params - documented == set()
    assert {"outlets", "inlets"} <= documented  # Airflow's own, with what torchx does to them
    assert '{"args": ["echo", "hi"]}' in doc  # the dict form of a variadic component's args


def test_dataset_names_follow_openlineage_naming() -> None:
    from torchx.pipelines.airflow.lineage import openlineage_name, to_uri

    assert to_uri("/data/x") == "file:///data/x"
    assert to_uri("s3://bucket/x") == "s3://bucket/x"
    assert openlineage_name("file:///data/x") == ("file", "/data/x")
    assert openlineage_name("s3://bucket/a/b/") == ("s3://bucket", "a/b")
    assert openlineage_name("memory://tmp/m") == ("memory://tmp", "m")
