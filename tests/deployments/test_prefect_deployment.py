"""torchx's Prefect promises in a real deployment: ``prefect server``, a ``process`` work pool,
a worker, and deployments of tests/pipelines/prefect/deployed_flows.py, shared by the module.

Every wait polls up to a deadline. Stages run ``utils.sh`` on local_cwd; a test counts a
stage's apps on the scheduler (``stage_apps``), which is what a duplicate submission or a
missed cancel would change.

``torchx reap`` runs against the same deployment: a flow WITHOUT torchx's cancel hooks
(``UNHOOKED``) is SIGKILLed, so nothing cancels its stage's app; the flow run is Crashed,
``torchx reap --dryrun`` lists the app, ``torchx reap`` cancels it. An app whose flow run
still runs is kept. Those flow runs keep their apps under their own ``TORCHX_HOME`` (a
job variable), so reap sees only them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.deployments.prefect_deployment import (
    REPO,
    PrefectDeployment,
    cancel_live_apps,
    prefect_deployment,
    stage_apps,
)
from tests.polling import poll, poll_until

pytestmark = pytest.mark.timeout(900)

FLOWS = REPO / "tests" / "pipelines" / "prefect"
TRANSIENT_ERROR = "injected transient error"  # deployed_flows.TRANSIENT_ERROR
# no on_crashed / on_cancellation hooks: a crash leaves the app running (the orphan)
UNHOOKED = """
from prefect import flow

from torchx.pipelines.prefect import submit, wait


@flow(name="torchx-unhooked")
def unhooked(key: str) -> str:
    handle = submit("utils.sh", ["sh", "-c", f"sleep 600; echo {key} done"], key=key)
    wait(handle, key=key)
    return handle
"""


@pytest.fixture(scope="module")
def prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectDeployment]:
    work = tmp_path_factory.mktemp("prefect-deployment")
    unhooked = work / "unhooked-flows"
    unhooked.mkdir()
    (unhooked / "unhooked.py").write_text(UNHOOKED)
    with prefect_deployment(
        work,
        {
            "stages": (FLOWS, "deployed_flows.py:stages"),
            "job-block": (FLOWS, "deployed_flows.py:job_block"),
            "unhooked": (unhooked, "unhooked.py:unhooked"),
        },
    ) as deployment:
        try:
            yield deployment
        finally:
            cancel_live_apps()


def _states(apps: List[Tuple[str, str]]) -> List[str]:
    return sorted(state for _, state in apps)


def _running(key: str, count: int = 1, home: str | None = None) -> List[Tuple[str, str]]:
    """Poll until the stage has ``count`` apps, one of them RUNNING."""
    return poll(
        lambda: (
            (apps := stage_apps(key, home))
            and len(apps) == count
            and apps[-1][1] == "RUNNING"
            and apps
        ),
        timeout=180,
        what=f"{count} app(s) of stage {key}, the newest RUNNING",
        every=0.2,
    )


def test_cancelling_a_flow_run_cancels_its_app(prefect: PrefectDeployment) -> None:
    fid = prefect.run("stages", {"run": "cancel", "seconds": [600]})
    _running("cancel-0")
    prefect.cancel(fid)
    prefect.wait_for_state(fid, {"CANCELLED"})
    apps = poll_until(lambda: stage_apps("cancel-0"), lambda a: _states(a) == ["CANCELLED"])
    assert _states(apps) == ["CANCELLED"], apps
    # the hook (in the worker) logs to the flow run's own log, not the worker's stdout
    logs = poll_until(
        lambda: prefect.logs(fid), lambda m: any(apps[0][0] in x and "cancel" in x for x in m)
    )
    assert any(apps[0][0] in m and "cancel" in m for m in logs), logs


@pytest.mark.parametrize("how", ["sigkill", "cancel"])
def test_a_retried_flow_run_reuses_its_succeeded_stage_and_resubmits_the_cancelled_one(
    prefect: PrefectDeployment, tmp_path: Path, how: str
) -> None:
    """Stage 0 succeeded, stage 1 runs; the flow run crashes (SIGKILL of its process) or is
    cancelled, so the hook cancels stage 1's app. Retried as the UI does, the flow run
    re-attaches to stage 0's app and submits stage 1 again (not the cancelled handle)."""
    run, gate = f"retry-{how}", tmp_path / "gate"
    fid = prefect.run("stages", {"run": run, "seconds": [0, 0], "gate": str(gate)})
    _running(f"{run}-1")
    if how == "sigkill":
        process = poll(lambda: prefect.flow_run_process(fid), what="the flow-run process")
        process.kill()
        prefect.wait_for_state(fid, {"CRASHED"})
    else:
        prefect.cancel(fid)
        prefect.wait_for_state(fid, {"CANCELLED"})
    cancelled = poll_until(lambda: stage_apps(f"{run}-1"), lambda a: _states(a) == ["CANCELLED"])
    assert _states(cancelled) == ["CANCELLED"], cancelled

    prefect.retry(fid)
    _running(f"{run}-1", count=2)
    gate.touch()
    prefect.wait_for_state(fid, {"COMPLETED"})
    assert _states(stage_apps(f"{run}-0")) == ["SUCCEEDED"]  # re-attached, not run again
    assert _states(stage_apps(f"{run}-1")) == ["CANCELLED", "SUCCEEDED"]


