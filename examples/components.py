"""Components of the reference pipeline: datapreproc -> elastic DDP train -> evaluate.

A component file, written the way users write theirs: plain functions with typed
arguments and docstrings that return an ``AppDef``. Run one with::

    torchx run -s local_cwd examples/components.py:trainer --help

The stage programs live in ``examples/apps`` and are referenced by absolute path,
so these components work from any working directory on a local scheduler. For a
container scheduler pass ``image`` and ``apps_dir`` (where the image has the apps).
"""

from __future__ import annotations

import os
from typing import Optional

import torchx
import torchx.components.dist as dist
from torchx import specs

APPS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apps")


def datapreproc(
    output_path: str,
    seed: int = 0,
    limit: Optional[int] = None,
    image: str = torchx.IMAGE,
    apps_dir: str = APPS_DIR,
) -> specs.AppDef:
    """Load the bundled handwritten digits, normalise them and write train/val/test splits.

    Args:
        output_path: where the splits go (a path or fsspec URL)
        seed: seed of the split
        limit: keep only this many rows (for quick runs)
        image: container image (ignored by local schedulers)
        apps_dir: directory holding the stage programs inside ``image``
    """
    args = ["--output_path", output_path, "--seed", str(seed)]
    if limit is not None:
        args += ["--limit", str(limit)]
    return specs.AppDef(
        name="datapreproc",
        roles=[
            specs.Role(
                name="datapreproc",
                image=image,
                entrypoint="python",
                args=[os.path.join(apps_dir, "datapreproc.py"), *args],
                resource=specs.resource(cpu=1, memMB=1024),
            )
        ],
    )


def trainer(
    data_path: str,
    output_path: str,
    checkpoint_path: str,
    j: str = "1:2x1",
    max_restarts: int = 2,
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 0.05,
    checkpoint_every: int = 20,
    step_delay: float = 0.0,
    image: str = torchx.IMAGE,
    apps_dir: str = APPS_DIR,
    cpu: int = 1,
    memMB: int = 2048,
    rdzv_port: Optional[int] = None,
) -> specs.AppDef:
    """Train an MLP on the digits with elastic DDP; checkpoints and resumes after failures.

    Args:
        data_path: splits written by datapreproc
        output_path: where the final model goes (written once, by rank 0)
        checkpoint_path: where periodic checkpoints go; a restart resumes from the newest
        j: nodes and processes, ``[MIN:]MAXxNPROC`` (``1:2x1`` = elastic, 1 to 2 nodes of 1 process)
        max_restarts: worker-group restarts torchrun may do before the job fails
        epochs: training epochs
        batch_size: per-process batch size
        lr: learning rate
        checkpoint_every: steps between checkpoints
        step_delay: seconds to sleep per step (to watch or fault-test a running job)
        image: container image (ignored by local schedulers)
        apps_dir: directory holding the stage programs inside ``image``
        cpu: cpus per node
        memMB: memory per node in MB
        rdzv_port: port of the rendezvous on the rank-0 host (multi-node only); unset, a free
            port on local schedulers (two pipelines can train at once), 29500 elsewhere
    """
    return dist.ddp(
        "--data_path",
        data_path,
        "--output_path",
        output_path,
        "--checkpoint_path",
        checkpoint_path,
        "--epochs",
        str(epochs),
        "--batch_size",
        str(batch_size),
        "--lr",
        str(lr),
        "--checkpoint_every",
        str(checkpoint_every),
        "--step_delay",
        str(step_delay),
        script=os.path.join(apps_dir, "train.py"),
        image=image,
        name="train",
        j=j,
        max_restarts=max_restarts,
        cpu=cpu,
        memMB=memMB,
        rdzv_port=rdzv_port,
    )


def evaluate(
    model_path: str,
    data_path: str,
    output_path: str,
    image: str = torchx.IMAGE,
    apps_dir: str = APPS_DIR,
) -> specs.AppDef:
    """Score the trained model on the test split; writes metrics.json and a confusion matrix.

    Args:
        model_path: the model written by trainer
        data_path: splits written by datapreproc
        output_path: where metrics.json and confusion_matrix.png go
        image: container image (ignored by local schedulers)
        apps_dir: directory holding the stage programs inside ``image``
    """
    return specs.AppDef(
        name="evaluate",
        roles=[
            specs.Role(
                name="evaluate",
                image=image,
                entrypoint="python",
                args=[
                    os.path.join(apps_dir, "evaluate.py"),
                    "--model_path",
                    model_path,
                    "--data_path",
                    data_path,
                    "--output_path",
                    output_path,
                ],
                resource=specs.resource(cpu=1, memMB=1024),
            )
        ],
    )
