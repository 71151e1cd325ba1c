"""Slurm against the real local cluster (scripts/slurm_cluster.sh: slurmctld, two slurmd
nodes, slurmdbd accounting, MinJobAge=2 so that finished jobs soon live in sacct only).

Dry runs and parsers are tested without a cluster in test_slurm_batch / test_slurm_status.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.polling import poll_until
from tests.processes import wait_for_job_processes
from torchx import specs
from torchx.components import utils
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, idempotency_token
from torchx.schedulers.slurm.scheduler import SlurmScheduler, create_scheduler

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")

# replica 0 exits 0; replica 1 fails only once replica 0's process is gone (reaped by its
# slurmstepd), so srun's kill-on-bad-exit can no longer touch replica 0
ORDERED_FAILURE = """
import os, sys, time
r = os.environ['TORCHX_REPLICA_ID']
if r == '0':
    print('replica 0')
    with open('r0.pid.tmp', 'w') as f:
        f.write(str(os.getpid()))
    os.rename('r0.pid.tmp', 'r0.pid')
    sys.exit(0)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if os.path.exists('r0.pid') and not os.path.exists('/proc/' + open('r0.pid').read()):
        break
    time.sleep(0.05)
else:
    sys.exit('replica 0 did not end within 120 s')
assert r != '1', 'replica 1 broke'
"""


@pytest.fixture(scope="module")
def cluster() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed (bash scripts/slurm_cluster.sh install && start)")
    if subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode != 0:
        if os.geteuid() != 0:
            pytest.skip("no running Slurm cluster")
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "start"], check=True, timeout=180
        )
        env = subprocess.run(
            ["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "env"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        os.environ["SLURM_CONF"] = env.strip().split("=", 1)[1]


@pytest.fixture()
def env(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tx(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


def _wait_terminal(handle: str, timeout: float = 300) -> specs.AppStatus:
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.wait(handle, wait_interval=0.5, timeout=timeout)
    assert status is not None and status.is_terminal(), status
    return status


def _wait_forgotten(job_id: str, timeout: float = 120) -> None:
    """Poll until slurmctld no longer knows the job (MinJobAge plus its purge interval)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if p.returncode != 0 or not p.stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"slurmctld still holds job {job_id} after {timeout:.0f} s (MinJobAge?)")


def _has_accounting() -> bool:
    """The default local cluster keeps accounting (slurmdbd); SLURM_CLUSTER_ACCOUNTING=jobcomp
    starts one without, where finished jobs are found through the jobcomp log only."""
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
    ).stdout
    return "accounting_storage/slurmdbd" in config


def _enforces_accounts() -> bool:
    """The local cluster checks accounts and QOS (scripts/slurm_cluster.sh since issue 37);
    one started before, or without slurmdbd, takes any account."""
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
    ).stdout
    return bool(re.search(r"AccountingStorageEnforce\s*=\s*\S*associations", config))


def _run_ordered_failure(*cfg: str) -> str:
    run = ["run", "-s", "slurm", *cfg, "utils.python", "--num_replicas", "2"]
    p = _tx(*run, "--c", ORDERED_FAILURE)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()[0]


def test_job_failing_on_one_replica_reports_that_replica(env: Path) -> None:
    handle = _run_ordered_failure()
    status = _wait_terminal(handle)
    assert status.state == specs.AppState.FAILED
    assert [r.state for r in status.roles[0].replicas] == [
        specs.AppState.SUCCEEDED,
        specs.AppState.FAILED,
    ]
    assert "python/1 (exit 1)" in status.msg
    assert "AssertionError: replica 1 broke" in status.structured_error_msg
    assert "replica 0" in _tx("log", f"{handle}/python/0").stdout
    assert handle in _tx("list", "-s", "slurm").stdout


