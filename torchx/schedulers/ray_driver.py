"""The entrypoint of a torchx job on Ray (``python -m torchx.schedulers.ray_driver``, see
``ray_scheduler``): runs an app's replicas as actors in a placement group.

Each actor runs its replica's command in its own session, in the job's working directory,
with the cluster's Python first on ``PATH``, and hands its output lines (prefixed
``role/replica``) to the driver, which prints them into the job's log. On SIGTERM (the
job's stop) every actor kills its replica's process tree before the driver exits.

``Watch`` prints each new progress report into the job's log (``torchx-progress {json}``)
and, with a stall timeout, is the job's watchdog: it stops a silent job, leaving the reason
as a log line, and exits ``STALLED_EXIT``. A driver whose job Ray already ended (a stop
while PENDING can miss a driver not started yet) stops its replicas (``ended_by_ray``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from http.client import HTTPException
from typing import Any, Dict, List, Optional, Tuple

from torchx.runtime.progress import ENV_PROGRESS_FILE
from torchx.runtime.watchdog import MARK, STALLED_EXIT, StallClock, step_of
from torchx.schedulers.api import STALL_TIMEOUT

REQUEST_ENV = "TORCHX_RAY_REQUEST"
PROGRESS_RECORD = "torchx-progress "
WATCH_INTERVAL = 1.0
# what Ray puts before an actor's line: "(Replica pid=12) ", maybe in color
ACTOR_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s")
FORWARD_INTERVAL = 0.2
# set once every replica ended: the loops stop asking the actors (a thread asking Ray as
# the driver exits would connect it again)
ENDING = threading.Event()
OUTPUT_LOCK = threading.Lock()  # whole lines: replicas' and records never share one
FORWARD_LOCK = threading.Lock()  # forward_loop's round and the final one, one at a time
ORPHAN_CHECK_ROUNDS = 10  # a driver asks Ray whether its job still runs every 10 s


def _replica_actor() -> Any:
    import ray

    @ray.remote
    class Replica:
        def __init__(self) -> None:
            self.proc: Any = None
            self.last_output = time.time()
            self.progress_dir = tempfile.mkdtemp(prefix="torchx-progress-")
            self.progress_file = os.path.join(self.progress_dir, "progress.json")
            self.output: List[str] = []  # lines read, not yet taken by the driver
            self.output_lock = threading.Lock()

        def activity(self) -> Tuple[float, Optional[str], bool]:
            """Seconds since the replica last printed, reported or exited (by this node's
            clock); its last report; whether it still runs."""
            try:
                with open(self.progress_file) as f:
                    report: Optional[str] = f.read()
                reported = os.stat(self.progress_file).st_mtime
            except OSError:
                report, reported = None, 0.0
            running = self.proc is None or self.proc.poll() is None
            if running and self.proc is not None and output_waiting(self.proc.stdout):
                self.last_output = time.time()  # printed, not yet read: activity now
            return time.time() - max(self.last_output, reported), report, running

        def node_ip(self) -> str:
            return ray.util.get_node_ip_address()

        def run(self, prefix: str, args: List[str], env: Dict[str, str], cwd: str) -> int:
            full_env = {k: v for k, v in os.environ.items() if k != REQUEST_ENV}
            # the cluster's Python (this actor's) first: `python`, `torchrun` are its own
            bindir = os.path.dirname(sys.executable)
            full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
            full_env.update(env)
            full_env[ENV_PROGRESS_FILE] = self.progress_file
            self.last_output = time.time()  # a start is activity: silence counts from here
            self.proc = subprocess.Popen(
                args,
                env=full_env,
                cwd=cwd or None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            assert self.proc.stdout is not None
            for raw in iter(self.proc.stdout.readline, b""):
                self.last_output = time.time()
                text = raw.decode(errors="replace")
                with self.output_lock:
                    self.output.append(f"{prefix} {text}" + ("" if text.endswith("\n") else "\n"))
            code = self.proc.wait()
            self.last_output = time.time()  # an exit is activity: the job is ending
            return code  # the progress file stays for the driver's last round (then stop)

        def take_output(self) -> List[str]:
            """The lines read since the last call (an actor's own stdout reaches the job's log
            late, or not at all if the job ends first: the driver prints them)."""
            with self.output_lock:
                lines, self.output = self.output, []
            return lines

        def stop(self) -> None:
            if self.proc is not None and self.proc.poll() is None:
                _kill_tree(self.proc.pid)
            shutil.rmtree(self.progress_dir, ignore_errors=True)

    return Replica


def output_waiting(stream: Any) -> bool:
    """Whether a replica printed what its actor has not read yet (a loaded node can leave the
    reading thread waiting for seconds: output is activity when written, not when read)."""
    try:
        return stream is not None and bool(select.select([stream], [], [], 0)[0])
    except (OSError, ValueError):  # closed as the replica ends
        return False


def encode_request(request: Dict[str, Any]) -> str:
    """The request as one ``runtime_env`` env var: compressed (replicas of a role repeat
    their env) and base64, so a wide job stays far below the OS's limit on one variable."""
    raw = zlib.compress(json.dumps(request, separators=(",", ":")).encode(), 9)
    return base64.b64encode(raw).decode()


