"""local_cwd's public API beyond the Scheduler contract: idempotency tokens on disk and
upstream 0.7.0's names (``LocalOpts``, image providers, ``*_LOG``, ``close``,
``auto_set_CUDA_VISIBLE_DEVICES``), each checked for what it does."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import List

import pytest

from tests.schedulers.test_local_support import app, app_dir, home, role, run_python
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, idempotency_token
from torchx.schedulers.local_scheduler import (
    COMBINED_LOG,
    STDERR_LOG,
    STDOUT_LOG,
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
    LocalOpts,
    LocalScheduler,
    ReplicaParam,
    create_scheduler,
)

__all__ = ["home"]

pytestmark = pytest.mark.usefixtures("home")


def _keyed(token: str) -> specs.AppDef:
    a = app(role("sleep 30"))
    a.metadata[IDEMPOTENCY_TOKEN] = token
    return a


def test_find_by_idempotency_token_oldest_first_and_only_that_token() -> None:
    sched = create_scheduler("torchx")
    t1, t2 = idempotency_token("stage-a"), idempotency_token("stage-b")
    ids = [sched.submit(_keyed(t), {}) for t in (t1, t2, t1)]
    plain = sched.submit(app(role("true")), {})
    try:
        assert [a.app_id for a in sched.find_by_idempotency_token(t1)] == [ids[0], ids[2]]
        assert [a.app_id for a in sched.find_by_idempotency_token(t2)] == [ids[1]]
        assert sched.find_by_idempotency_token(idempotency_token("other")) == []
        assert all(a.state == specs.AppState.RUNNING for a in sched.find_by_idempotency_token(t1))
        request = json.loads((app_dir(ids[0]) / "request.json").read_text())
        assert request["idempotency_token"] == t1
        assert (
            json.loads((app_dir(plain) / "request.json").read_text())["idempotency_token"] is None
        )
        sched.cancel(ids[0])
        found = sched.find_by_idempotency_token(t1)
        assert [(a.app_id, a.state) for a in found] == [
            (ids[0], specs.AppState.CANCELLED),
            (ids[2], specs.AppState.RUNNING),
        ]
        # an app with a bad state file is skipped (with a warning), never breaks the lookup
        sched.cancel(ids[2])
        (app_dir(ids[2]) / "state.json").write_text("{}")
        assert [a.app_id for a in sched.find_by_idempotency_token(t1)] == [ids[0]]
    finally:
        for i in ids[:2] + [plain]:
            sched.cancel(i)


def test_find_by_idempotency_token_breaks_ties_by_app_id() -> None:
    sched = create_scheduler("torchx")
    token = idempotency_token("tie")
    ids = [sched.submit(_keyed(token), {}) for _ in range(3)]
    for i in ids:  # the same submission time for all three
        path = app_dir(i) / "request.json"
        doc = json.loads(path.read_text())
        doc["submitted"] = 1000.0
        path.write_text(json.dumps(doc))
    try:
        assert [a.app_id for a in sched.find_by_idempotency_token(token)] == sorted(ids)
    finally:
        for i in ids:
            sched.cancel(i)


TWO_WORKERS = """
from torchx import specs
from torchx.runner import get_runner
role = specs.Role("w", ".", entrypoint="sleep", args=["30"])
print(get_runner().run(specs.AppDef("t", [role]), "local_cwd", idempotency_key="k-1"))
"""


def test_a_request_is_parsed_once_and_read_again_when_its_file_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poller lists every app each round: one scheduler parses each request once, yet
    an app directory made anew under the same id (its state home restored, say) is
    read again."""
    from torchx.schedulers.local import protocol

    parsed: List[str] = []
    load = protocol.load_request
    monkeypatch.setattr(protocol, "load_request", lambda d: parsed.append(d) or load(d))
    sched = create_scheduler("torchx")
    app_id = sched.submit(app(role("true"), name="first"), {})
    assert [a.name for a in sched.list()] == ["first"]
    assert [a.name for a in sched.list()] == ["first"]
    assert len(parsed) == 1
    request_file = app_dir(app_id) / "request.json"
    request = json.loads(request_file.read_text())
    request["app"]["name"] = "second"
    replacement = request_file.with_suffix(".new")
    replacement.write_text(json.dumps(request))
    os.replace(replacement, request_file)
    assert [a.name for a in sched.list()] == ["second"]


def test_two_processes_with_one_key_get_one_app(tmp_path: Path) -> None:
    first = run_python(TWO_WORKERS, tmp_path).strip()
    second = run_python(TWO_WORKERS, tmp_path).strip()
    assert first == second
    with get_runner() as runner:
        assert [a.app_handle for a in runner.list("local_cwd")] == [first]
        runner.cancel(first)


