"""kubernetes with a docker workspace (``DockerWorkspaceMixin``), against kmock.

The dry run's rewritten image and build context; at schedule time either no engine is
reachable (one line naming ``--workspace ""``, nothing created), or the test Docker engine
builds the image and pushes it to the test registry before the job is created, and a
refused push creates nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import yaml

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.kubernetes.scheduler import KubernetesScheduler
from torchx.workspace.docker_workspace import (
    DockerUnavailableError,
    ImagePushError,
    MissingImageRepoError,
)

from ..docker_engine import BASE_IMAGE, engine_or_skip, registry_or_skip, registry_tags
from .kmock_server import (
    BATCH_JOBS,
    SERVICES,
    VOLCANO_JOBS,
    KMockServer,
    container,
    ddp_app,
    echo_app,
)

REPO = Path(__file__).resolve().parents[2]
IMAGE_REPO = "example.com/team/app"
FILES = ["Dockerfile.torchx", ".dockerignore", "train.py"]


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('from the workspace')\n")
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / ".dockerignore").write_text("data\n")
    return root


def _nothing_created(srv: KMockServer) -> bool:
    return srv.names(VOLCANO_JOBS) == srv.names(BATCH_JOBS) == srv.names(SERVICES) == []


def _two_roles() -> specs.AppDef:
    app = echo_app()
    other = specs.Role(
        name="other",
        image="busybox",
        entrypoint="true",
        resource=specs.Resource(cpu=1, gpu=0, memMB=256),
    )
    return specs.AppDef("two", [*app.roles, other])


def _tag(images_to_push: dict) -> str:
    ((local, (repo, tag)),) = images_to_push.items()
    assert re.fullmatch(r"[0-9a-f]{64}", tag) and local == f"sha256:{tag}" and repo == IMAGE_REPO
    return tag


# --------------------------------------------------------------------------- dry run


def test_volcano_dryrun_names_the_pushed_image(srv: KMockServer, ws: Path) -> None:
    cfg = {"queue": "q", "image_repo": IMAGE_REPO}
    info = get_runner().dryrun(ddp_app(), "kubernetes", cfg, workspace=str(ws))
    tag = _tag(info.request.images_to_push)
    (job,) = yaml.safe_load_all(str(info))  # what --dryrun prints
    images = [container(t["template"])["image"] for t in job["spec"]["tasks"]]
    assert images == [f"{IMAGE_REPO}:{tag}"] * 2
    build = info._workspace  # type: ignore[attr-defined]  # attached by Runner.dryrun
    assert build.files == FILES and build.old_image == ddp_app().roles[0].image
    again = get_runner().dryrun(ddp_app(), "kubernetes", cfg, workspace=str(ws))
    assert _tag(again.request.images_to_push) == tag  # reproducible: same content, same tag
    assert _nothing_created(srv)


def test_indexed_dryrun_rewrites_only_the_first_role(srv: KMockServer, ws: Path) -> None:
    cfg = {"job_type": "indexed", "image_repo": IMAGE_REPO, "quiet": True}
    runner = get_runner()
    info = runner.dryrun(_two_roles(), "kubernetes", cfg, workspace=str(ws))
    tag = _tag(info.request.images_to_push)
    _, first, second = yaml.safe_load_all(str(info))
    assert container(first["spec"]["template"])["image"] == f"{IMAGE_REPO}:{tag}"
    assert container(second["spec"]["template"])["image"] == "busybox"
    sched = runner._scheduler("kubernetes")
    assert isinstance(sched, KubernetesScheduler)
    planned = sched.workspace_build(f"{IMAGE_REPO}:{tag}")
    assert planned is not None and planned.quiet and planned.files == FILES
    assert (planned.base_image, planned.workspace) == ("alpine", str(ws))


def test_image_repo_and_quiet_come_from_the_workspace_mixin() -> None:
    import docker as docker_sdk

    docker = docker_sdk.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    assert KubernetesScheduler("t", None, docker)._docker_client is docker  # upstream's order
    opts = KubernetesScheduler("t").run_opts()
    assert str(opts.get("image_repo").help).startswith("(remote jobs) the image repository")
    assert opts.resolve({"queue": "q"})["quiet"] is False


def test_missing_image_repo_is_one_line(srv: KMockServer, ws: Path) -> None:
    with pytest.raises(MissingImageRepoError) as e:
        get_runner().run(echo_app(), "kubernetes", {"queue": "q"}, workspace=str(ws))
    msg = str(e.value)
    assert "-cfg image_repo=REPO" in msg and '--workspace ""' in msg and "\n" not in msg
    assert _nothing_created(srv)


# --------------------------------------------------------------------------- schedule


@pytest.mark.parametrize("job_type", ["volcano", "indexed"])
def test_schedule_without_docker_daemon_creates_nothing(
    srv: KMockServer, ws: Path, job_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runner = get_runner()
    cfg = {"queue": "q", "job_type": job_type, "image_repo": IMAGE_REPO}
    info = runner.dryrun(echo_app(), "kubernetes", cfg, workspace=str(ws))
    with pytest.raises(DockerUnavailableError) as e:
        runner.schedule(info)
    msg = str(e.value)
    assert msg.startswith("cannot reach a Docker engine") and "\n" not in msg
    assert msg.endswith(
        'pass --workspace "" (workspace=None in Python) to run without the workspace'
    )
    assert _nothing_created(srv)


def test_no_workspace_needs_no_docker(srv: KMockServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runner = get_runner()
    for workspace in (None, ""):
        info = runner.dryrun(echo_app(), "kubernetes", {"queue": "q"}, workspace=workspace)
        assert info.request.images_to_push == {}
        runner.schedule(info)
    images = [
        container(t["template"])["image"]
        for name in srv.names(VOLCANO_JOBS)
        for t in (srv.get(VOLCANO_JOBS, "default", name) or {})["spec"]["tasks"]
    ]
    assert images == ["alpine", "alpine"]


def test_schedule_builds_and_pushes_before_creating_the_job(srv: KMockServer, ws: Path) -> None:
    docker = engine_or_skip()
    registry = registry_or_skip()
    repo = f"torchx-test/k8s-{os.getpid()}"
    app = ddp_app()
    app.roles[0].image = BASE_IMAGE
    runner = get_runner(docker_client=docker)
    handle = runner.run(
        app, "kubernetes", {"queue": "q", "image_repo": f"{registry}/{repo}"}, str(ws)
    )
    (tag,) = registry_tags(registry, repo)
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    assert {container(t["template"])["image"] for t in job["spec"]["tasks"]} == {
        f"{registry}/{repo}:{tag}"
    }
    # the pushed image is the workspace on the base: exactly the files .dockerignore lets in
    pushed = docker.images.get(f"{registry}/{repo}:{tag}")
    ls = docker.containers.run(pushed.id, ["ls", "-A"], working_dir="/", remove=True)
    assert {"train.py", ".dockerignore", "Dockerfile.torchx"} <= set(ls.decode().split())
    assert "data" not in ls.decode().split()


def test_refused_push_creates_nothing(srv: KMockServer, ws: Path) -> None:
    from ..mlflow_server import free_port

    docker = engine_or_skip()
    app = echo_app()
    app.roles[0].image = BASE_IMAGE
    runner = get_runner(docker_client=docker)
    refusing = f"127.0.0.1:{free_port()}/team/app"  # nothing listens there
    cfg = {"job_type": "indexed", "image_repo": refusing}
    with pytest.raises(ImagePushError) as e:
        runner.run(app, "kubernetes", cfg, workspace=str(ws))
    msg = str(e.value)
    assert msg.startswith("failed to push docker image: ") and "\n" not in msg
    assert msg.endswith(f"check `docker login` for {refusing}")
    assert _nothing_created(srv)


# --------------------------------------------------------------------------- CLI


def _tx(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=cwd,
        timeout=60,
    )


def test_cli_default_workspace_without_image_repo_names_the_way_out(
    srv: KMockServer, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")  # the cwd is the default workspace
    out = _tx(["run", "-s", "kubernetes", "-cfg", "queue=q", "utils.echo"], tmp_path)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("torchx: error: role 'echo': the workspace image sha256:")
    assert "-cfg image_repo=REPO" in line and 'pass --workspace ""' in line
    assert _nothing_created(srv)
    out = _tx(
        ["run", "-s", "kubernetes", "-cfg", "queue=q", "--workspace", "", "utils.echo"], tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert len(srv.names(VOLCANO_JOBS)) == 1
