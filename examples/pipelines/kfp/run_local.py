"""Run the KFP reference pipeline on this machine with ``kfp.local`` (no cluster).

``--runner subprocess`` (default): each step is a local subprocess of this environment
that runs its stage through torchx on ``local_cwd``; lineage goes to ``OUT/mlflow.db``.

``--runner docker``: each step runs in a container of torchx's image
(``$TORCHX_KFP_BASE_IMAGE``, default ``torchx.IMAGE``; build it from the repository's
``Dockerfile``) through ``kfp.local.DockerRunner``, on the host network. A stage runs
inside its launcher's container (``local_cwd``). The containers share only the pipeline
root (KFP mounts it at the same path), so the stages' data goes there, and lineage goes
to an MLflow server on loopback: ``--tracking_uri``, or one this script starts for the run
(stored in ``OUT/mlflow.db``).

    python examples/pipelines/kfp/run_local.py --out ./out-kfp
    python examples/pipelines/kfp/run_local.py --runner docker --out ./out-kfp-docker
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, Optional

SERVER_START_TIMEOUT = 240.0  # a cold `mlflow server` start on a busy 2-core machine


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def mlflow_server(out: Path) -> Iterator[str]:
    """An ``mlflow server`` on a free loopback port for the run, storing under ``out``;
    yields its URL once it answers and stops it (its process group) at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{out / 'mlflow.db'}"]
    command += ["--artifacts-destination", str(out / "mlartifacts")]  # served over http
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with open(out / "mlflow-server.log", "ab") as log:
        server = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not _answers(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mlflow server did not start; see {out / 'mlflow-server.log'}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def reference_pipeline(**params: str) -> None:
    """Run the reference pipeline (imported late: it imports kfp and torchx's components)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_pipeline import reference_pipeline as pipeline

    pipeline(**params)


def container_env(tracking_uri: str) -> Dict[str, str]:
    """The env of every step's container: MLflow tracking, and MLflow's own client
    settings (credentials, TLS) when this shell has them."""
    env = {"TORCHX_TRACKERS": "mlflow", "TORCHX_TRACKER_MLFLOW_CONFIG": tracking_uri}
    env.update({k: v for k, v in os.environ.items() if k.startswith("MLFLOW_TRACKING_")})
    return env


def run_docker(out: Path, tracking_uri: Optional[str], **params: str) -> Path:
    """The pipeline through ``kfp.local.DockerRunner``; returns its base_dir."""
    import kfp.local

    from torchx.pipelines.kfp.image import base_image

    with contextlib.ExitStack() as stack:
        uri = tracking_uri or stack.enter_context(mlflow_server(out))
        print(f"image: {base_image()}; MLflow: {uri}", flush=True)
        runner = kfp.local.DockerRunner(network_mode="host", environment=container_env(uri))
        root = out / "kfp_root"  # mounted at the same path in every step's container
        kfp.local.init(runner=runner, pipeline_root=str(root))
        reference_pipeline(base_dir=str(root / "pipeline"), **params)
    return root / "pipeline"


def run_subprocess(out: Path, **params: str) -> Path:
    """The pipeline through ``kfp.local.SubprocessRunner`` in this environment."""
    import kfp.local

    os.environ.setdefault("TORCHX_HOME", str(out / "torchx_home"))
    os.environ.setdefault("TORCHX_TRACKERS", "mlflow")
    os.environ.setdefault("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{out / 'mlflow.db'}")
    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(out / "kfp_root")
    )
    reference_pipeline(base_dir=str(out / "pipeline"), **params)
    return out / "pipeline"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="out-kfp")
    parser.add_argument("--runner", choices=["subprocess", "docker"], default="subprocess")
    parser.add_argument(
        "--tracking_uri",
        help="docker: an MLflow server the containers reach (default: one started for the run)",
    )
    parser.add_argument("--j", default="1:2x1")
    parser.add_argument("--epochs", default="20")
    parser.add_argument("--limit", default="0")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    params = dict(j=args.j, epochs=args.epochs, limit=args.limit)
    if args.runner == "docker":
        base_dir = run_docker(out, args.tracking_uri, **params)
        where = args.tracking_uri or f"mlflow ui --backend-store-uri sqlite:///{out / 'mlflow.db'}"
    else:
        base_dir = run_subprocess(out, **params)
        where = f"mlflow ui --backend-store-uri {os.environ['TORCHX_TRACKER_MLFLOW_CONFIG']}"
    metrics = json.loads((base_dir / "eval" / "metrics.json").read_text())
    print(f"test accuracy: {metrics['test_accuracy']:.4f}")
    print(f"MLflow: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