def test_a_transient_error_in_wait_is_retried_on_the_same_app(prefect: PrefectDeployment) -> None:
    fid = prefect.run(
        "stages", {"run": "flaky", "seconds": [5], "wait_retries": 1, "transient_error": True}
    )
    prefect.wait_for_state(fid, {"COMPLETED", "FAILED", "CRASHED"})
    logs = poll_until(lambda: prefect.logs(fid), lambda m: any(TRANSIENT_ERROR in x for x in m))
    assert any(TRANSIENT_ERROR in m for m in logs), logs  # the error did reach the wait
    assert prefect.state(fid) == "COMPLETED", logs
    assert _states(stage_apps("flaky-0")) == ["SUCCEEDED"]  # one app, never cancelled


def test_the_async_job_block_creates_its_artifacts(prefect: PrefectDeployment) -> None:
    fid = prefect.run("job-block", {"run": "block-art", "seconds": 0})
    prefect.wait_for_state(fid, {"COMPLETED", "FAILED", "CRASHED"})
    assert prefect.state(fid) == "COMPLETED", prefect.logs(fid)
    keys = prefect.artifact_keys(fid)
    assert {"torchx-replicas-block-art", "torchx-logs-block-art"} <= keys, keys
    assert _states(stage_apps("block-art")) == ["SUCCEEDED"]


def test_two_concurrent_flow_runs_get_two_apps(prefect: PrefectDeployment) -> None:
    runs = [prefect.run("stages", {"run": "twin", "seconds": [3]}) for _ in range(2)]
    for fid in runs:
        prefect.wait_for_state(fid, {"COMPLETED"})
    apps = stage_apps("twin-0")
    assert _states(apps) == ["SUCCEEDED", "SUCCEEDED"] and apps[0][0] != apps[1][0], apps


def test_torchx_home_only_in_job_variables_still_cancels(
    prefect: PrefectDeployment, tmp_path: Path
) -> None:
    """The flow run's TORCHX_HOME differs from the worker's, where the hook runs: the hook
    reaches the app through the flow run's stage record. The flow is not waiting (it
    sleeps), so only the hook can cancel the app."""
    home = str(tmp_path / "flow-run-home")
    fid = prefect.run(
        "stages",
        {"run": "elsewhere", "seconds": [600], "hook_only": True},
        {"env": {"TORCHX_HOME": home}},
    )
    _running("elsewhere-0", home=home)
    assert stage_apps("elsewhere-0") == []  # not under the worker's TORCHX_HOME
    prefect.cancel(fid)
    prefect.wait_for_state(fid, {"CANCELLED"})
    apps = poll_until(
        lambda: stage_apps("elsewhere-0", home), lambda a: _states(a) == ["CANCELLED"]
    )
    assert _states(apps) == ["CANCELLED"], apps


