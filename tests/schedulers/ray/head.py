"""Start a Ray head for tests, on free loopback ports of its own, and stop exactly it.

``ray stop --force`` stops every Ray process of the machine (another test's head, another
checkout's): a head here runs ``ray start --block`` in a process group of its own and is
stopped by that group, plus any of its processes that left the group (found by its own temp
dir). Optionally in a private mount namespace that hides the given directories (empty tmpfs
over each): "another host" that shares only the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import psutil

from tests.mlflow_server import free_port
from tests.polling import poll_until

PORTS = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _submit_probe(url: str) -> str:
    """A trivial job's submission id, or "" while the head has no agent to take it (the
    dashboard answers before its agent registers: "No available agent to submit job")."""
    body = json.dumps({"entrypoint": "true"}).encode()
    request = urllib.request.Request(
        f"{url}/api/jobs/", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return str(json.load(r)["submission_id"])
    except OSError:
        return ""


def _probe_status(url: str, submission_id: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/api/jobs/{submission_id}", timeout=10) as r:
            return str(json.load(r)["status"])
    except OSError:
        return ""


def _outermost(dirs: Sequence[str]) -> List[str]:
    """Each directory once: one inside another hidden one is gone with it."""
    return [d for d in dirs if not any(d != o and d.startswith(o + os.sep) for o in dirs)]


@contextlib.contextmanager
def ray_head(
    bindir: str,
    log: Path,
    env: Dict[str, str],
    num_cpus: int = 2,
    hide: Optional[Sequence[str]] = None,
) -> Iterator[str]:
    """A head started with ``bindir``'s ``ray`` (``bindir`` first on its PATH: the jobs'
    ``python``); yields its dashboard URL."""
    ports: Dict[str, int] = {}
    for name in PORTS:  # nine random picks can repeat one ("used by other components")
        while (port := free_port()) in ports.values():
            pass
        ports[name] = port
    temp_dir = f"/tmp/rh{ports['dashboard-port']}"  # short: Ray's socket paths live in it
    start = [
        os.path.join(bindir, "ray"),
        "start",
        "--head",
        "--block",
        f"--num-cpus={num_cpus}",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    cmd = start
    if hide is not None:
        dirs = shlex.join(_outermost(hide))
        script = f'for d in {dirs}; do mount -t tmpfs none "$d" || exit 3; done; '
        script += f"exec {shlex.join(start)}"
        cmd = ["unshare", "--mount", "--propagation", "private", "bash", "-c", script]
    full_env = dict(
        env,
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # loopback only
        # A loaded 2-core machine stalls a process for seconds: Ray's defaults (5 failed
        # health checks, 3 s apart) then declare the head's own node dead and `--block` tears
        # the whole head down in the middle of the tests.
        RAY_health_check_failure_threshold="60",
        RAY_health_check_timeout_ms="30000",
        RAY_gcs_rpc_server_reconnect_timeout_s="300",
        RAY_agent_register_timeout_ms="300000",
    )
    url = f"http://127.0.0.1:{ports['dashboard-port']}"
    with open(log, "w") as out:
        head = subprocess.Popen(
            cmd, env=full_env, cwd="/", stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            up = poll_until(
                lambda: head.poll() is None and answers(url),
                lambda answered: answered or head.poll() is not None,
                300,
                every=1,
            )
            assert up, f"no Ray head at {url}: {log.read_text()[-3000:]}"
            # ready when it runs a job: the first tests must not meet a head still starting
            probe = poll_until(lambda: _submit_probe(url), bool, 300, every=1)
            assert probe, f"the Ray head at {url} takes no job: {log.read_text()[-3000:]}"
            ended = ("SUCCEEDED", "FAILED", "STOPPED")
            status = poll_until(lambda: _probe_status(url, probe), ended.__contains__, 300, 1)
            assert status == "SUCCEEDED", f"a probe job {status}: {log.read_text()[-3000:]}"
            yield url
        finally:
            # at once: a SIGTERM'd head drains for 30 s; nothing of a test head needs keeping
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=60)
            left = []
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if any(temp_dir in arg for arg in p.info["cmdline"] or []):
                        p.kill()
                        left.append(p)
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=30)  # none writes into its temp dir any more
            shutil.rmtree(temp_dir, ignore_errors=True)
