"""A pipeline stage written as the ``torchrun`` line its author already has.

``torchrun_stage("torchrun --nnodes 1:2 --nproc_per_node 4 train.py --lr 0.1")`` is the
``dist.ddp`` component and its arguments (the app ``torchx torchrun`` submits), named as
every adapter names its parameters::

    TorchXOperator(task_id="train", torchrun="torchrun ... train.py")   # Airflow (at run time)
    tasks.run(*torchrun_stage("torchrun ... train.py"), scheduler="slurm")  # Prefect
    torchx_launcher(**torchrun_stage("torchrun ... train.py")._asdict())    # KFP

The line may also carry dist.ddp's role flags (``--image``, ``--cpu``, ``--memMB``, ``-h``,
``--env``). Reading it needs torch (torchrun's flags are torch's own).
"""

from __future__ import annotations

import logging
import os
import shlex
from typing import List, NamedTuple, Sequence, Union

from torchx.components.torchrun import parse

logger = logging.getLogger(__name__)


class TorchrunStage(NamedTuple):
    """A component and its arguments, as the adapters take them."""

    component: str
    component_args: List[str]


def torchrun_stage(line: Union[str, Sequence[str]]) -> TorchrunStage:
    """``("dist.ddp", args)`` for a torchrun command line: a string (split as a shell
    splits it) or a list, with or without the leading ``torchrun``. A bad line raises
    :class:`torchx.specs.InvalidArgumentError` with torchrun's usage message."""
    argv = shlex.split(line) if isinstance(line, str) else [str(a) for a in line]
    if argv and os.path.basename(argv[0]) == "torchrun":
        argv = argv[1:]
    request = parse(argv)
    for note in request.ignored:
        logger.warning("torchrun %s", note)
    return TorchrunStage(request.component, request.component_args)
