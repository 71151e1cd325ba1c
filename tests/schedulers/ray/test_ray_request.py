"""What a Ray job asks for, before anything is sent (``--dryrun``, the request itself): no
head needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchx.components.dist import ddp
from torchx.schedulers.ray_driver import bundle, decode_request, encode_request
from torchx.schedulers.ray_scheduler import create_scheduler

TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")


def test_gpus_are_asked_of_the_placement_group_on_ray(tmp_path: Path) -> None:
    dry = subprocess.run(
        [TORCHX, "run", "--dryrun", "-s", "ray", "dist.ddp", "-j", "2x2", "--gpu", "1"]
        + ["--script", "train.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("[2 cpu, 1 gpu]") == 2, dry.stdout  # the role's resource, per node
    job = create_scheduler("t").submit_dryrun(ddp(script="train.py", j="2x2", gpu=1), {}).request
    assert [bundle(r) for r in job.replicas] == [{"CPU": 2.0, "GPU": 1.0}] * 2


def test_the_request_travels_with_the_job_and_names_no_submitter_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = create_scheduler("t").submit_dryrun(ddp(script="train.py", j="2x1"), {}).request
    request = job.request
    assert decode_request(encode_request(request)) == request
    assert job.upload_dir == str(tmp_path) and request["working_dir"] == ""
    text = repr(request)
    assert sys.prefix not in text and str(tmp_path) not in text  # nothing of this machine
    assert "uploads" in repr(job) and "python -m torchx.schedulers.ray_driver" in repr(job)
    on_cluster = create_scheduler("t").submit_dryrun(
        ddp(script="train.py", j="2x1"), {"working_dir": "/mnt/code"}
    )
    assert on_cluster.request.upload_dir is None
    assert on_cluster.request.request["working_dir"] == "/mnt/code"