def decode_request(text: str) -> Dict[str, Any]:
    return json.loads(zlib.decompress(base64.b64decode(text)))


def forward(actors: List[Any]) -> None:
    """Print the lines the replicas' actors read since the last call into the job's log."""
    import ray

    with FORWARD_LOCK:
        taken = ray.get([a.take_output.remote() for a in actors], timeout=30)
        with OUTPUT_LOCK:
            for lines in taken:
                sys.stdout.writelines(lines)
            sys.stdout.flush()


def forward_loop(actors: List[Any]) -> None:
    from ray.exceptions import RayError

    while not ENDING.wait(FORWARD_INTERVAL):
        try:
            forward(actors)
        except (RayError, OSError) as e:  # a slow round, a stopping job: the next takes them
            print(f"torchx: could not forward output: {e}", file=sys.stderr, flush=True)


def last_progress(lines: List[str]) -> Optional[str]:
    """The newest progress report the driver printed into ``lines`` (the job's log)."""
    for line in reversed(lines):
        line = ACTOR_PREFIX.sub("", line)
        if line.startswith(PROGRESS_RECORD):
            return line[len(PROGRESS_RECORD) :].strip() or None
    return None


class Watch:
    """The replicas' progress reports into the job's log, and their watchdog (module
    docstring). Silence counts as the replicas' nodes measured it: a slow answer adds none."""

    def __init__(self, actors: List[Any], stall_timeout: Optional[float]) -> None:
        self.actors = actors
        self.clock = StallClock(stall_timeout, None) if stall_timeout else None
        self.report: Optional[str] = None
        self.lock = threading.Lock()  # the loop and the final round

    def once(self, final: bool = False) -> None:
        import ray

        answers = ray.get([a.activity.remote() for a in self.actors], timeout=10)
        report = next((r for _, r, _ in answers if r), None)
        with self.lock:
            if report and report != self.report:
                with OUTPUT_LOCK:
                    print(PROGRESS_RECORD + " ".join(report.split()), flush=True)
                self.report = report
        if self.clock is None or final or not any(running for _, _, running in answers):
            return
        self.clock.active(time.monotonic() - max(0.0, min(age for age, _, _ in answers)))
        reason = self.clock.stalled(step_of(report))
        if reason is not None:
            with OUTPUT_LOCK:
                print(MARK + reason, flush=True)
            _stop_replicas(self.actors, reason, STALLED_EXIT)

    def loop(self, req: Dict[str, Any]) -> None:
        """A round whose actors do not answer judges nothing."""
        from ray.exceptions import RayError

        rounds = 0
        while not ENDING.is_set():
            try:
                self.once()
            except (RayError, OSError) as e:  # a slow round or a stopping job: try again
                print(f"torchx: could not ask the replicas: {e}", file=sys.stderr, flush=True)
            rounds += 1
            if rounds % ORPHAN_CHECK_ROUNDS == 0 and ended_by_ray(req):
                _stop_replicas(self.actors, "its job ended in Ray but this driver ran on")
            ENDING.wait(WATCH_INTERVAL)


def dashboard_url(address: str) -> str:
    """The Ray dashboard's URL from an address given with or without its scheme."""
    return address if "://" in address else f"http://{address}"


def ended_by_ray(req: Dict[str, Any]) -> bool:
    """Whether Ray already holds this driver's job ended (STOPPED, FAILED, SUCCEEDED).

    A stop while the job is PENDING can kill the entrypoint's shell before it started this
    driver, which would run on holding its replicas' CPUs. Doubt (no answer within 2 s) is
    not an end."""
    url = dashboard_url(str(req.get("address") or ""))
    job_id = req.get("app_id")
    if not job_id:  # a request of another torchx version: doubt, not an end
        return False
    try:
        with urllib.request.urlopen(f"{url}/api/jobs/{job_id}", timeout=2) as r:
            status = json.load(r).get("status")
    except (OSError, ValueError, HTTPException):  # no answer, or not the dashboard's
        return False
    return status in ("STOPPED", "FAILED", "SUCCEEDED")


def _stop_replicas(actors: List[Any], why: str, code: int = 128 + signal.SIGTERM) -> None:
    """Kill every replica's process tree, then exit at once (Ray gives a stopped job's
    driver a few seconds)."""
    print(f"torchx: {why}; stopping replicas", flush=True)
    try:
        import ray

        ray.get([a.stop.remote() for a in actors], timeout=2)
    finally:
        os._exit(code)


