"""kubernetes pod logs (read and followed) and the CLI against kmock; the missing extra."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import Stream

from .kmock_server import (
    PODS,
    VOLCANO_JOBS,
    KMockServer,
    ddp_app,
    echo_app,
    indexed_pods,
    volcano_pods,
)

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- logs


LOG = "step 1 loss=0.9\nhéllo ✓ unicode\n\nstep 2 loss=0.5\nno newline at end"


def test_logs_keep_newlines_and_follow_streams_lines(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(ddp_app(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    volcano_pods(srv, app_id, ["Running", "Running"])
    srv.set_log(ns, f"{name}-train-1-0", LOG)
    expected = [
        "step 1 loss=0.9\n",
        "héllo ✓ unicode\n",
        "\n",
        "step 2 loss=0.5\n",
        "no newline at end",
    ]
    assert list(runner.log_lines(handle, "train", 1)) == expected
    # follow: the emulator sends 7-byte chunks that split lines and UTF-8 characters
    assert list(runner.log_lines(handle, "train", 1, should_tail=True)) == expected
    assert srv.log_requests[-1].get("follow", "").lower() == "true"
    assert list(runner.log_lines(handle, "train", 1, regex="loss")) == [expected[0], expected[3]]
    assert list(runner.log_lines(handle, "train", 0)) == []  # no log yet for replica 0
    with pytest.raises(specs.InvalidArgumentError, match="--streams combined"):
        list(runner.log_lines(handle, "train", 1, streams=Stream.STDERR))


def test_indexed_logs_find_the_pod_by_index(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    pods = indexed_pods(srv, ns, f"{name}-echo", ["Running", "Running"])
    srv.set_log(ns, pods[1], "hi 1\n")
    assert list(runner.log_lines(handle, "echo", 1)) == ["hi 1\n"]


def test_logs_read_the_newest_pod_of_a_restarted_replica(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    first = indexed_pods(srv, ns, f"{name}-echo", ["Failed", "Failed"])[1]
    retried = srv.get(PODS, ns, first)
    assert retried is not None
    retried["metadata"]["creationTimestamp"] = "2025-01-01T00:05:00Z"
    retried["status"] = {"phase": "Running"}
    srv.put(PODS, ns, f"{name}-echo-1-fghij", retried)
    srv.set_log(ns, first, "attempt 1\n")
    srv.set_log(ns, f"{name}-echo-1-fghij", "attempt 2\n")
    assert list(runner.log_lines(handle, "echo", 1)) == ["attempt 2\n"]


def test_tail_waits_for_the_pod_to_start(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(), "kubernetes", {"queue": "q"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    lines: List[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(runner.log_lines(handle, "echo", 0, should_tail=True)),
        daemon=True,
    )
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and lines == []  # no pod yet: keeps waiting while the app is pending
    srv.set_log(ns, f"{name}-echo-0-0", "hi 0\n")
    volcano_pods(srv, app_id, ["Running"])
    reader.join(timeout=20)
    assert not reader.is_alive() and lines == ["hi 0\n"]


def test_tail_of_a_finished_app_without_pods_returns(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(), "kubernetes", {"queue": "q"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})
    assert list(runner.log_lines(handle, "echo", 0, should_tail=True)) == []


# --------------------------------------------------------------------------- CLI and missing extra


def _tx(
    args: List[str], env: Dict[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def test_cli_dryrun_run_status_list_cancel(srv: KMockServer, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = _tx(
        [
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=default",
            "--workspace",
            "",
            "--dryrun",
            "dist.ddp",
            "-j",
            "1:2x2",
            "--script",
            "train.py",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    manifest = out.stdout.split("=== SCHEDULER REQUEST ===\n", 1)[1]
    (job,) = yaml.safe_load_all(manifest)
    assert job["kind"] == "Job" and [t["minAvailable"] for t in job["spec"]["tasks"]] == [1, 0]
    assert srv.names(VOLCANO_JOBS) == []  # a dry run submits nothing

    out = _tx(
        [
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=default",
            "--workspace",
            "",
            "dist.ddp",
            "-j",
            "1:2x2",
            "--script",
            "train.py",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip().splitlines()[-1]
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    assert srv.get(VOLCANO_JOBS, ns, name) is not None
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    volcano_pods(srv, f"{ns}:{name}", ["Running", "Pending"])

    out = _tx(["status", handle], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        "State: RUNNING" in out.stdout
        and "train[0]:RUNNING" in out.stdout
        and "train[1]:PENDING" in out.stdout
    )
    out = _tx(["list", "-s", "kubernetes"], env, tmp_path)
    assert out.returncode == 0 and handle in out.stdout and "RUNNING" in out.stdout
    srv.set_log(ns, f"{name}-train-1-0", "epoch 1\nepoch 2\n")
    out = _tx(["log", f"{handle}/train/1"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["train/1 epoch 1", "train/1 epoch 2"]
    out = _tx(["cancel", handle], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"{handle} CANCELLED" in out.stdout
    assert srv.get(VOLCANO_JOBS, ns, name) is None


def test_cli_missing_queue_is_one_line(srv: KMockServer, tmp_path: Path) -> None:
    out = _tx(
        ["run", "-s", "kubernetes", "--dryrun", "utils.echo"],
        dict(os.environ, PYTHONPATH=str(REPO)),
        tmp_path,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "torchx: error: Required run option 'queue' is missing for job_type=volcano;"
        " pass -cfg queue=QUEUE"
        " (a Volcano queue, e.g. default) or -cfg job_type=indexed. Given run configs: <EMPTY>"
    ]


BLOCKED = (
    "import sys; sys.modules['kubernetes'] = None; "
    "from torchx.cli.main import main; main(sys.argv[1:])"
)


def test_missing_kubernetes_extra_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCKED,
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=q",
            "--dryrun",
            "utils.echo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "torchx: error: 'kubernetes' is not installed;"
        " install it with: pip install 'torchx[kubernetes]'"
    ]
