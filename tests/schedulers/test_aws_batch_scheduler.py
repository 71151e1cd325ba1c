"""aws_batch scheduler against moto (server mode, Batch without Docker) through boto3.

moto marks a submitted job SUCCEEDED at once (or FAILED with MOTO_SIMPLE_BATCH_FAIL_AFTER);
tests play AWS Batch for the states in between by editing moto's job objects."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from torchx import specs
from torchx.components.dist import ddp
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, InvalidAppError, Stream, idempotency_token
from torchx.schedulers.aws_batch_scheduler import (
    CANCEL_REASON,
    TAG_IDEMPOTENCY_TOKEN,
    AWSBatchError,
    create_scheduler,
)

from .moto_server import REGION, MotoBatchServer

REPO = Path(__file__).resolve().parents[2]
QUEUE = "torchx-q"


def _ddp() -> specs.AppDef:
    """The reference training stage: elastic DDP on 1 to 2 nodes x 2 processes."""
    return ddp(
        "--epochs",
        "1",
        script="train.py",
        j="1:2x2",
        cpu=2,
        gpu=2,
        memMB=4096,
        name="trainer",
        max_retries=2,
    )


def _role(name: str, n: int = 1, **kw: Any) -> specs.Role:
    return specs.Role(
        name=name,
        image="alpine",
        entrypoint="bash",
        args=["-c", f"echo {specs.macros.replica_id}"],
        num_replicas=n,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        **kw,
    )


def _validate(operation: str, params: Dict[str, Any]) -> None:
    """botocore's own parameter validation for ``operation`` (what boto3 checks before sending)."""
    import boto3
    from botocore.validate import validate_parameters

    client = boto3.client("batch", region_name=REGION)
    validate_parameters(params, client.meta.service_model.operation_model(operation).input_shape)


def _job_id(handle: str) -> str:
    sched = get_runner()._scheduler("aws_batch")
    job = sched._get_job(specs.parse_app_handle(handle).app_id)  # type: ignore[attr-defined]
    assert job is not None
    return str(job["jobId"])


def _states(status: specs.AppStatus) -> Dict[str, List[specs.AppState]]:
    return {r.role: [x.state for x in r.replicas] for r in status.roles}


def _status(runner: Any, handle: str) -> specs.AppStatus:
    status = runner.status(handle)
    assert status is not None, handle
    return status


# ------------------------------------------------------------------------ job definitions (dry run)


def test_ddp_job_definition_key_fields(moto: MotoBatchServer) -> None:
    cfg: Dict[str, specs.CfgVal] = {
        "queue": QUEUE,
        "user": "alice",
        "privileged": True,
        "share_id": "teamA",
        "priority": 7,
        "job_role_arn": "arn:aws:iam::123456789012:role/job",
        "execution_role_arn": "arn:aws:iam::123456789012:role/exec",
    }
    app = _ddp()
    app.metadata["team"] = "vision"
    info = get_runner().dryrun(app, "aws_batch", cfg)
    req = info.request
    jd = req.job_def
    _validate("RegisterJobDefinition", jd)
    _validate("SubmitJob", req.submit_args)
    assert jd["type"] == "multinode" and jd["jobDefinitionName"] == req.name
    assert jd["nodeProperties"]["numNodes"] == 2 and jd["nodeProperties"]["mainNode"] == 0
    (node_range,) = jd["nodeProperties"]["nodeRangeProperties"]  # one entry per role
    assert node_range["targetNodes"] == "0:1"
    c = node_range["container"]
    assert c["resourceRequirements"] == [
        {"type": "VCPU", "value": "2"},
        {"type": "MEMORY", "value": "4096"},
        {"type": "GPU", "value": "2"},
    ]
    assert c["linuxParameters"]["sharedMemorySize"] == 4096
    assert c["privileged"] is True and c["logConfiguration"] == {"logDriver": "awslogs"}
    assert c["jobRoleArn"].endswith("role/job") and c["executionRoleArn"].endswith("role/exec")
    assert c["command"][:2] == ["bash", "-c"]
    cmd = c["command"][2]
    assert (
        "torchrun" in cmd
        and "--nnodes 1:2" in cmd
        and "--nproc_per_node 2" in cmd
        and "train.py --epochs 1" in cmd
    )
    # rendezvous on the main node's address (unset on the main node itself -> localhost)
    assert "--rdzv_endpoint ${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:=localhost}:29500" in cmd
    assert "is_host=$([ $AWS_BATCH_JOB_NODE_INDEX = 0 ]" in cmd  # replica id from the node index
    env = {e["name"]: e["value"] for e in c["environment"]}
    assert env["TORCHX_ROLE_IDX"] == "0" and env["TORCHX_ROLE_NAME"] == "train"
    assert env["PYTHONUNBUFFERED"] == "1"  # prints reach CloudWatch (and stall checks)
    assert env["TORCHX_JOB_ID"] == f"aws_batch://torchx/{QUEUE}:{req.name}"
    assert jd["retryStrategy"] == {
        "attempts": 3,
        "evaluateOnExit": [{"onExitCode": "0", "action": "EXIT"}],
    }
    assert jd["schedulingPriority"] == 7
    assert jd["tags"] == {
        "torchx.pytorch.org/version": jd["tags"]["torchx.pytorch.org/version"],
        "torchx.pytorch.org/app-name": "trainer",
        "torchx.pytorch.org/app-id": f"{QUEUE}:{req.name}",
        "torchx.pytorch.org/user": "alice",
        "team": "vision",
    }
    assert (
        req.submit_args["shareIdentifier"] == "teamA"
        and req.submit_args["schedulingPriorityOverride"] == 7
    )
    assert yaml.safe_load(str(info)) == {"registerJobDefinition": jd, "submitJob": req.submit_args}