@pytest.fixture(scope="module")
def reap_home(
    prefect: PrefectDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The ``TORCHX_HOME`` of the unhooked flow runs (and of ``torchx reap``)."""
    home = str(tmp_path_factory.mktemp("reap-home"))
    try:
        yield home
    finally:
        cancel_live_apps(home)


@pytest.fixture(scope="module")
def live_unhooked(prefect: PrefectDeployment, reap_home: str) -> Iterator[Tuple[str, str]]:
    """``(flow run id, app handle)`` of an unhooked flow run whose app runs: an owner
    that still runs, so ``torchx reap`` must ask Prefect about it and keep its app."""
    fid = _run_unhooked(prefect, "alive", reap_home)
    try:
        (handle, _), *_ = _running("alive", home=reap_home)
        yield fid, handle
    finally:
        if prefect.state(fid) not in {"CANCELLED", "CRASHED", "COMPLETED", "FAILED"}:
            prefect.cancel(fid)
            prefect.wait_for_state(fid, {"CANCELLED"})


def _run_unhooked(prefect: PrefectDeployment, key: str, home: str) -> str:
    env = {"TORCHX_HOME": home, "TORCHX_TRACKERS": ""}
    return prefect.run("unhooked", {"key": key}, {"env": env})


def _reap(prefect: PrefectDeployment, home: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect.api_url,
        "TORCHX_HOME": home,
        "TORCHX_TRACKERS": "",
    }
    cmd = [sys.executable, "-m", "torchx.cli.main", "reap", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_reap_with_an_unreachable_prefect_is_one_line(
    prefect: PrefectDeployment, reap_home: str, live_unhooked: Tuple[str, str]
) -> None:
    out = _reap(prefect, reap_home, "--dryrun", "--prefect_url", "http://127.0.0.1:9/api")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot reach" in out.stderr


def test_reap_cancels_the_app_of_a_crashed_flow_run(
    prefect: PrefectDeployment, reap_home: str, live_unhooked: Tuple[str, str]
) -> None:
    live_fid, live = live_unhooked
    fid = _run_unhooked(prefect, "crashed", reap_home)
    (orphan, _), *_ = _running("crashed", home=reap_home)
    process = poll(lambda: prefect.flow_run_process(fid), what="the flow-run process")
    process.kill()
    prefect.wait_for_state(fid, {"CRASHED"})
    assert stage_apps("crashed", reap_home) == [(orphan, "RUNNING")]  # no hook: it runs on

    listed = _reap(prefect, reap_home, "--dryrun")
    print(listed.stdout)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert any(ln.startswith(f"ORPHAN {orphan} owner: prefect flow_run={fid}") for ln in lines)
    assert any(ln.startswith(f"kept {live} owner: prefect flow_run={live_fid}") for ln in lines)
    assert "Crashed" in listed.stdout
    assert stage_apps("crashed", reap_home) == [(orphan, "RUNNING")]  # a dry run cancels nothing

    reaped = _reap(prefect, reap_home)
    print(reaped.stdout)
    assert reaped.returncode == 0, reaped.stderr
    assert f"cancelled {orphan}" in reaped.stdout
    assert stage_apps("crashed", reap_home) == [(orphan, "CANCELLED")]
    assert stage_apps("alive", reap_home) == [(live, "RUNNING")]  # its owner still runs


def test_cancelling_an_unhooked_flow_run_cancels_its_app_through_wait(
    prefect: PrefectDeployment, reap_home: str, live_unhooked: Tuple[str, str]
) -> None:
    """No hook: the worker's cancel ends the flow run's process, whose ``wait`` cancels."""
    live_fid, live = live_unhooked
    prefect.cancel(live_fid)
    prefect.wait_for_state(live_fid, {"CANCELLED"})
    apps = poll_until(
        lambda: stage_apps("alive", reap_home), lambda a: _states(a) == ["CANCELLED"], 60, 0.2
    )
    assert apps == [(live, "CANCELLED")], apps
