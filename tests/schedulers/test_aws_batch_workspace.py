"""aws_batch with a docker workspace (``DockerWorkspaceMixin``), against moto.

The dry run's rewritten image; at schedule time either no engine is reachable (one line
naming ``--workspace ""``, nothing registered or submitted), or the test Docker engine
builds the image and pushes it to the test registry before the job is registered.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.aws_batch_scheduler import AWSBatchScheduler
from torchx.workspace.docker_workspace import DockerUnavailableError, MissingImageRepoError

from ..docker_engine import BASE_IMAGE, engine_or_skip, registry_or_skip, registry_tags
from .moto_server import REGION, MotoBatchServer

REPO = Path(__file__).resolve().parents[2]
QUEUE = "torchx-ws-q"
IMAGE_REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app"


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('from the workspace')\n")
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / ".dockerignore").write_text("data\n")
    return root


def _role(name: str, image: str) -> specs.Role:
    return specs.Role(
        name=name,
        image=image,
        entrypoint="python",
        args=["train.py"],
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )


def _app() -> specs.AppDef:
    return specs.AppDef("ws", [_role("trainer", "python:3.11"), _role("ps", "busybox")])


def _images(job_or_def: Dict[str, Any]) -> List[str]:
    ranges = job_or_def["nodeProperties"]["nodeRangeProperties"]
    return [r["container"]["image"] for r in ranges]


def _nothing_submitted(moto: MotoBatchServer) -> bool:
    return moto.job_ids() == [] and moto.job_definition_names() == []


def test_dryrun_names_the_pushed_image_in_the_job_definition(
    moto: MotoBatchServer, ws: Path
) -> None:
    cfg = {"queue": QUEUE, "image_repo": IMAGE_REPO}
    info = get_runner().dryrun(_app(), "aws_batch", cfg, workspace=str(ws))
    ((local, (repo, tag)),) = info.request.images_to_push.items()
    assert re.fullmatch(r"[0-9a-f]{64}", tag) and local == f"sha256:{tag}" and repo == IMAGE_REPO
    printed = yaml.safe_load(str(info))  # what --dryrun prints
    assert _images(printed["registerJobDefinition"]) == [f"{IMAGE_REPO}:{tag}", "busybox"]
    assert info._workspace.files == ["Dockerfile.torchx", ".dockerignore", "train.py"]  # type: ignore[attr-defined]

    import boto3
    from botocore.validate import validate_parameters

    model = boto3.client("batch", region_name=REGION).meta.service_model
    shape = model.operation_model("RegisterJobDefinition").input_shape
    validate_parameters(info.request.job_def, shape)
    assert _nothing_submitted(moto)


def test_image_repo_and_quiet_come_from_the_workspace_mixin() -> None:
    import docker as docker_sdk

    docker = docker_sdk.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    assert AWSBatchScheduler("t", None, None, docker)._docker_client is docker  # upstream's order
    opts = AWSBatchScheduler("t").run_opts()
    assert str(opts.get("image_repo").help).startswith("(remote jobs) the image repository")
    assert opts.resolve({"queue": QUEUE})["quiet"] is False


def test_missing_image_repo_is_one_line(moto: MotoBatchServer, ws: Path) -> None:
    with pytest.raises(MissingImageRepoError) as e:
        get_runner().run(_app(), "aws_batch", {"queue": QUEUE}, workspace=str(ws))
    msg = str(e.value)
    assert "-cfg image_repo=REPO" in msg and '--workspace ""' in msg and "\n" not in msg
    assert _nothing_submitted(moto)


def test_schedule_without_docker_daemon_submits_nothing(
    moto: MotoBatchServer, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runner = get_runner()
    info = runner.dryrun(_app(), "aws_batch", {"queue": QUEUE, "image_repo": IMAGE_REPO}, str(ws))
    with pytest.raises(DockerUnavailableError) as e:
        runner.schedule(info)
    msg = str(e.value)
    assert msg.startswith("cannot reach a Docker engine") and "\n" not in msg
    assert msg.endswith(
        'pass --workspace "" (workspace=None in Python) to run without the workspace'
    )
    assert _nothing_submitted(moto)


def test_schedule_pushes_before_registering(moto: MotoBatchServer, ws: Path) -> None:
    docker = engine_or_skip()
    registry = registry_or_skip()
    repo = f"torchx-test/batch-{os.getpid()}"
    app = _app()
    app.roles[0].image = BASE_IMAGE
    runner = get_runner(docker_client=docker)
    handle = runner.run(
        app, "aws_batch", {"queue": QUEUE, "image_repo": f"{registry}/{repo}"}, str(ws)
    )
    (tag,) = registry_tags(registry, repo)
    status = runner.status(handle)
    assert status is not None
    (job,) = moto.client("batch").describe_jobs(jobs=moto.job_ids())["jobs"]
    assert _images(job) == [f"{registry}/{repo}:{tag}", "busybox"]


def test_no_workspace_needs_no_docker(
    moto: MotoBatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runner = get_runner()
    info = runner.dryrun(_app(), "aws_batch", {"queue": QUEUE}, workspace="")
    assert info.request.images_to_push == {}
    runner.schedule(info)
    (job,) = moto.client("batch").describe_jobs(jobs=moto.job_ids())["jobs"]
    assert _images(job) == ["python:3.11", "busybox"]


def test_cli_default_workspace_without_image_repo_names_the_way_out(
    moto: MotoBatchServer, tmp_path: Path
) -> None:
    def tx(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torchx.cli.main", "run", "-s", "aws_batch", *args],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            cwd=tmp_path,
            timeout=60,
        )

    out = tx("-cfg", f"queue={QUEUE}", "utils.echo")  # the cwd is the default workspace
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("torchx: error: role 'echo': the workspace image sha256:")
    assert 'pass --workspace ""' in line
    assert _nothing_submitted(moto)
    out = tx("-cfg", f"queue={QUEUE}", "--workspace", "", "utils.echo")
    assert out.returncode == 0, out.stderr
    assert len(moto.job_ids()) == 1