def _kill_tree(pid: int) -> None:
    """TERM the replica's group and every descendant now; KILL survivors a moment later
    (returns at once: Ray gives a stopped job's driver only a few seconds)."""
    import psutil  # Ray ships it (its thirdparty_files), and runs this in an actor

    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        procs = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()

    def reap() -> None:
        _, alive = psutil.wait_procs(procs, timeout=3)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()

    threading.Thread(target=reap, daemon=True).start()


def _die_with_parent() -> None:
    """preexec: the replica gets SIGKILL if its actor process dies (e.g. killed by Ray)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the group kill remains
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main() -> int:
    import ray
    from ray.exceptions import RayError
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not os.environ.get(REQUEST_ENV):
        print(
            f"torchx: no {REQUEST_ENV} in this job's runtime_env: submit it with"
            " `torchx run -s ray`",
            file=sys.stderr,
        )
        return 2
    req = decode_request(os.environ[REQUEST_ENV])
    if ended_by_ray(req):
        print("torchx: Ray already ended this job; not starting its replicas", flush=True)
        return 128 + signal.SIGTERM
    ray.init(address="auto", log_to_driver=True)
    replicas = req["replicas"]
    pg = placement_group(
        [bundle(r) for r in replicas],
        strategy="SPREAD" if req.get("spread") else "PACK",
        name=placement_group_name(str(req.get("app_id") or "")),  # the scheduler asks it
    )
    ray.get(pg.ready(), timeout=600)
    Replica = _replica_actor()
    actors = [
        # max_concurrency=4: stop(), activity(), take_output() run while run() blocks
        Replica.options(
            num_cpus=float(r["cpu"]),
            num_gpus=float(r.get("gpu") or 0),
            max_concurrency=4,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
        ).remote()
        for i, r in enumerate(replicas)
    ]
    rank0 = ray.get(actors[0].node_ip.remote())

    def stop(signum: int, _: Any) -> None:
        _stop_replicas(actors, f"job stopped (signal {signum})", 128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runs = []
    for actor, r in zip(actors, replicas, strict=True):
        env = dict(r["env"], TORCHX_RANK0_HOST=rank0)
        runs.append(
            actor.run.remote(
                f"{r['role']}/{r['replica_id']}", r["args"], env, req.get("working_dir") or ""
            )
        )
    stall_timeout = (req.get("app") or {}).get("metadata", {}).get(STALL_TIMEOUT)
    watch = Watch(actors, float(stall_timeout or 0) or None)
    threading.Thread(target=forward_loop, args=(actors,), daemon=True).start()
    threading.Thread(target=watch.loop, args=(req,), daemon=True).start()
    mins = {r["role"]: int(r.get("min_replicas") or 0) for r in replicas}
    codes: Dict[int, int] = {}
    pending = list(runs)
    failed = False

    def role_can_succeed(role: str) -> bool:  # a replica still running may yet succeed
        left = [i for i, r in enumerate(replicas) if r["role"] == role and codes.get(i, 0) == 0]
        return len(left) >= mins[role]

    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        idx = runs.index(done[0])
        codes[idx] = ray.get(done[0])
        r = replicas[idx]
        if codes[idx] != 0:
            print(
                f"torchx: replica {r['role']}/{r['replica_id']} exited with code {codes[idx]}",
                flush=True,
            )
            if not role_can_succeed(r["role"]) and not failed:
                failed = True
                ray.get([a.stop.remote() for a in actors], timeout=30)
    ENDING.set()
    try:  # the last lines and reports (a final step) land before the job is seen to end
        forward(actors)
        watch.once(final=True)
        ray.get([a.stop.remote() for a in actors], timeout=10)  # all ended: removes files
    except (RayError, OSError) as e:  # the replicas ended: their records are a nicety
        print(f"torchx: could not ask the replicas: {e}", file=sys.stderr, flush=True)
    summary = {f"{r['role']}/{r['replica_id']}": codes.get(i) for i, r in enumerate(replicas)}
    print("torchx-exit-codes " + json.dumps(summary), flush=True)
    return 1 if failed or not all(role_can_succeed(role) for role in mins) else 0


def placement_group_name(job_id: str) -> str:
    """The name of a job's placement group, by which ``describe`` asks whether it waits."""
    return f"torchx-{job_id}"


def bundle(replica: Dict[str, Any]) -> Dict[str, float]:
    """A replica's placement-group bundle: its CPUs and, if it asks for them, GPUs."""
    gpu = {"GPU": float(replica["gpu"])} if replica.get("gpu") else {}
    return {"CPU": float(replica["cpu"]), **gpu}


if __name__ == "__main__":
    sys.exit(main())
