"""``torchx reap`` against a real Prefect deployment (server, process pool, worker): a flow
WITHOUT torchx's cancel hooks is SIGKILLed, so nothing cancels its stage's app; the flow
run is Crashed, ``torchx reap --dryrun`` lists the app, ``torchx reap`` cancels it. An app
whose flow run still runs is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.deployments.prefect_deployment import (
    PrefectDeployment,
    cancel_live_apps,
    prefect_deployment,
    stage_apps,
)
from tests.polling import poll

pytestmark = pytest.mark.timeout(900)

# no on_crashed / on_cancellation hooks: a crash leaves the app running (the orphan)
FLOWS = """
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
    work = tmp_path_factory.mktemp("prefect-reap")
    flows = work / "flows"
    flows.mkdir()
    (flows / "unhooked.py").write_text(FLOWS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHX_HOME", str(work / "torchx_home"))  # the worker's and flow runs'
        mp.setenv("TORCHX_TRACKERS", "")
        with prefect_deployment(work, flows, {"unhooked": "unhooked.py:unhooked"}) as d:
            try:
                yield d
            finally:
                cancel_live_apps()


def _running(key: str) -> List[Tuple[str, str]]:
    return poll(
        lambda: (apps := stage_apps(key)) and apps[-1][1] == "RUNNING" and apps,
        timeout=180,
        what=f"a RUNNING app of stage {key}",
    )


def _reap(prefect: PrefectDeployment, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_API_URL": prefect.api_url}
    cmd = [sys.executable, "-m", "torchx.cli.main", "reap", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_reap_cancels_the_app_of_a_crashed_flow_run(prefect: PrefectDeployment) -> None:
    live_fid = prefect.run("unhooked", {"key": "alive"})
    (live, _), *_ = _running("alive")
    fid = prefect.run("unhooked", {"key": "crashed"})
    (orphan, _), *_ = _running("crashed")
    process = poll(lambda: prefect.flow_run_process(fid), what="the flow-run process")
    process.kill()
    prefect.wait_for_state(fid, {"CRASHED"})
    assert stage_apps("crashed") == [(orphan, "RUNNING")]  # no hook: it runs on

    listed = _reap(prefect, "--dryrun")
    print(listed.stdout)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert any(ln.startswith(f"ORPHAN {orphan} owner: prefect flow_run={fid}") for ln in lines)
    assert any(ln.startswith(f"kept {live} owner: prefect flow_run={live_fid}") for ln in lines)
    assert "Crashed" in listed.stdout
    assert stage_apps("crashed") == [(orphan, "RUNNING")]  # a dry run cancels nothing

    reaped = _reap(prefect)
    print(reaped.stdout)
    assert reaped.returncode == 0, reaped.stderr
    assert f"cancelled {orphan}" in reaped.stdout
    assert stage_apps("crashed") == [(orphan, "CANCELLED")]
    assert stage_apps("alive") == [(live, "RUNNING")]  # its owner still runs

    prefect.cancel(live_fid)  # no hook either: cancel its app through reap once it ends
    prefect.wait_for_state(live_fid, {"CANCELLED"})
    poll(lambda: stage_apps("alive")[-1][1] == "CANCELLED" or None, 60, "wait cancelled it")


def test_reap_with_an_unreachable_prefect_is_one_line(
    prefect: PrefectDeployment, tmp_path: Path
) -> None:
    fid = prefect.run("unhooked", {"key": "unreachable"})
    _running("unreachable")
    try:
        out = _reap(prefect, "--dryrun", "--prefect_url", "http://127.0.0.1:9/api")
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "cannot reach" in out.stderr
    finally:
        prefect.cancel(fid)
        prefect.wait_for_state(fid, {"CANCELLED"})