def test_finished_job_stays_readable_after_slurmctld_forgot_it(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job_dir both machines see (deploying.md): without one, the record and the logs are
    # in this machine's $TORCHX_HOME, never in the working directory
    handle = _run_ordered_failure("-cfg", f"job_dir={env / 'job'}")
    app_id = handle.rsplit("/", 1)[1]
    _wait_terminal(handle)
    _wait_forgotten(app_id)
    status = _tx("status", handle)
    assert status.returncode == 0, status.stderr
    assert "State: FAILED" in status.stdout and "python/1 (exit 1)" in status.stdout
    assert "*python[0]:SUCCEEDED" in status.stdout and "python[1]:FAILED" in status.stdout
    desc = create_scheduler("t").describe(app_id)
    assert desc is not None
    assert [(r.state, r.hostname) for r in desc.roles_statuses[0].replicas] == [
        (specs.AppState.SUCCEEDED, "node1"),
        (specs.AppState.FAILED, "node2"),
    ]
    if _has_accounting():  # list shows finished jobs from sacct (not from a jobcomp log)
        assert handle in _tx("list", "-s", "slurm").stdout
    # another machine's $TORCHX_HOME: the record next to the logs still gives roles and logs
    monkeypatch.setenv("TORCHX_HOME", str(env / "elsewhere"))
    other = create_scheduler("t").describe(app_id)
    assert other is not None and [r.name for r in other.roles] == ["python"]
    assert "replica 0" in _tx("log", f"{handle}/python/0").stdout


def test_list_keeps_a_job_cancelled_while_held_after_slurmctld_forgot_it(env: Path) -> None:
    """sacct leaves out a job that was never eligible unless asked for ended states: a keyed
    submission that lost its race (cancelled while held) must still be listed, or a
    triggerer's poller asks about it alone, one job at a time."""
    if not _has_accounting():
        pytest.skip("the cluster keeps no accounting")
    submit = ["sbatch", "--parsable", "--hold", "-t", "1", "--wrap", "true"]
    job_id = subprocess.run(submit, capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["scancel", job_id], check=True)
    _wait_forgotten(job_id)
    listed = {a.app_id: a.state for a in create_scheduler("t").list()}
    assert listed.get(job_id) == specs.AppState.CANCELLED


def test_status_asks_about_the_one_job(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Slurm command that describe runs names the job; none lists the cluster."""
    calls = env / "calls.txt"
    spy = env / "spy"
    spy.mkdir()
    for cmd in ("squeue", "sacct", "scontrol", "sinfo"):
        real = shutil.which(cmd)
        (spy / cmd).write_text(f'#!/bin/sh\necho "{cmd} $*" >> {calls}\nexec {real} "$@"\n')
        (spy / cmd).chmod(0o755)
    handle = _run_ordered_failure()
    app_id = handle.rsplit("/", 1)[1]
    monkeypatch.setenv("PATH", f"{spy}:{os.environ['PATH']}")
    sched = create_scheduler("t")
    states = []
    deadline = time.monotonic() + 120
    while not states or not specs.is_terminal(states[-1]):  # pending/running, then finished
        assert time.monotonic() < deadline, states
        desc = sched.describe(app_id)
        assert desc is not None
        states.append(desc.state)
        time.sleep(0.3)
    monkeypatch.setenv("PATH", os.environ["PATH"].split(":", 1)[1])
    _wait_forgotten(app_id)
    monkeypatch.setenv("PATH", f"{spy}:{os.environ['PATH']}")
    desc = sched.describe(app_id)  # from accounting (or the jobcomp log) now
    assert desc is not None and desc.state == states[-1] == specs.AppState.FAILED
    # (a cluster without accounting reads its jobcomp log's path from the config)
    ours = [c.split() for c in calls.read_text().splitlines() if c != "scontrol show config"]
    assert ours and all(app_id in c for c in ours), ours
    assert {c[0] for c in ours} == {"squeue", "scontrol", "sacct"}
    assert not any("--json" in c for c in ours)


def test_hostile_env_and_args_run_nothing(env: Path) -> None:
    p = _tx("run", "-s", "slurm", "utils.sh", "--env", "A$(touch X)B=1", "touch", "Y")
    assert p.returncode == 1 and not p.stdout
    (line,) = p.stderr.strip().splitlines()
    assert "env var name 'A$(touch X)B'" in line and "Traceback" not in p.stderr
    # values and arguments are data, on the node too
    p = _tx(
        "run",
        "-s",
        "slurm",
        "--wait",
        "--log",
        "utils.sh",
        "--env",
        "V=$(touch X)`touch W`",
        "--num_replicas",
        "2",
        "sh",
        "-c",
        'printf "%s|%s\\n" "$V" "$1"',
        "-",
        "$(touch Z);'\"",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for i in (0, 1):
        assert f"sh/{i} $(touch X)`touch W`|$(touch Z);'\"" in p.stdout
    assert not [f for f in ("X", "Y", "W", "Z") if (env / f).exists()]


# each replica prints digests of what its env holds, then sleeps (argv: ``sleep 600``)
PRINTS_ITS_ENV = """
for value in "$HF_TOKEN" "$MLFLOW_TRACKING_PASSWORD" "$MLFLOW_TRACKING_URI" "$OWN"; do
    printf '%s\\n' "$(printf '%s' "$value" | sha256sum | cut -c1-16)"
done
exec sleep 600
"""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_secret_env_reaches_a_hetjob_on_no_command_line(env: Path) -> None:
    """The secrets reach each replica (with its role's own env) while no process's argv,
    the script Slurm keeps, or its job record holds one; nothing lands in the cwd."""
    token, password = "hf_" + secrets.token_hex(16), secrets.token_hex(12)
    uri = f"http://u:{password}@h:5000"
    secret_env = {"HF_TOKEN": token, "MLFLOW_TRACKING_PASSWORD": password}
    secret_env["MLFLOW_TRACKING_URI"] = uri
    owns = {"trainer": "a\nb 'c'", "reader": "$(touch X)"}  # each role's own value
    roles = []
    for name, own in owns.items():
        role = utils.sh("true", env={**secret_env, "OWN": own}).roles[0]
        role.name, role.entrypoint, role.args = name, "sh", ["-c", PRINTS_ITS_ENV]
        roles.append(role)
    from torchx.runner import get_runner

    sched = create_scheduler("t")
    with get_runner() as runner:
        handle = runner.run(specs.AppDef("secret", roles), "slurm", {})
        app_id = handle.rsplit("/", 1)[1]
        try:
            wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=120)

            def log(role: str) -> List[str]:
                return "".join(sched.log_iter(app_id, role, 0)).splitlines()

            for name, own in owns.items():
                want = [_digest(v) for v in [*secret_env.values(), own]]
                out = poll_until(partial(log, name), lambda lines: len(lines) >= 4, timeout=60)
                assert out == want, (name, out)
            # while it runs: every process's argv (srun's in the batch script too)
            argvs, sruns = [], []
            for p in psutil.process_iter(["cmdline", "environ"]):
                argvs.append("\0".join(p.info["cmdline"] or []))
                if (p.info["environ"] or {}).get("SLURM_JOB_ID") == app_id:
                    sruns += [argvs[-1]] if argvs[-1].startswith("srun\0") else []
            assert sruns, argvs  # the batch script's srun (and its helper), both groups'
            for value in (token, password):
                assert not [a for a in argvs if value in a], value
            assert all(a.count(".env\0") == 2 for a in sruns), sruns  # the files' names only
            # what Slurm keeps of the job, and shows its users
            script = subprocess.run(
                ["scontrol", "write", "batch_script", app_id, "-"],
                capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            job = subprocess.run(
                ["scontrol", "show", "job", "-dd", app_id],
                capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            assert "srun " in script and "JobId=" in job
            for value in (token, password):
                assert value not in script and value not in job
        finally:
            runner.cancel(handle)
    assert _wait_terminal(handle).state == specs.AppState.CANCELLED
    assert sorted(f.name for f in env.iterdir()) == ["home"]  # only $TORCHX_HOME, no X
    job_dir = Path(str(sched._job_dir(app_id)))
    env_files = list(job_dir.glob("torchx-*.env"))
    assert len(env_files) == 2 and job_dir.parent == env / "home" / "slurm" / "jobs"
    assert {stat.S_IMODE(f.stat().st_mode) for f in env_files} == {0o600}


def _sleeper(token: str) -> specs.AppDef:
    app = utils.sh("sleep", "600")
    app.metadata[IDEMPOTENCY_TOKEN] = token
    return app


def test_find_by_idempotency_token_oldest_first_also_once_finished(env: Path) -> None:
    sched: SlurmScheduler = create_scheduler("t")
    run = secrets.token_hex(8)  # accounting remembers earlier runs' jobs for days
    mine, other = idempotency_token(f"a/{run}"), idempotency_token(f"b/{run}")
    cfg = {"comment": "user note"}
    ids: List[str] = []
    try:
        for token in (mine, other, mine):
            ids.append(sched.submit(_sleeper(token), cfg))
        found = sched.find_by_idempotency_token(mine)
        assert [a.app_id for a in found] == [ids[0], ids[2]]
        assert all(not specs.is_terminal(a.state) for a in found)
        assert [a.app_id for a in sched.find_by_idempotency_token(other)] == [ids[1]]
        assert sched.find_by_idempotency_token(idempotency_token("nobody")) == []
        comment = subprocess.run(
            ["squeue", "-h", "-j", ids[0], "-O", "Comment:"], capture_output=True, text=True
        ).stdout.strip()
        assert comment == f"user note torchx-token={mine}"
    finally:
        for app_id in ids:
            sched.cancel(app_id)
    for app_id in ids:
        _wait_forgotten(app_id)
    if not _has_accounting():
        pytest.skip("without accounting, jobs slurmctld forgot are not searchable by comment")
    found = sched.find_by_idempotency_token(mine)  # now from accounting only
    assert [(a.app_id, a.state) for a in found] == [
        (ids[0], specs.AppState.CANCELLED),
        (ids[2], specs.AppState.CANCELLED),
    ]


def test_single_replica_job(env: Path) -> None:
    p = _tx("run", "-s", "slurm", "--wait", "--log", "utils.echo", "--msg", "one")
    assert p.returncode == 0, p.stderr
    assert "echo/0 one" in p.stdout


def test_account_and_qos_reach_the_job(env: Path) -> None:
    """The local cluster enforces associations (scripts/slurm_cluster.sh): root may charge
    "research" with QOS "high", besides its defaults (torchx, normal)."""
    if not _enforces_accounts():
        pytest.skip("this Slurm cluster does not enforce accounts (restart slurm_cluster.sh)")
    p = _tx(
        "run", "-s", "slurm", "-cfg", "account=research,qos=high", "--wait", "--log",
        "utils.sh", "--num_replicas", "2", "echo", "charged",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("charged") == 2, p.stdout
    job_id = p.stdout.splitlines()[0].rsplit("/", 1)[1]
    deadline = time.monotonic() + 60  # accounting records the job shortly after it ends
    while True:
        out = subprocess.run(
            ["sacct", "-P", "-n", "-j", job_id, "-o", "JobID,Account,QOS"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        groups = {line for line in out.splitlines() if "." not in line.split("|")[0]}
        if len(groups) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {g.split("|", 1)[1] for g in groups} == {"research|high"}, out


@pytest.mark.parametrize(
    "cfg, slurm_says",
    [("account=nosuch", "Invalid account"), ("qos=nosuch", "Invalid qos specification")],
)
def test_an_account_or_qos_slurm_does_not_know_is_its_error_in_one_line(
    env: Path, cfg: str, slurm_says: str
) -> None:
    if not _enforces_accounts():
        pytest.skip("this Slurm cluster does not enforce accounts (restart slurm_cluster.sh)")
    p = _tx("run", "-s", "slurm", "-cfg", cfg, "utils.sh", "touch", str(env / "ran"))
    assert p.returncode == 1, p
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("torchx: error: sbatch") and slurm_says in p.stderr, p.stderr
    assert not (env / "ran").exists()


def test_cancel_leaves_no_process(env: Path) -> None:
    handle = _tx(
        "run", "-s", "slurm", "utils.sh", "--num_replicas", "2", "sleep", "600"
    ).stdout.splitlines()[0]
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=60)
    assert "State: RUNNING" in _tx("status", handle).stdout
    assert _tx("cancel", handle).returncode == 0
    assert _wait_terminal(handle).state == specs.AppState.CANCELLED
    _, alive = psutil.wait_procs(sleeps, timeout=30)
    assert alive == []


@pytest.mark.slow
@pytest.mark.parametrize("j", ["2x1", "1:2x1"])
def test_reference_training_across_both_nodes(env: Path, j: str) -> None:
    data = env / "data"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "apps" / "datapreproc.py"),
            "--output_path",
            str(data),
            "--limit",
            "600",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    p = _tx(
        "run",
        "-s",
        "slurm",
        "--wait",
        "-cfg",
        f"job_dir={env / 'job'}",
        f"{ROOT}/examples/components.py:trainer",
        "--data_path",
        str(data),
        "--output_path",
        str(env / "model"),
        "--checkpoint_path",
        str(env / "ckpt"),
        "-j",
        j,
        "--epochs",
        "3",
        "--rdzv_port",
        "29811" if j == "2x1" else "29812",
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    handle = p.stdout.splitlines()[0]
    status = _wait_terminal(handle)
    assert status.state == specs.AppState.SUCCEEDED
    assert [r.hostname for r in status.roles[0].replicas] == ["node1", "node2"]
    logs = _tx("log", handle).stdout
    assert "world_size=2" in logs and logs.count("wrote model to") == 1
    assert (env / "model" / "model.pt").exists()
