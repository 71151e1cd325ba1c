"""Docker workspaces without a Docker engine: the real build context, the rewritten image in
the dry run, and the one-line error when the image must be built but no daemon is reachable.
"""

from __future__ import annotations

import io
import re
import socket
import sys
import tarfile
from pathlib import Path
from typing import Dict, List

import pytest

from torchx import specs
from torchx.workspace import apply_workspace
from torchx.workspace.docker_workspace import (
    DEFAULT_DOCKERFILE,
    TORCHX_DOCKERFILE,
    DockerUnavailableError,
    DockerWorkspaceMixin,
    ImagePushError,
    MissingImageRepoError,
    build_context,
    print_push_events,
)

BASE = "ghcr.io/pytorch/torchx:0.7.0"


class _DockerWs(DockerWorkspaceMixin):
    """The docker workspace on its own (what kubernetes and aws_batch mix in)."""


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "ckpt").mkdir()
    (root / "train.py").write_text("print('train')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "src" / "model.py").write_text("M = 1\n")
    (root / "src" / "model.pyc").write_bytes(b"\0\1")
    (root / "ckpt" / "big.pt").write_bytes(b"\0" * 100)
    (root / "notes.md").write_text("notes")
    (root / ".dockerignore").write_text("ckpt\n**/*.pyc\n*.md\n.dockerignore\n")
    return root


def _members(f: io.BufferedIOBase) -> Dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=f, mode="r") as tf:
        return {m.name: m for m in tf.getmembers()}


def _read(f: io.BufferedIOBase, name: str) -> bytes:
    f.seek(0)
    with tarfile.open(fileobj=f, mode="r") as tf:
        member = tf.extractfile(name)
        assert member is not None
        return member.read()


def _app() -> specs.AppDef:
    roles = [
        specs.Role(name="trainer", image=BASE, entrypoint="python", resource=specs.resource(cpu=1)),
        specs.Role(name="ps", image=BASE, entrypoint="python", resource=specs.resource(cpu=1)),
    ]
    return specs.AppDef(name="app", roles=roles)


def test_context_is_default_dockerfile_plus_exactly_the_unignored_files(ws: Path) -> None:
    f, names = build_context(str(ws))
    members = _members(f)
    assert names == [TORCHX_DOCKERFILE, "run.sh", "src/model.py", "train.py"]
    assert list(members) == names
    assert (
        _read(f, TORCHX_DOCKERFILE) == DEFAULT_DOCKERFILE == b"ARG IMAGE\nFROM $IMAGE\nCOPY . .\n"
    )
    assert _read(f, "src/model.py") == b"M = 1\n"
    assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    assert {m.mtime for m in members.values()} == {0}


def test_workspace_dockerfile_is_used_even_if_ignored(ws: Path) -> None:
    (ws / TORCHX_DOCKERFILE).write_text("FROM scratch\nCOPY train.py .\n")
    (ws / ".dockerignore").write_text("*\n!train.py\n")
    f, names = build_context(str(ws))
    assert names == [TORCHX_DOCKERFILE, "train.py"]
    assert _read(f, TORCHX_DOCKERFILE) == b"FROM scratch\nCOPY train.py .\n"


def test_dryrun_rewrites_image_to_repo_and_content_digest(ws: Path) -> None:
    sched = _DockerWs()
    app = _app()
    build = apply_workspace(sched, app, str(ws), {"image_repo": "example.com/team/app"})
    local = app.roles[0].image
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", local) and app.roles[1].image == BASE
    to_push = sched.dryrun_push_images(app, {"image_repo": "example.com/team/app"})
    digest = local.split(":")[1]
    assert to_push == {local: ("example.com/team/app", digest)}
    assert app.roles[0].image == f"example.com/team/app:{digest}" and app.roles[1].image == BASE
    assert build is not None and build.files == [
        TORCHX_DOCKERFILE,
        "run.sh",
        "src/model.py",
        "train.py",
    ]
    planned = sched.workspace_build(app.roles[0].image)
    assert planned is not None and (planned.base_image, planned.workspace) == (BASE, str(ws))
    assert _members(planned.context).keys() == set(build.files)
    assert "build args IMAGE=ghcr.io/pytorch/torchx:0.7.0" in str(build)