def test_multi_role_node_ranges_mounts_and_devices(moto: MotoBatchServer) -> None:
    worker = _role("worker", n=3)
    worker.resource = specs.Resource(
        cpu=96,
        gpu=8,
        memMB=1_000_000,
        capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
        devices={"vpc.amazonaws.com/efa": 2},
    )
    worker.mounts = [
        specs.BindMount("/data", "/mnt/data", read_only=True),
        specs.VolumeMount("fs-1234", "/efs"),
        specs.DeviceMount("/dev/fuse", "/dev/fuse", "rw"),
    ]
    app = specs.AppDef("mixed", [_role("ps"), worker])
    jd = get_runner().dryrun(app, "aws_batch", {"queue": QUEUE}).request.job_def
    _validate("RegisterJobDefinition", jd)
    ps_range, worker_range = jd["nodeProperties"]["nodeRangeProperties"]
    assert jd["nodeProperties"]["numNodes"] == 4
    assert (ps_range["targetNodes"], worker_range["targetNodes"]) == ("0:0", "1:3")
    assert ps_range["container"]["command"] == ["bash", "-c", "echo $AWS_BATCH_JOB_NODE_INDEX"]
    assert worker_range["container"]["command"] == [
        "bash",
        "-c",
        "echo $((AWS_BATCH_JOB_NODE_INDEX-1))",
    ]
    c = worker_range["container"]
    assert c["instanceType"] == "p4d.24xlarge"
    assert c["volumes"] == [
        {"name": "mount_0", "host": {"sourcePath": "/data"}},
        {"name": "mount_1", "efsVolumeConfiguration": {"fileSystemId": "fs-1234"}},
    ]
    assert c["mountPoints"] == [
        {"containerPath": "/mnt/data", "readOnly": True, "sourceVolume": "mount_0"},
        {"containerPath": "/efs", "readOnly": False, "sourceVolume": "mount_1"},
    ]
    assert c["linuxParameters"]["devices"] == [
        {"hostPath": "/dev/fuse", "containerPath": "/dev/fuse", "permissions": ["READ", "WRITE"]},
        {
            "hostPath": "/dev/infiniband/uverbs0",
            "containerPath": "/dev/infiniband/uverbs0",
            "permissions": ["READ", "WRITE", "MKNOD"],
        },
        {
            "hostPath": "/dev/infiniband/uverbs1",
            "containerPath": "/dev/infiniband/uverbs1",
            "permissions": ["READ", "WRITE", "MKNOD"],
        },
    ]