def test_upstream_names_and_what_they_do(tmp_path: Path) -> None:
    assert (STDOUT_LOG, STDERR_LOG, COMBINED_LOG) == ("stdout.log", "stderr.log", "combined.log")
    assert set(LocalOpts.__annotations__) == {
        "log_dir",
        "prepend_cwd",
        "auto_set_cuda_visible_devices",
    }
    cfg: LocalOpts = {"log_dir": str(tmp_path)}
    r = specs.Role("w", "/some/image", entrypoint="python", args=["-c", "1"], env={"A": "1"})
    cwd = CWDImageProvider(cfg)
    assert isinstance(cwd, ImageProvider) and cwd.fetch("anything") == os.getcwd()
    assert cwd.get_replica_param(cwd.fetch_role(r), r) == ReplicaParam(
        ["python", "-c", "1"], {"A": "1"}, None, None, None, os.getcwd()
    )
    local_dir = LocalDirectoryImageProvider(cfg)
    assert local_dir.fetch(str(tmp_path)) == str(tmp_path)
    assert local_dir.get_cwd(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        local_dir.fetch(str(tmp_path / "missing"))


def test_local_directory_images_run_in_their_directory(tmp_path: Path) -> None:
    image = tmp_path / "img"
    image.mkdir()
    (image / "job.sh").write_text("echo in $(pwd)\n")
    sched = LocalScheduler("torchx", image_provider_class=LocalDirectoryImageProvider)
    a = specs.AppDef("t", [specs.Role("w", str(image), entrypoint="sh", args=["job.sh"])])
    app_id = sched.submit(a, {})
    with get_runner() as runner:
        h = f"local_cwd://torchx/{app_id}"
        assert runner.wait(h, wait_interval=0.1).state == specs.AppState.SUCCEEDED  # type: ignore[union-attr]
        assert list(runner.log_lines(h, "w")) == [f"in {image}\n"]
    logs = app_dir(app_id) / "w" / "0"
    assert sorted(p.name for p in logs.iterdir()) == sorted([STDOUT_LOG, STDERR_LOG, COMBINED_LOG])


def test_close_keeps_apps_running_and_cancellable() -> None:
    sched = create_scheduler("torchx")
    app_id = sched.submit(app(role("sleep 30")), {})
    sched.close()
    sched.close()
    other = create_scheduler("torchx")
    assert other.describe(app_id).state == specs.AppState.RUNNING  # type: ignore[union-attr]
    other.cancel(app_id)
    assert other.describe(app_id).state == specs.AppState.CANCELLED  # type: ignore[union-attr]


@pytest.fixture
def eight_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``nvidia-smi`` on PATH that lists 8 GPUs (this machine has none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\n[ "$1" = -L ] || exit 2\n'
        'for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: Fake (UUID: GPU-$i)"; done\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _visible(sched: LocalScheduler, a: specs.AppDef, auto: bool) -> List[List[str]]:
    req = sched.submit_dryrun(a, {"auto_set_cuda_visible_devices": auto}).request
    return [
        [p.env.get("CUDA_VISIBLE_DEVICES", "-") for p in params]
        for params in req.role_params.values()
    ]


def _gpu_role(name: str, n: int, gpu: int) -> specs.Role:
    return specs.Role(
        name, ".", entrypoint="true", num_replicas=n, resource=specs.Resource(1, gpu, 64)
    )


@pytest.mark.usefixtures("eight_gpus")
def test_auto_set_cuda_visible_devices() -> None:
    sched = create_scheduler("torchx")
    assert sched._cuda_device_count() == 8
    mixed = specs.AppDef("t", [_gpu_role("a", 1, 2), _gpu_role("cpu", 2, 0), _gpu_role("b", 3, 1)])
    assert _visible(sched, mixed, True) == [["0,1"], ["-", "-"], ["2", "3", "4"]]
    assert _visible(sched, mixed, False) == [["-"], ["-", "-"], ["-", "-", "-"]]
    too_many = specs.AppDef("t", [_gpu_role("a", 3, 4)])  # 12 > 8: none is set
    assert _visible(sched, too_many, True) == [["-", "-", "-"]]
    # the method itself, on replica params made by hand
    params = {"a": [ReplicaParam(["x"], {}) for _ in range(2)]}
    sched.auto_set_CUDA_VISIBLE_DEVICES(
        params, specs.AppDef("t", [_gpu_role("a", 2, 4)]), {"auto_set_cuda_visible_devices": True}
    )
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in params["a"]] == ["0,1,2,3", "4,5,6,7"]


def test_without_nvidia_smi_no_device_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    sched = create_scheduler("torchx")
    assert sched._cuda_device_count() == 0
    params = {"a": [ReplicaParam(["x"], {})]}
    sched.auto_set_CUDA_VISIBLE_DEVICES(
        params, specs.AppDef("t", [_gpu_role("a", 1, 1)]), {"auto_set_cuda_visible_devices": True}
    )
    assert params["a"][0].env == {}
