"""Tracker API and the fsspec backend (local dir and memory://)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchx.cli import cmd_tracker as render
from torchx.runner.resource_hours import run_metrics, stage_hours
from torchx.trackers.api import (
    AppRun,
    FactoryBackend,
    TrackerConfigError,
    build_trackers,
    tracker_backend,
    tracker_config_env_var_name,
)


@pytest.fixture(params=["local", "memory"])
def tracker(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    url = str(tmp_path / "tracking") if request.param == "local" else f"memory://t-{tmp_path.name}"
    return build_trackers({"fsspec": url})[0]


def test_metadata_artifacts_and_metrics(tracker) -> None:  # type: ignore[no-untyped-def]
    tracker.add_metadata("job-a", stage="train", lr=0.1)
    tracker.add_metadata("job-a", epochs=3)
    tracker.add_artifact("job-a", "model", "/tmp/model", {"type": "model"})
    tracker.log_metrics("job-a", {"loss": 0.5}, step=1)
    assert tracker.metadata("job-a") == {"stage": "train", "lr": 0.1, "epochs": 3}
    assert tracker.artifacts("job-a")["model"].path == "/tmp/model"
    assert tracker.metrics("job-a") == [{"metrics": {"loss": 0.5}, "step": 1}]


def test_a_batch_of_steps_is_one_append_read_back_step_by_step(tracker) -> None:  # type: ignore[no-untyped-def]
    batch = [({"loss": 1.0 / s}, s, 1000 + s) for s in range(1, 4)]
    tracker.log_metrics_batch("job-b", batch)
    files = [p for p in tracker.fs.find(tracker.root) if "/metrics/" in p]
    assert len(files) == 1  # one append (job-b is the only run with metrics here)
    steps = [(r["step"], r["timestamp"], r["metrics"]["loss"]) for r in tracker.metrics("job-b")]
    assert steps == [(s, 1000 + s, 1.0 / s) for s in range(1, 4)]


def test_a_tracker_without_run_metrics_sums_no_resource_hours(tracker) -> None:  # type: ignore[no-untyped-def]
    """fsspec keeps no backend run ids nor latest metrics: a pipeline run's stage hours are
    None there (not an error), as for any tracker that does not override them."""
    tracker.set_parent("stage-1", "pipe")
    tracker.log_metrics("stage-1", {"cpu_hours": 1.0})
    assert not tracker.keeps_metrics and tracker.backend_run_id("stage-1") is None
    assert tracker.latest_metrics("stage-1") == {}
    assert list(tracker.run_ids(parent_run_id="pipe")) == ["stage-1"]
    assert stage_hours(tracker, "pipe") is None and run_metrics(tracker, "stage-1") == {}


def test_lineage_both_ways_and_rendering(tracker) -> None:  # type: ignore[no-untyped-def]
    for job, stage in (("prep", "datapreproc"), ("train", "train"), ("eval", "evaluate")):
        tracker.add_metadata(job, stage=stage)
        tracker.set_parent(job, "pipeline")
    tracker.add_source("train", "prep", "dataset")
    tracker.add_source("eval", "train", "model")
    tracker.add_source("eval", "prep", "dataset")
    up = tracker.lineage("eval")
    assert {(e.source, e.target, e.artifact) for e in up.edges} == {
        ("train", "eval", "model"),
        ("prep", "eval", "dataset"),
        ("prep", "train", "dataset"),
    }
    down = tracker.lineage("prep")
    assert {e.target for e in down.downstream("prep")} == {"train", "eval"}
    text = render.as_text(up)
    assert "<- model <- train [train]" in text and "<- dataset <- prep [datapreproc]" in text
    assert '"train" -> "eval" [label="model"]' in render.as_dot(up)
    assert "-->|model|" in render.as_mermaid(up)
    assert sorted(tracker.run_ids(parent_run_id="pipeline")) == ["eval", "prep", "train"]
    assert [s.source_run_id for s in tracker.sources("eval", "model")] == ["train"]


def test_app_run_outside_torchx_is_a_quiet_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHX_JOB_ID", raising=False)
    AppRun.run_from_env.cache_clear()
    run = AppRun.run_from_env()
    run.add_metadata(a=1)
    run.log_metrics({"x": 1.0})
    assert run.job_id() == "<UNDEFINED>" and list(run.sources()) == []
    AppRun.run_from_env.cache_clear()


def test_app_run_from_env_in_a_job_process(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    env = {
        "TORCHX_JOB_ID": "local_cwd://torchx/job-1",
        "TORCHX_PARENT_RUN_ID": "pipe",
        "TORCHX_TRACKERS": "fsspec",
        tracker_config_env_var_name("fsspec"): url,
        "PATH": "/usr/bin:/bin",
    }
    code = (
        "from torchx.tracker import app_run_from_env as r; "
        "r().add_source('prep', 'dataset'); r().add_metadata(ok=1)"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    t = build_trackers({"fsspec": url})[0]
    assert [s.source_run_id for s in t.sources("local_cwd://torchx/job-1")] == ["prep"]
    assert list(t.run_ids(parent_run_id="pipe")) == ["local_cwd://torchx/job-1"]


def test_bad_tracker_configs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TrackerConfigError, match="unknown tracker 'nope'.*fsspec, mlflow"):
        tracker_backend("nope", None).validate()
    with pytest.raises(TrackerConfigError, match="needs a config"):
        tracker_backend("fsspec", None).validate()
    bad = tmp_path / "cfg"
    bad.write_text("protocol=file\n")
    with pytest.raises(TrackerConfigError, match="root_path"):
        tracker_backend("fsspec", str(bad)).validate()


def test_a_failed_submit_leaves_no_run_and_nothing_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler refuses the job (its log_dir is under a file): the fsspec tracker
    records nothing (no run with an empty id), and the backend forgets the opened run."""
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    (tmp_path / "file").write_text("")
    trackers = {"fsspec": str(tmp_path / "tracking")}
    with get_runner(trackers=trackers) as runner:
        with pytest.raises(NotADirectoryError):
            cfg = {"log_dir": str(tmp_path / "file" / "logs")}
            runner.run_component("utils.sh", ["true"], "local_cwd", cfg=cfg)
        backend = runner._tracking.backends(trackers)[0]
        assert isinstance(backend, FactoryBackend) and backend._pending == {}
    found = [p for p in (tmp_path / "tracking").rglob("*") if p.is_file()]
    assert found == []