@pytest.mark.parametrize(
    "app, cfg, exc, needle",
    [
        (
            lambda: specs.AppDef("a", [_role("r")]),
            {},
            specs.InvalidRunConfigException,
            "Required run option 'queue' is missing",
        ),
        (
            lambda: specs.AppDef("a", [_role(f"r{i}") for i in range(6)]),
            {"queue": QUEUE},
            InvalidAppError,
            "at most 5 roles",
        ),
        (
            lambda: specs.AppDef(
                "a", [specs.Role("r", "img", entrypoint="x", resource=specs.Resource(1, 0, 0))]
            ),
            {"queue": QUEUE},
            InvalidAppError,
            "memMB > 0",
        ),
    ],
)
def test_bad_input_is_one_specific_error(
    moto: MotoBatchServer, app: Any, cfg: Dict[str, Any], exc: type, needle: str
) -> None:
    with pytest.raises(exc) as e:
        get_runner().dryrun(app(), "aws_batch", cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- lifecycle in moto


def test_submit_status_list_cancel_through_runner(moto: MotoBatchServer) -> None:
    runner = get_runner()
    info = runner.dryrun(_ddp(), "aws_batch", {"queue": QUEUE})
    handle = runner.schedule(info)
    assert handle == f"aws_batch://torchx/{QUEUE}:{info.request.name}"
    batch = moto.client("batch")
    (jd,) = batch.describe_job_definitions(jobDefinitionName=info.request.name)["jobDefinitions"]
    assert jd["type"] == "multinode" and jd["tags"]["torchx.pytorch.org/app-name"] == "trainer"
    job_id = _job_id(handle)
    (job,) = batch.describe_jobs(jobs=[job_id])["jobs"]
    assert job["nodeProperties"] == info.request.job_def["nodeProperties"]
    assert job["jobQueue"].endswith(f"job-queue/{QUEUE}")
    assert job["tags"]["torchx.pytorch.org/app-name"] == "trainer"

    # moto finishes jobs at once
    status = _status(runner, handle)
    assert status.state == specs.AppState.SUCCEEDED and _states(status) == {
        "train": [specs.AppState.SUCCEEDED] * 2
    }

    # play Batch: the job is running, its node jobs exist, node 1 is still starting
    moto.set_status(job_id, "RUNNABLE")
    assert _status(runner, handle).state == specs.AppState.PENDING
    moto.set_status(job_id, "RUNNING")
    moto.add_node_jobs(job_id, ["RUNNING", "STARTING"])
    status = _status(runner, handle)
    assert status.state == specs.AppState.RUNNING
    assert _states(status) == {"train": [specs.AppState.RUNNING, specs.AppState.PENDING]}
    assert str(status.ui_url).endswith(f"#jobs/mnp-job/{job_id}")

    other = get_runner()  # another process: everything comes from Batch
    listed = {a.app_handle: a for a in other.list("aws_batch")}
    assert listed[handle].state == specs.AppState.RUNNING and listed[handle].name == "trainer"
    app = other.describe(handle)
    assert app is not None and [(r.name, r.num_replicas, r.resource.memMB) for r in app.roles] == [
        ("train", 2, 4096)
    ]

    runner.cancel(handle)
    assert moto.job(job_id).stop is True and moto.job(job_id).job_stopped_reason == CANCEL_REASON
    moto.set_status(job_id, "FAILED")  # Batch: a terminated job ends FAILED with our reason
    status = _status(get_runner(), handle)
    assert status.state == specs.AppState.CANCELLED
    assert _states(status) == {"train": [specs.AppState.CANCELLED] * 2}
    runner.cancel(handle)  # finished: nothing to do


def test_failed_nodes_report_why(moto: MotoBatchServer) -> None:
    runner = get_runner()
    handle = runner.run(_ddp(), "aws_batch", {"queue": QUEUE})
    job_id = _job_id(handle)
    moto.set_status(job_id, "FAILED", reason="Essential container in task exited")
    moto.add_node_jobs(job_id, ["SUCCEEDED", "FAILED"])
    moto.set_status(
        f"{job_id}#1", "FAILED", reason="OutOfMemoryError: Container killed due to memory usage"
    )
    status = _status(runner, handle)
    assert status.state == specs.AppState.FAILED
    assert status.msg == "Essential container in task exited"
    assert _states(status) == {"train": [specs.AppState.SUCCEEDED, specs.AppState.FAILED]}
    assert "OutOfMemoryError" in status.roles[0].replicas[1].structured_error_msg
    assert status.error_summary().startswith("FAILED: OutOfMemoryError")


def test_job_failed_by_the_emulator(moto: MotoBatchServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")  # the in-process server reads it
    runner = get_runner()
    handle = runner.run(specs.AppDef("boom", [_role("r")]), "aws_batch", {"queue": QUEUE})
    status = runner.wait(handle, wait_interval=0.1, timeout=10)
    assert status is not None and status.state == specs.AppState.FAILED


def test_list_shows_only_torchx_jobs_in_every_queue(moto: MotoBatchServer) -> None:
    moto.create_queue("other-q")
    batch = moto.client("batch")
    batch.register_job_definition(
        jobDefinitionName="plain",
        type="container",
        containerProperties={"image": "a", "vcpus": 1, "memory": 128},
    )
    batch.submit_job(jobName="not-torchx", jobQueue=QUEUE, jobDefinition="plain")
    runner = get_runner()
    h1 = runner.run(specs.AppDef("a", [_role("r")]), "aws_batch", {"queue": QUEUE})
    h2 = runner.run(specs.AppDef("b", [_role("r")]), "aws_batch", {"queue": "other-q"})
    assert sorted(a.app_handle for a in runner.list("aws_batch")) == sorted([h1, h2])


def test_token_is_a_tag_and_found_oldest_first(moto: MotoBatchServer) -> None:
    moto.create_queue("other-q")
    sched = create_scheduler("test")
    t1, t2 = idempotency_token("dag/task/run-1"), idempotency_token("dag/task/run-2")

    def keyed(token: str) -> specs.AppDef:
        return specs.AppDef("a", [_role("r")], metadata={IDEMPOTENCY_TOKEN: token})

    first = sched.submit(keyed(t1), {"queue": QUEUE})
    second = sched.submit(keyed(t1), {"queue": "other-q"})  # found in any queue
    other = sched.submit(keyed(t2), {"queue": QUEUE})
    sched.submit(specs.AppDef("a", [_role("r")]), {"queue": QUEUE})
    job = sched._get_job(first)
    assert job is not None and job["tags"][TAG_IDEMPOTENCY_TOKEN] == t1
    assert IDEMPOTENCY_TOKEN not in job["tags"]  # one tag, not the raw metadata key too

    sent: List[Dict[str, Any]] = []
    sched.client.meta.events.register(
        "provide-client-params.batch.ListJobs", lambda params, **_: sent.append(params)
    )
    assert [a.app_id for a in sched.find_by_idempotency_token(t1)] == [first, second]
    # Batch filters by the keyed job definition (moto ignores that filter; the tag is checked)
    assert [p["filters"] for p in sent] == [
        [{"name": "JOB_DEFINITION", "values": [f"torchx-{t1}"]}]
    ] * 2
    assert [a.app_id for a in sched.find_by_idempotency_token(t2)] == [other]
    assert sched.find_by_idempotency_token(idempotency_token("never used")) == []
    # Batch's createdAt decides, not the order this process submitted in.
    moto.job(job["jobId"]).job_created_at = datetime.now() + timedelta(seconds=5)
    found = sched.find_by_idempotency_token(t1)
    assert [(a.app_id, a.name) for a in found] == [(second, "a"), (first, "a")]


def test_a_token_that_cannot_name_a_job_definition_is_refused(moto: MotoBatchServer) -> None:
    app = specs.AppDef("a", [_role("r")], metadata={IDEMPOTENCY_TOKEN: "has spaces"})
    with pytest.raises(InvalidAppError, match="cannot name an AWS Batch job definition"):
        get_runner().dryrun(app, "aws_batch", {"queue": QUEUE})


def test_unknown_app_bad_id_and_no_region(
    moto: MotoBatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = get_runner()
    assert runner.status(f"aws_batch://torchx/{QUEUE}:nope-12345678") is None
    with pytest.raises(specs.InvalidArgumentError, match="expected QUEUE:JOB_NAME"):
        runner.status("aws_batch://torchx/nocolon")
    with pytest.raises(
        AWSBatchError, match="list_jobs failed: ClientException: Job queue missing-q does not exist"
    ):
        runner.status("aws_batch://torchx/missing-q:x")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(AWSBatchError, match="no AWS region configured"):
        get_runner().run(specs.AppDef("a", [_role("r")]), "aws_batch", {"queue": QUEUE})


# --------------------------------------------------------------------------- logs


def test_logs_per_node_with_newlines(moto: MotoBatchServer) -> None:
    runner = get_runner()
    info = runner.dryrun(_ddp(), "aws_batch", {"queue": QUEUE})
    handle = runner.schedule(info)
    job_id = _job_id(handle)
    # without node jobs, the job's own stream is the main node's
    moto.put_logs(f"{info.request.name}/default/{job_id}", ["main node", "done"])
    assert list(runner.log_lines(handle, "train", 0)) == ["main node\n", "done\n"]
    assert list(runner.log_lines(handle, "train", 1)) == []
    moto.add_node_jobs(job_id, ["SUCCEEDED", "SUCCEEDED"])
    moto.put_logs(
        f"{info.request.name}/default/node-1", ["step 1 loss=0.9", "héllo ✓", "step 2 loss=0.5"]
    )
    assert list(runner.log_lines(handle, "train", 1)) == [
        "step 1 loss=0.9\n",
        "héllo ✓\n",
        "step 2 loss=0.5\n",
    ]
    assert list(runner.log_lines(handle, "train", 1, regex="loss")) == [
        "step 1 loss=0.9\n",
        "step 2 loss=0.5\n",
    ]
    with pytest.raises(specs.InvalidArgumentError, match="no role 'nope'"):
        list(runner.log_lines(handle, "nope", 0))
    with pytest.raises(specs.InvalidArgumentError, match="--streams combined"):
        list(runner.log_lines(handle, "train", 0, streams=Stream.STDOUT))


def test_tail_follows_until_the_job_ends(moto: MotoBatchServer) -> None:
    runner = get_runner()
    info = runner.dryrun(specs.AppDef("tail", [_role("r")]), "aws_batch", {"queue": QUEUE})
    handle = runner.schedule(info)
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")
    stream = f"{info.request.name}/default/{job_id}"
    moto.put_logs(stream, ["first"])
    lines: List[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(runner.log_lines(handle, "r", 0, should_tail=True)), daemon=True
    )
    reader.start()
    deadline = time.monotonic() + 20
    while lines != ["first\n"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines == ["first\n"] and reader.is_alive()  # still following a running job
    moto.put_logs(stream, ["second"])
    moto.set_status(job_id, "SUCCEEDED")
    reader.join(timeout=20)
    assert not reader.is_alive() and lines == ["first\n", "second\n"]


# --------------------------------------------------------------------------- CLI and missing extra


def _tx(args: List[str], cwd: Path, timeout: float = 60, prelude: str = "") -> subprocess.Popen:
    code = f"import sys; {prelude}from torchx.cli.main import main; main(sys.argv[1:])"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def _done(proc: subprocess.Popen, timeout: float = 60) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_cli_dryrun_run_status_list_cancel(moto: MotoBatchServer, tmp_path: Path) -> None:
    out = _done(
        _tx(
            [
                "run",
                "-s",
                "aws_batch",
                "-cfg",
                f"queue={QUEUE}",
                "--workspace",
                "",
                "--dryrun",
                "dist.ddp",
                "-j",
                "1:2x2",
                "--script",
                "train.py",
            ],
            tmp_path,
        )
    )
    assert out.returncode == 0, out.stderr
    request = yaml.safe_load(out.stdout.split("=== SCHEDULER REQUEST ===\n", 1)[1])
    assert request["registerJobDefinition"]["nodeProperties"]["numNodes"] == 2
    _validate("RegisterJobDefinition", request["registerJobDefinition"])

    out = _done(
        _tx(
            [
                "run",
                "-s",
                "aws_batch",
                "-cfg",
                f"queue={QUEUE}",
                "--workspace",
                "",
                "dist.ddp",
                "-j",
                "1:2x2",
                "--script",
                "train.py",
            ],
            tmp_path,
        )
    )
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip().splitlines()[-1]
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")
    moto.add_node_jobs(job_id, ["RUNNING", "RUNNING"])

    out = _done(_tx(["status", handle], tmp_path))
    assert out.returncode == 0, out.stderr
    assert "State: RUNNING" in out.stdout and "train[1]:RUNNING" in out.stdout
    out = _done(_tx(["list", "-s", "aws_batch"], tmp_path))
    assert out.returncode == 0 and handle in out.stdout and "RUNNING" in out.stdout

    name = specs.parse_app_handle(handle).app_id.split(":")[1]
    moto.put_logs(f"{name}/default/node-1", ["epoch 1", "epoch 2"])
    out = _done(_tx(["log", f"{handle}/train/1"], tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["train/1 epoch 1", "train/1 epoch 2"]

    proc = _tx(["cancel", handle], tmp_path)
    deadline = time.monotonic() + 30
    while not moto.job(job_id).stop and time.monotonic() < deadline:
        time.sleep(0.05)
    assert moto.job(job_id).job_stopped_reason == CANCEL_REASON
    moto.set_status(job_id, "FAILED")  # play Batch finishing the terminated job
    out = _done(proc)
    assert out.returncode == 0, out.stderr
    assert f"{handle} CANCELLED" in out.stdout


def test_missing_boto3_extra_is_one_line(moto: MotoBatchServer, tmp_path: Path) -> None:
    out = _done(
        _tx(
            ["run", "-s", "aws_batch", "-cfg", f"queue={QUEUE}", "--workspace", "", "utils.echo"],
            tmp_path,
            prelude="sys.modules['boto3'] = None; ",
        )
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "torchx: error: 'boto3' is not installed; install it with: pip install 'torchx[aws_batch]'"
    ]


# --------------------------------------------------------------------------- secrets

HF_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbCdEf"
MLFLOW_ARN = "arn:aws:ssm:us-east-1:123456789012:parameter/mlflow/password"


def test_secrets_named_by_arn_go_to_secrets_and_none_is_in_environment_or_tags(
    moto: MotoBatchServer,
) -> None:
    opts = create_scheduler("t").run_opts()
    cfg = opts.cfg_from_str(
        f"queue={QUEUE},secret_env=HF_TOKEN:{HF_ARN};MLFLOW_TRACKING_PASSWORD:{MLFLOW_ARN}"
    )
    assert cfg["secret_env"] == {"HF_TOKEN": HF_ARN, "MLFLOW_TRACKING_PASSWORD": MLFLOW_ARN}
    app = specs.AppDef("trainer", [_role("train", n=2), _role("eval")])
    # what torchx injects for an MLflow server with credentials: the ARN-named one wins
    app.roles[0].env["MLFLOW_TRACKING_PASSWORD"] = "mlflow_planted_password"
    app.roles[0].env["PLAIN"] = "visible"
    app.metadata["deploy_token"] = "tag_planted_token"  # no secret in a tag either
    runner = get_runner()
    info = runner.dryrun(app, "aws_batch", cfg)
    _validate("RegisterJobDefinition", info.request.job_def)
    assert "planted" not in str(info)
    handle = runner.schedule(info)

    batch = moto.client("batch")
    (jd,) = batch.describe_job_definitions(jobDefinitionName=info.request.name)["jobDefinitions"]
    # moto's DescribeJobDefinitions leaves nodeProperties out: read what it registered
    (stored,) = (
        d for d in moto._backend()._job_definitions.values() if d.arn == jd["jobDefinitionArn"]
    )
    jd["nodeProperties"] = stored.node_properties
    (job,) = batch.describe_jobs(jobs=[_job_id(handle)])["jobs"]
    for registered in (jd, job):
        assert "planted" not in str(registered)
        containers = [r["container"] for r in registered["nodeProperties"]["nodeRangeProperties"]]
        for c in containers:
            assert c["secrets"] == [
                {"name": "HF_TOKEN", "valueFrom": HF_ARN},
                {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": MLFLOW_ARN},
            ]
            assert not {"HF_TOKEN", "MLFLOW_TRACKING_PASSWORD"} & {
                e["name"] for e in c["environment"]
            }
        assert {"name": "PLAIN", "value": "visible"} in containers[0]["environment"]
        assert "deploy_token" not in registered["tags"]


def test_a_secret_in_clear_is_refused_in_one_line(moto: MotoBatchServer) -> None:
    app = specs.AppDef("trainer", [_role("train")])
    app.roles[0].env.update(
        {
            "HF_TOKEN": "hf_planted_token",
            "MLFLOW_TRACKING_URI": "https://alice:uri_planted@mlflow.example.com",
        }
    )
    runner = get_runner()
    for submit in (runner.dryrun, runner.run):
        with pytest.raises(InvalidAppError) as e:
            submit(app, "aws_batch", {"queue": QUEUE})
        msg = str(e.value)
        assert "HF_TOKEN, MLFLOW_TRACKING_URI" in msg and "-cfg secret_env=HF_TOKEN:arn:aws:" in msg
        assert "planted" not in msg and "\n" not in msg
    assert moto.job_definition_names() == [] and moto.job_ids() == []
    with pytest.raises(specs.InvalidRunConfigException, match="expected VAR:ARN") as bad:
        runner.dryrun(app, "aws_batch", {"queue": QUEUE, "secret_env": {"HF_TOKEN": "hf_x"}})
    assert "\n" not in str(bad.value)
