"""The reference stages under torchx on local_cwd, with real torchrun (gloo) and real faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.polling import poll
from tests.processes import job_processes
from torchx import specs
from torchx.runner import get_runner

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = str(ROOT / "examples" / "components.py")
TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    for k in ("TORCHX_TRACKERS", "TORCHXCONFIG", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("data") / "digits")
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "apps" / "datapreproc.py"), "--output_path", out],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_datapreproc_reads_sklearns_digits_without_importing_sklearn(tmp_path: Path) -> None:
    """The stage reads the file scikit-learn ships (importing sklearn costs more CPU than
    the stage's work): the same rows, in the same order, as ``load_digits``."""
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import datapreproc\n"
        "x, y = datapreproc.load_digits()\n"
        "assert 'sklearn' not in sys.modules, 'sklearn was imported'\n"
        "np.save(sys.argv[2], np.column_stack([x, y]))"
    )
    out = tmp_path / "digits.npy"
    apps = str(ROOT / "examples" / "apps")
    done = subprocess.run([sys.executable, "-c", code, apps, str(out)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    assert np.array_equal(np.load(out), np.column_stack([x, y]))


def _workers(handle: str) -> List[psutil.Process]:
    return [p for p in job_processes(handle) if "LOCAL_RANK" in (p.info["environ"] or {})]


def _logs(runner, handle: str) -> str:  # type: ignore[no-untyped-def]
    app = runner.describe(handle)
    return "".join(
        line
        for r in app.roles
        for k in range(r.num_replicas)
        for line in runner.log_lines(handle, r.name, k)
    )


def _train(runner, data: str, tmp_path: Path, *extra: str) -> str:  # type: ignore[no-untyped-def]
    return runner.run_component(
        COMPONENTS + ":trainer",
        [
            "--data_path",
            data,
            "--output_path",
            str(tmp_path / "model"),
            "--checkpoint_path",
            str(tmp_path / "ckpt"),
            *extra,
        ],
        "local_cwd",
    )


def test_chain_through_the_cli_reaches_accuracy(data: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    model, ev = tmp_path / "model", tmp_path / "eval"
    t = subprocess.run(
        [
            TORCHX,
            "run",
            "-s",
            "local_cwd",
            COMPONENTS + ":trainer",
            "--data_path",
            data,
            "--output_path",
            str(model),
            "--checkpoint_path",
            str(tmp_path / "ckpt"),
            "-j",
            "1x2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert t.returncode == 0, t.stderr
    e = subprocess.run(
        [
            TORCHX,
            "run",
            "-s",
            "local_cwd",
            COMPONENTS + ":evaluate",
            "--model_path",
            str(model),
            "--data_path",
            data,
            "--output_path",
            str(ev),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert e.returncode == 0, e.stderr
    accuracy = json.loads((ev / "metrics.json").read_text())["test_accuracy"]
    assert accuracy >= 0.95, accuracy
    assert (ev / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"


def test_killed_worker_restarts_group_and_resumes_from_checkpoint(
    data: str, tmp_path: Path
) -> None:
    with get_runner() as runner:
        h = _train(
            runner,
            data,
            tmp_path,
            "-j",
            "1x2",
            "--max_restarts",
            "2",
            "--epochs",
            "6",
            "--step_delay",
            "0.15",
            "--checkpoint_every",
            "5",
        )
        poll(lambda: list((tmp_path / "ckpt").glob("ckpt-*.pt")), timeout=120, what="a checkpoint")
        victim = _workers(h)[0]
        victim.kill()
        status = runner.wait(h, wait_interval=1, timeout=600)
        logs = _logs(runner, h)
    assert status.state == specs.AppState.SUCCEEDED, (status, logs[-3000:])
    resumed = [
        int(line.split("resumed from step=")[1].split()[0])
        for line in logs.splitlines()
        if "resumed from step=" in line
    ]
    assert resumed and min(resumed) > 0, logs[-3000:]
    assert (tmp_path / "model" / "model.pt").exists()


def test_node_loss_elastic_job_continues_on_the_remaining_node(data: str, tmp_path: Path) -> None:
    with get_runner() as runner:
        h = _train(
            runner,
            data,
            tmp_path,
            "-j",
            "1:2x1",
            "--max_restarts",
            "3",
            "--epochs",
            "6",
            "--step_delay",
            "0.15",
            "--checkpoint_every",
            "5",
            "--rdzv_port",
            "29731",
        )
        poll(lambda: list((tmp_path / "ckpt").glob("ckpt-*.pt")), timeout=120, what="a checkpoint")
        state = json.loads(
            (
                Path(os.environ["TORCHX_HOME"])
                / "local_cwd"
                / "torchx"
                / h.rsplit("/", 1)[1]
                / "state.json"
            ).read_text()
        )
        agent = psutil.Process([r["pid"] for r in state["replicas"] if r["id"] == 1][0])
        tree = [agent] + agent.children(recursive=True)
        for p in tree:  # the whole node goes away
            p.kill()
        status = runner.wait(h, wait_interval=1, timeout=600)
        logs = _logs(runner, h)
    assert status.state == specs.AppState.SUCCEEDED, (status, logs[-3000:])
    assert "world_size=1" in logs.split("resumed from step=")[-1]
    assert logs.count("wrote model to") == 1
    assert (tmp_path / "model" / "model.pt").exists()


def test_exhausted_restarts_fail_with_the_workers_exception(tmp_path: Path) -> None:
    with get_runner() as runner:
        h = _train(
            runner, str(tmp_path / "no-such-data"), tmp_path, "-j", "1x2", "--max_restarts", "1"
        )
        status = runner.wait(h, wait_interval=1, timeout=600)
    assert status.state == specs.AppState.FAILED
    assert (
        "FileNotFoundError" in status.error_summary() and "no-such-data" in status.error_summary()
    )
    out = subprocess.run(
        [TORCHX, "status", h], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert "FileNotFoundError" in out.stdout


def test_cancel_training_leaves_nothing_running(data: str, tmp_path: Path) -> None:
    with get_runner() as runner:
        h = _train(
            runner,
            data,
            tmp_path,
            "-j",
            "2x2",
            "--epochs",
            "50",
            "--step_delay",
            "0.2",
            "--rdzv_port",
            "29741",
        )
        poll(lambda: len(_workers(h)) == 4, timeout=120, what="4 workers")
        procs = job_processes(h)
        runner.cancel(h)
        assert runner.wait(h, timeout=120).state == specs.AppState.CANCELLED
    _, alive = psutil.wait_procs(procs, timeout=30)
    assert alive == [] and job_processes(h) == []
