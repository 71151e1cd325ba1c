"""``local_docker`` on a real Docker engine: every replica a container of torchx's image."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, List

import pytest

import torchx
from torchx import specs
from torchx.components import dist, utils
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER
from torchx.schedulers.docker_scheduler import (
    LABEL_APP_ID,
    LABEL_IDEMPOTENCY_TOKEN,
    LABEL_OWNER,
    create_scheduler,
)
from torchx.specs import AppState

from ...mlflow_server import free_port
from ...polling import poll_until

TORCHX = [sys.executable, "-m", "torchx.cli.main"]


def torchx_cli(*args: str, cwd: Any = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The CLI in a process of its own (another shell, as a user would run it)."""
    return subprocess.run(
        [*TORCHX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def containers(client: Any, app_id: str) -> List[Any]:
    return client.containers.list(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})


def test_echo_from_the_cli_and_status_and_log_from_other_processes(
    docker_client: Any, tmp_path: Path
) -> None:
    run = torchx_cli("run", "-s", "local_docker", "utils.echo", "--msg", "hi", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    handle = run.stdout.splitlines()[0]
    assert handle.startswith("local_docker://torchx/echo-")
    assert "echo/0 hi" in run.stdout.splitlines()

    status = torchx_cli("status", handle)
    assert status.returncode == 0, status.stderr
    assert "State: SUCCEEDED" in status.stdout
    log = torchx_cli("log", handle)
    assert log.returncode == 0, log.stderr
    assert log.stdout.splitlines() == ["echo/0 hi"]
    listed = torchx_cli("list", "-s", "local_docker")
    assert any(handle in line and "SUCCEEDED" in line for line in listed.stdout.splitlines())


def test_cancel_from_another_process_stops_every_container(docker_client: Any) -> None:
    app = utils.sh("sleep", "600", num_replicas=2)
    with get_runner() as runner:
        handle = runner.run(app, "local_docker")
        app_id = handle.rsplit("/", 1)[1]
        running = poll_until(
            lambda: runner.status(handle),
            lambda s: s is not None and s.state == AppState.RUNNING,
            timeout=60,
        )
        assert running is not None and running.state == AppState.RUNNING
        cancel = torchx_cli("cancel", handle)
        assert cancel.returncode == 0, cancel.stderr
        assert [c.status for c in containers(docker_client, app_id)] == ["exited", "exited"]
        status = runner.status(handle)
        assert status is not None and status.state == AppState.CANCELLED
    # a fresh reader (no cache) sees it the same way
    again = torchx_cli("status", handle)
    assert "State: CANCELLED" in again.stdout


def test_ddp_across_two_containers(docker_client: Any, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "print(f'rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    run = torchx_cli(
        "run", "-s", "local_docker", "dist.ddp", "-j", "2x1", "--script", "allreduce.py",
        "--rdzv_port", str(free_port()), "--rdzv_timeout", "60", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = sorted(line for line in run.stdout.splitlines() if "sum" in line)
    assert sorted(line.split(" ", 1)[1] for line in lines) == [
        "[0]:rank 0/2 sum 2",
        "[0]:rank 1/2 sum 2",
    ]
    assert {line.split(" ", 1)[0] for line in lines} == {"allreduce/0", "allreduce/1"}


def test_workspace_run_builds_the_cwd_into_the_image(docker_client: Any, tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text("print('hello from', __file__)\n")
    (tmp_path / "data.bin").write_bytes(b"x" * 10)
    (tmp_path / ".dockerignore").write_text("data.bin\n")
    run = torchx_cli("run", "-s", "local_docker", "utils.python", "--script", "hello.py",
                     cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "python/0 hello from /workspace/hello.py" in run.stdout.splitlines()
    handle = run.stdout.splitlines()[0]
    with get_runner() as runner:
        app = runner.describe(handle)
        assert app is not None
        image = docker_client.containers.get(
            containers(docker_client, handle.rsplit("/", 1)[1])[0].id
        ).image
        # the workspace image holds hello.py but not what .dockerignore leaves out
        out = docker_client.containers.run(image.id, ["ls", "/workspace"], remove=True)
        files = out.decode().split()
        assert "hello.py" in files and "data.bin" not in files


def test_keyed_runs_converge_on_one_app(docker_client: Any) -> None:
    key = f"stage-{os.getpid()}-{threading.get_ident()}"
    handles: List[str] = []

    def submit() -> None:
        with get_runner() as runner:
            handles.append(
                runner.run(utils.sh("sleep", "600"), "local_docker", idempotency_key=key)
            )

    racers = [threading.Thread(target=submit) for _ in range(4)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=120)
    assert len(handles) == 4 and len(set(handles)) == 1, handles
    with get_runner() as runner:
        assert (
            runner.run(utils.sh("sleep", "600"), "local_docker", idempotency_key=key) == handles[0]
        )
        token = runner.describe(handles[0]).metadata[IDEMPOTENCY_TOKEN]  # type: ignore[union-attr]
        keyed = docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_IDEMPOTENCY_TOKEN}={token}"}
        )
        live = [c for c in keyed if c.status == "running"]
        assert [c.labels[LABEL_APP_ID] for c in live] == [handles[0].rsplit("/", 1)[1]]
        runner.cancel(handles[0])
        status = runner.status(handles[0])
        assert status is not None and status.state == AppState.CANCELLED
        # a cancelled app is never re-attached: the key starts a new one
        again = runner.run(utils.echo(msg="again"), "local_docker", idempotency_key=key)
        assert again != handles[0]
        assert runner.wait(again, wait_interval=1).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_describe_gives_the_app_its_owner_and_replicas(docker_client: Any) -> None:
    app = utils.sh("echo", "done", num_replicas=2)
    with get_runner() as runner:
        owner = json.dumps({"kind": "test", "ids": {"n": 1}})
        handle = runner.run(app, "local_docker", owner=owner)
        status = runner.wait(handle, wait_interval=1)
        assert status is not None and status.state == AppState.SUCCEEDED
    sched = create_scheduler("torchx")
    app_id = handle.rsplit("/", 1)[1]
    desc = sched.describe(app_id)
    assert desc is not None
    assert [r.name for r in desc.roles] == ["sh"] and desc.roles[0].args == ["-c", "echo done"]
    assert [(r.id, r.state) for r in desc.roles_statuses[0].replicas] == [
        (0, AppState.SUCCEEDED),
        (1, AppState.SUCCEEDED),
    ]
    owner = json.loads(desc.metadata[OWNER])
    assert owner["kind"] == "test"
    assert json.loads(containers(docker_client, app_id)[0].labels[LABEL_OWNER]) == owner
    assert sched.describe("no-such-app") is None


def test_failure_restarts_and_error_file(docker_client: Any) -> None:
    role = specs.Role(
        name="flaky",
        image=torchx.IMAGE,
        entrypoint="python",
        args=["-c", "import sys; print('try'); sys.exit(3)"],
        max_retries=2,
        resource=specs.Resource(cpu=1, gpu=0, memMB=256),
    )
    with get_runner() as runner:
        handle = runner.run(specs.AppDef("flaky", [role]), "local_docker")
        status = runner.wait(handle, wait_interval=1)
        assert status is not None and status.state == AppState.FAILED
        assert status.num_restarts == 2
        lines = list(runner.log_lines(handle, "flaky"))
        assert lines.count("try\n") == 3


def test_mounts_env_options_and_progress(docker_client: Any, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    script = (
        "import os\n"
        "from torchx.trackers import report_progress\n"
        "open('/data/out.txt', 'w').write(os.environ['FROM_CFG'] + os.environ['COPIED_X'])\n"
        "report_progress(7, total=10, loss=0.5)\n"
    )
    app = utils.python(c=script)
    app.roles[0].mounts = specs.parse_mounts(["type=bind", f"src={shared}", "dst=/data"])
    os.environ["COPIED_X"] = "-copied"
    try:
        with get_runner() as runner:
            handle = runner.run(
                app,
                "local_docker",
                cfg={"env": {"FROM_CFG": "cfg"}, "copy_env": ["COPIED_*"]},
                workspace=None,
            )
            status = runner.wait(handle, wait_interval=1)
            assert status is not None and status.state == AppState.SUCCEEDED, status
            progress = runner.progress(handle)
    finally:
        del os.environ["COPIED_X"]
    assert (shared / "out.txt").read_text() == "cfg-copied"
    assert progress is not None and (progress.step, progress.total) == (7, 10)


def test_stalled_app_is_stopped_with_its_reason(docker_client: Any) -> None:
    app = utils.sh("sleep", "600")
    with get_runner() as runner:
        handle = runner.run(app, "local_docker", stall_timeout=2)
        status = runner.wait(handle, wait_interval=0.5, timeout=120)
        assert status is not None and status.state == AppState.FAILED
        assert status.msg.startswith("stalled: no progress or output for 2 s")
    assert "stalled: no progress" in torchx_cli("status", handle).stdout


def test_dryrun_request_gpus_labels_and_no_upstream_image() -> None:
    app = dist.ddp(script="train.py", j="2x2", gpu=1)
    with get_runner() as runner:
        info = runner.dryrun(app, "local_docker", workspace=None)
    containers_ = info.request.containers
    assert [c.kwargs["name"].rsplit("-", 1)[1] for c in containers_] == ["0", "1"]
    for c in containers_:
        assert c.image == torchx.IMAGE == f"torchx:{torchx.__version__}"
        assert c.kwargs["network_mode"] == "host"
        (request,) = c.kwargs["device_requests"]
        assert request["Count"] == 1 and request["Capabilities"] == [["compute", "utility"]]
    assert "ghcr.io" not in str(info)


def test_container_names_start_as_docker_requires() -> None:
    """A container name is the app id's last 30 characters (as upstream); where that tail
    starts with ``-`` the engine would refuse the name."""
    resource = specs.Resource(cpu=1, gpu=0, memMB=256)
    role = specs.Role("echo", torchx.IMAGE, entrypoint="echo", args=["hi"], resource=resource)
    app = specs.AppDef("ab-" + "c" * 18, roles=[role])  # its id's 30-char tail starts "-c"
    with get_runner() as runner:
        info = runner.dryrun(app, "local_docker", workspace=None)
    (container,) = info.request.containers
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", container.kwargs["name"]), container


def test_a_missing_image_is_one_line(docker_client: Any) -> None:
    run = torchx_cli(
        "run", "-s", "local_docker", "--workspace", "", "utils.echo", "--image",
        "127.0.0.1:1/no/such:image",
    )  # fmt: skip
    assert run.returncode == 1
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("torchx: error: image 127.0.0.1:1/no/such:image is not on the Docker")


def test_tracked_job_lands_in_the_hosts_sqlite_store(
    docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    script = (
        "import os\n"
        "from torchx.trackers import record_output\n"
        "open('/tmp/model.txt', 'w').write('weights')\n"
        "record_output('/tmp/model.txt', 'model')\n"
    )
    with get_runner() as runner:
        handle = runner.run(utils.python(c=script), "local_docker", workspace=None)
        status = runner.wait(handle, wait_interval=1)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        hours = runner.resource_hours(handle)
    assert hours is not None and hours.cpu_hours > 0
    store = tmp_path / "home" / "mlflow"
    with sqlite3.connect(store / "mlflow.db") as db:
        (run_id,) = db.execute(
            "select run_uuid from tags where key = 'torchx.artifact.model.path'"
        ).fetchone()
        (state,) = db.execute("select status from runs where run_uuid = ?", (run_id,)).fetchone()
    assert state == "FINISHED"
    copied = list(store.glob(f"artifacts/*/{run_id}/artifacts/model/model.txt"))
    assert [p.read_text() for p in copied] == ["weights"]


def test_torchx_image_holds_this_torchx_and_the_kfp_step(docker_client: Any) -> None:
    """``torchx.IMAGE`` is built from the repository's Dockerfile (``scripts/docker_engine.sh``)."""
    out = docker_client.containers.run(
        torchx.IMAGE,
        ["python", "-c", "import torchx, torchx.pipelines.kfp.launch; print(torchx.__version__)"],
        network_mode="host",
        remove=True,
    )
    assert out.decode().strip() == torchx.__version__
    labels = docker_client.images.get(torchx.IMAGE).labels or {}
    assert not any("ghcr.io" in v for v in labels.values())
