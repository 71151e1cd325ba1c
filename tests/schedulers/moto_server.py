"""moto in server mode on 127.0.0.1, for AWS Batch + CloudWatch Logs through boto3 (and the CLI).

boto3 reaches it through ``AWS_ENDPOINT_URL`` (see ``env()``), so a ``torchx`` subprocess
talks to the same emulator as the test. Batch runs without Docker (``use_docker: false``):
a submitted job is marked SUCCEEDED at once. Since the server runs in this process, tests
drive states the way AWS Batch would by editing moto's job objects (``set_status``,
``add_node_jobs``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

ACCOUNT = "123456789012"
REGION = "us-east-1"
LOG_GROUP = "/aws/batch/job"


class MotoBatchServer:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.url = ""

    def __enter__(self) -> MotoBatchServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request access log
        self._server.start()
        _, port = self._server.get_host_and_port()
        self.url = f"http://127.0.0.1:{port}"
        self.reset()

    def stop(self) -> None:
        self._server.stop()

    def _post(self, path: str, body: Dict[str, Any]) -> None:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=30).read()

    def reset(self) -> None:
        """Forget every resource, keep Batch in no-Docker mode."""
        self._post("/moto-api/reset", {})
        self._post("/moto-api/config", {"batch": {"use_docker": False}})

    def env(self) -> Dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    # ------------------------------------------------------------------ setup

    def fresh(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue: str) -> MotoBatchServer:
        """Per test: no resources but ``queue``; boto3 (and the CLI) point here, nowhere else."""
        for key in aws_env_keys():
            monkeypatch.delenv(key)
        for key, value in self.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
        monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
        monkeypatch.chdir(tmp_path)
        self.reset()
        self.create_queue(queue)
        return self

    def create_queue(self, name: str) -> str:
        iam = self.client("iam")
        try:
            role_arn = iam.get_role(RoleName="batch-service")["Role"]["Arn"]
        except iam.exceptions.NoSuchEntityException:
            role_arn = iam.create_role(RoleName="batch-service", AssumeRolePolicyDocument="{}")[
                "Role"
            ]["Arn"]
        batch = self.client("batch")
        ce = batch.create_compute_environment(
            computeEnvironmentName=f"{name}-ce",
            type="UNMANAGED",
            state="ENABLED",
            serviceRole=role_arn,
        )
        batch.create_job_queue(
            jobQueueName=name,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[
                {"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}
            ],
        )
        return name

    # ------------------------------------------------------------------ playing AWS Batch

    def _backend(self) -> Any:
        from moto.batch.models import batch_backends

        return batch_backends[ACCOUNT][REGION]

    def job(self, job_id: str) -> Any:
        return self._backend()._jobs[job_id]

    def job_ids(self) -> List[str]:
        """Every job Batch holds (submitted through any client)."""
        return sorted(self._backend()._jobs)

    def job_definition_names(self) -> List[str]:
        """Every registered job definition (all revisions, active or not)."""
        return sorted(jd.name for jd in self._backend()._job_definitions.values())

    def set_status(
        self,
        job_id: str,
        status: str,
        reason: Optional[str] = None,
        exit_code: Optional[int] = None,
    ) -> None:
        """Move a job to ``status`` as Batch would (RUNNING jobs are not stopped)."""
        job = self.job(job_id)
        job.status = status
        job.job_stopped = status in ("SUCCEEDED", "FAILED")
        if reason is not None:
            job.job_stopped_reason = reason
        if exit_code is not None:
            job.exit_code = exit_code

    def add_node_jobs(self, job_id: str, statuses: List[str]) -> List[str]:
        """Create Batch's node jobs ``{job_id}#{i}`` (each with its own log stream)."""
        from moto.batch.models import Job

        main = self.job(job_id)
        backend = self._backend()
        ids = []
        for i, status in enumerate(statuses):
            node_id = f"{job_id}#{i}"
            node = Job(
                main.job_name,
                main.job_definition,
                main.job_queue,
                backend,
                log_backend=backend.logs_backend,
                container_overrides=None,
                eks_properties_override=None,
                depends_on=None,
                parameters=None,
                all_jobs=backend._jobs,
                timeout=None,
                array_properties={},
                provided_job_id=node_id,
            )
            main.job_queue.jobs.remove(node)  # node jobs are not listed in the queue
            node.log_stream_name = f"{main.job_definition.name}/default/node-{i}"
            node.job_started_at = main.job_started_at
            node._start_attempt()
            backend._jobs[node_id] = node
            self.set_status(node_id, status)
            ids.append(node_id)
        return ids

    def put_logs(self, stream: str, lines: List[str]) -> None:
        logs = self.client("logs")
        try:
            logs.create_log_group(logGroupName=LOG_GROUP)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        try:
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        now = int(time.time() * 1000)
        logs.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=stream,
            logEvents=[{"timestamp": now + i, "message": line} for i, line in enumerate(lines)],
        )


def aws_env_keys() -> List[str]:
    """Variables that would point boto3 at a real account; tests clear them."""
    return [k for k in os.environ if k.startswith("AWS_")]