def test_digest_follows_content_and_base_image_only(ws: Path) -> None:
    def digest(image: str = BASE) -> str:
        app = _app()
        app.roles[0].image = image
        _DockerWs().build_workspace_and_update_role(app.roles[0], str(ws), {})
        return app.roles[0].image

    first = digest()
    assert digest() == first  # reproducible, in a new process-level object too
    (ws / "ckpt" / "big.pt").write_bytes(b"changed")  # ignored: same image
    (ws / "src" / "model.pyc").write_bytes(b"changed")
    assert digest() == first
    (ws / "train.py").write_text("print('v2')\n")
    second = digest()
    assert second != first
    assert digest("python:3.11") != second


def test_missing_image_repo_is_one_line_key_error(ws: Path) -> None:
    sched = _DockerWs()
    app = _app()
    apply_workspace(sched, app, str(ws), {})
    with pytest.raises(MissingImageRepoError) as e:
        sched.dryrun_push_images(app, {"image_repo": None})
    assert isinstance(e.value, KeyError) and isinstance(e.value, specs.TorchXError)
    msg = str(e.value)
    assert "-cfg image_repo=REPO" in msg and 'pass --workspace ""' in msg and "\n" not in msg
    assert not msg.startswith("'")


def test_images_not_built_from_a_workspace_are_left_alone() -> None:
    app = _app()
    assert _DockerWs().dryrun_push_images(app, {"image_repo": "r"}) == {}
    assert [r.image for r in app.roles] == [BASE, BASE]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("host", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:{port}"])
def test_push_without_daemon_names_the_way_out(
    ws: Path, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", host.format(port=_closed_port()))
    sched = _DockerWs()
    app = _app()
    apply_workspace(sched, app, str(ws), {})
    to_push = sched.dryrun_push_images(app, {"image_repo": "example.com/app"})
    sched.push_images({})  # nothing to push: Docker is not needed
    with pytest.raises(DockerUnavailableError) as e:
        sched.push_images(to_push)
    msg = str(e.value)
    assert msg.startswith("cannot reach a Docker engine (")
    assert "needed to build the workspace image" in msg
    assert msg.endswith(
        'pass --workspace "" (workspace=None in Python) to run without the workspace'
    )
    assert "\n" not in msg and len(msg) < 400


def test_push_without_docker_sdk(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # as if `docker` were not installed
    sched = _DockerWs()
    app = _app()
    apply_workspace(sched, app, str(ws), {})
    with pytest.raises(
        DockerUnavailableError, match=r"pip install 'torchx\[docker\]'.*--workspace \"\""
    ):
        sched.push_images(sched.dryrun_push_images(app, {"image_repo": "r"}))


def test_run_opts_of_the_workspace() -> None:
    opts = _DockerWs().workspace_opts()
    assert "image_repo" in opts and "quiet" in opts
    assert opts.resolve({}) == {"image_repo": None, "quiet": False}


def test_print_push_events() -> None:
    events: List[Dict[str, str]] = [
        {"status": "The push refers to repository [example.com/app]"},
        {"id": "l1", "status": "Preparing"},
        {"id": "l2", "status": "Preparing"},
        {"id": "l1", "status": "Pushing", "progress": "[==>   ]"},
        {"id": "l1", "status": "Pushed"},
    ]
    out = io.StringIO()
    print_push_events(events, stream=out)
    blue, end = "\033[34m", "\033[0m"
    head = f"{blue}docker push {end}"
    assert out.getvalue() == (
        f"{head}The push refers to repository [example.com/app]\n"
        f"{head}l1: Preparing \n"
        f"{head}l2: Preparing \n"
        f"\033[2F\033[2K{head}l1: Pushing [==>   ]\033[2E"
        f"\033[2F\033[2K{head}l1: Pushed \033[2E"
    )
    with pytest.raises(ImagePushError, match="failed to push docker image: denied") as e:
        print_push_events([{"error": "denied"}], stream=io.StringIO())
    assert isinstance(e.value, RuntimeError)
