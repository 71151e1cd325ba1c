"""The entrypoint of a torchx job on Ray: runs an app's replicas as actors in a placement group.

``python -m torchx.schedulers.ray_driver REQUEST_JSON`` (the Ray job's entrypoint) reserves
one bundle per replica, starts one actor per bundle, and each actor runs its replica's
command as a subprocess in its own session, printing each output line prefixed
``role/replica``. The rank-0 host is the node of replica 0. When the job is stopped
(SIGTERM), every actor kills its replica's process tree before the driver exits.

For stall detection and progress (``Scheduler.last_activity``, ``progress_path``) the
driver publishes, every ``PUBLISH_INTERVAL`` s, beside the request file (which the head
reads, so the submitter sees it too): ``<app>.activity.json``, how long the replicas had
been silent (no output, progress report or exit) when asked, how many still run (none:
the job is ending, not stalled), and when the driver last asked its actors (a stale
answer means the driver cannot tell); and ``<app>.progress.json``, the first replica's
last progress report (each actor points ``TORCHX_PROGRESS_FILE`` at a file on its own
node).

A driver whose job Ray already ended (a stop while the job was PENDING can miss a driver
not started yet) runs nothing, or stops its replicas within ``ORPHAN_CHECK_ROUNDS`` rounds.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

PUBLISH_INTERVAL = 1.0
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

        def activity(self) -> Tuple[float, Optional[str], bool]:
            """How long ago (by this node's clock, as it answers) the replica last printed,
            reported progress or exited; its last report; whether it still runs."""
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
            full_env = dict(os.environ)
            full_env.update(env)
            full_env["TORCHX_PROGRESS_FILE"] = self.progress_file
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
                sys.stdout.write(f"{prefix} {raw.decode(errors='replace')}")
                sys.stdout.flush()
            code = self.proc.wait()
            self.last_output = time.time()  # an exit is activity: the job is ending
            return code  # the progress file stays for the driver's last round (cleanup)

        def cleanup(self) -> None:
            shutil.rmtree(self.progress_dir, ignore_errors=True)

        def stop(self) -> None:
            if self.proc is not None and self.proc.poll() is None:
                _kill_tree(self.proc.pid)
            shutil.rmtree(self.progress_dir, ignore_errors=True)

    return Replica


def output_waiting(stream: Any) -> bool:
    """Whether a replica printed what its actor's reading thread has not read yet: a loaded
    node can leave that thread unscheduled for seconds, and output counts as activity from
    when it was written, not from when it was read."""
    try:
        return stream is not None and bool(select.select([stream], [], [], 0)[0])
    except (OSError, ValueError):  # closed as the replica ends
        return False


def _write_atomic(path: str, text: str) -> None:
    """Write ``path`` (0600: it sits beside the private request file) by renaming a temp."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


_PUBLISH_LOCK = threading.Lock()  # the loop and the final round write the same files


def _publish_once(actors: List[Any], base: str) -> None:
    """The replicas' last activity and the first replica's progress report, beside the
    request file (see the module's docstring)."""
    import ray

    answers = ray.get([a.activity.remote() for a in actors], timeout=10)
    record = {  # silence as each node measured it: a slow answer or clock skew adds none
        "silence": max(0.0, min(age for age, _, _ in answers)),
        "checked": time.time(),
        "running": sum(1 for _, _, running in answers if running),
    }
    report = next((r for _, r, _ in answers if r), None)
    with _PUBLISH_LOCK:
        _write_atomic(f"{base}.activity.json", json.dumps(record))
        if report:
            _write_atomic(f"{base}.progress.json", report)


def _publish(actors: List[Any], base: str, req: Dict[str, Any]) -> None:
    """``_publish_once`` every ``PUBLISH_INTERVAL`` s. A round whose actors do not answer
    publishes nothing, so the record goes stale (cannot tell) rather than wrong. Every
    ``ORPHAN_CHECK_ROUNDS`` rounds, a driver whose job Ray already ended stops its replicas
    and exits (see ``ended_by_ray``)."""
    rounds = 0
    while True:
        try:
            _publish_once(actors, base)
        except Exception as e:  # a slow round or a stopping job: try again
            print(f"torchx: could not publish activity: {e}", file=sys.stderr, flush=True)
        rounds += 1
        if rounds % ORPHAN_CHECK_ROUNDS == 0 and ended_by_ray(req, base):
            _stop_replicas(actors, "its job ended in Ray but this driver ran on")
        time.sleep(PUBLISH_INTERVAL)


def dashboard_url(address: str) -> str:
    """The Ray dashboard's URL from an address given with or without its scheme."""
    return address if "://" in address else f"http://{address}"


def ended_by_ray(req: Dict[str, Any], base: str) -> bool:
    """Whether Ray already holds this driver's job ended (STOPPED, FAILED, SUCCEEDED).

    Ray stops a job by signalling the entrypoint's processes it sees then; a stop that
    comes while the job is PENDING can kill the entrypoint's shell before it started this
    driver, which then runs on, an orphan holding its replicas' CPUs (seen in CI: the next
    job waited for them forever). Doubt (the dashboard not answering within 2 s, e.g. an
    address only the submitter can reach) is not an end."""
    url = dashboard_url(str(req.get("address") or ""))
    job_id = os.path.basename(base)
    try:
        with urllib.request.urlopen(f"{url}/api/jobs/{job_id}", timeout=2) as r:
            status = json.load(r).get("status")
    except Exception:
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
    """TERM the replica's group and every descendant now; KILL survivors a moment later.

    Returns at once: Ray gives a stopped job's driver only a few seconds.
    """
    try:
        import psutil

        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except Exception:
        procs = []
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.terminate()
        except Exception:
            pass

    def reap() -> None:
        try:
            import psutil

            _, alive = psutil.wait_procs(procs, timeout=3)
            for p in alive:
                p.kill()
        except Exception:
            pass

    threading.Thread(target=reap, daemon=True).start()


def _die_with_parent() -> None:
    """preexec: the replica gets SIGKILL if its actor process dies (e.g. killed by Ray)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main() -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    with open(sys.argv[1]) as f:
        req = json.load(f)
    base = sys.argv[1][: -len(".json")] if sys.argv[1].endswith(".json") else sys.argv[1]
    if ended_by_ray(req, base):
        print("torchx: Ray already ended this job; not starting its replicas", flush=True)
        return 128 + signal.SIGTERM
    ray.init(address="auto", log_to_driver=True)
    replicas = req["replicas"]
    pg = placement_group(
        [{"CPU": float(r["cpu"])} for r in replicas],
        strategy="SPREAD" if req.get("spread") else "PACK",
    )
    ray.get(pg.ready(), timeout=600)
    Replica = _replica_actor()
    actors = [
        # max_concurrency=3: stop() and activity() must run while run() is still blocked
        Replica.options(
            num_cpus=float(r["cpu"]),
            max_concurrency=3,
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
                f"{r['role']}/{r['replica_id']}", r["args"], env, req.get("working_dir", "")
            )
        )
    threading.Thread(target=_publish, args=(actors, base, req), daemon=True).start()
    mins: Dict[str, int] = {}
    for r in replicas:
        mins[r["role"]] = int(r.get("min_replicas") or 0)
    codes: Dict[int, int] = {}
    pending = list(runs)
    failed = False

    def role_can_succeed(role: str) -> bool:
        members = [i for i, r in enumerate(replicas) if r["role"] == role]
        lost = sum(1 for i in members if codes.get(i, 0) != 0)
        return len(members) - lost >= mins[role]

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
    try:  # the last reports (a final step) land before the job is seen to end
        _publish_once(actors, base)
        ray.get([a.cleanup.remote() for a in actors], timeout=10)
    except Exception as e:
        print(f"torchx: could not publish activity: {e}", file=sys.stderr, flush=True)
    summary = {f"{r['role']}/{r['replica_id']}": codes.get(i) for i, r in enumerate(replicas)}
    print("torchx-exit-codes " + json.dumps(summary), flush=True)
    return 1 if failed or not all(role_can_succeed(role) for role in mins) else 0


if __name__ == "__main__":
    sys.exit(main())
