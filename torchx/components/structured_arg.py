"""Parsers for the structured string arguments of ``dist.*``: ``--name exp/run`` and ``-j``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from torchx.specs.api import InvalidArgumentError

_J_USAGE = "use -j NPROC, -j NNODESxNPROC or -j MIN:MAXxNPROC (e.g. -j 4, -j 2x4, -j 1:2x4)"

# More nodes than any cluster a torchx job runs on: a typo like -j 100000x1 would
# otherwise build (and print) a dry run of one request per node before anything fails.
MAX_NNODES = 10_000
# More worker processes than any one host runs (torchrun starts each as a process, and
# reserves a port and a log file for it): a typo like -j 1x99999 is refused up front.
MAX_NPROC_PER_NODE = 1_024


def check_replicas(num_replicas: int, flag: str) -> None:
    """Refuse a replica count beyond :data:`MAX_NNODES` (or below 1), naming ``flag``."""
    if num_replicas < 1:
        raise InvalidArgumentError(f"{flag} {num_replicas}: give at least 1 replica")
    if num_replicas > MAX_NNODES:
        raise InvalidArgumentError(
            f"{flag} {num_replicas}: at most {MAX_NNODES:,} replicas (nodes) are supported;"
            " check for a typo"
        )


def count(digits: str) -> int:
    """The value of a run of digits, capped far above any bound here (``int()`` refuses
    strings of thousands of digits with an error that is not the user's)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


@dataclass
class StructuredNameArgument:
    experiment_name: str
    run_name: str

    @staticmethod
    def parse_from(
        name: str, m: Optional[str] = None, script: Optional[str] = None
    ) -> StructuredNameArgument:
        """``exp/run``, ``exp/``, ``/run`` or ``run`` (default: ``default-experiment``, script)."""
        default_run = (Path(script).stem if script else (m or "").split(".")[-1]) or "app"
        exp, sep, run = name.partition("/")
        if not sep:
            exp, run = "", exp
        return StructuredNameArgument(exp or "default-experiment", run or default_run)


@dataclass
class StructuredJArgument:
    min_nnodes: int
    max_nnodes: int
    nproc_per_node: int

    @property
    def nnodes(self) -> int:
        """The node count (the maximum for an elastic ``MIN:MAX``), upstream's field."""
        return self.max_nnodes

    @property
    def nnodes_rep(self) -> str:
        if self.min_nnodes == self.max_nnodes:
            return str(self.max_nnodes)
        return f"{self.min_nnodes}:{self.max_nnodes}"

    def __str__(self) -> str:
        return f"{self.nnodes_rep}x{self.nproc_per_node}"

    @staticmethod
    def parse(j: str) -> StructuredJArgument:
        """Parse ``-j`` (NPROC, NNODESxNPROC, MIN:MAXxNPROC) and check the numbers make sense."""
        m = re.fullmatch(r"\s*(?:(?:(\d+):)?(\d+)x)?(\d+)\s*", j or "")
        if not m:
            raise InvalidArgumentError(f"invalid -j {j!r}: {_J_USAGE}")
        min_s, max_s, nproc_s = m.groups()
        max_nnodes = count(max_s) if max_s else 1
        min_nnodes = count(min_s) if min_s else max_nnodes
        nproc = count(nproc_s)
        if nproc < 1:
            raise InvalidArgumentError(
                f"invalid -j {j!r}: processes per node must be >= 1; {_J_USAGE}"
            )
        if max_nnodes < 1 or min_nnodes < 1:
            raise InvalidArgumentError(
                f"invalid -j {j!r}: number of nodes must be >= 1; {_J_USAGE}"
            )
        if min_nnodes > max_nnodes:
            raise InvalidArgumentError(
                f"invalid -j {j!r}: MIN nodes ({min_nnodes}) > MAX nodes ({max_nnodes})"
            )
        if max_nnodes > MAX_NNODES:
            raise InvalidArgumentError(
                f"invalid -j {j!r}: at most {MAX_NNODES:,} nodes are supported; check for a typo"
            )
        if nproc > MAX_NPROC_PER_NODE:
            raise InvalidArgumentError(
                f"invalid -j {j!r}: at most {MAX_NPROC_PER_NODE:,} processes per node are"
                " supported; check for a typo"
            )
        return StructuredJArgument(min_nnodes, max_nnodes, nproc)

    @staticmethod
    def parse_from(h: Optional[str], j: str) -> StructuredJArgument:
        """For ``dist.spmd``: ``-j N`` means N nodes with as many processes as ``h`` has GPUs."""
        from torchx.specs.named_resources import named_resources

        if re.fullmatch(r"\s*\d+\s*", j or ""):
            gpus = named_resources[h].gpu if h else 0
            if gpus <= 0:
                raise InvalidArgumentError(
                    f"-j {j} needs a GPU host type (-h) to infer processes per node;"
                    f" use -j {j}xNPROC"
                )
            return StructuredJArgument.parse(f"{j.strip()}x{gpus}")
        return StructuredJArgument.parse(j)
