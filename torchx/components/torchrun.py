"""A ``torchrun`` command line as the arguments of the ``dist.ddp`` component, so
``torchx torchrun`` and the pipelines' ``torchrun=`` submit the app ``torchx run dist.ddp``
gives for the same job. The flag mapping is README's "From torchrun" table; a flag
dist.ddp does not map goes to the role's env as ``PET_<FLAG>``, which torchrun reads.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import ClassVar, List, NoReturn, Optional, Sequence

from torchx.components.structured_arg import MAX_NNODES, MAX_NPROC_PER_NODE, count
from torchx.components.torchrun_flags import add_flags, torchrun_flags
from torchx.specs.errors import InvalidArgumentError

COMPONENT = "dist.ddp"

# flags whose torchx default is dist.ddp's, not torchrun's: None until given
_UNSET = ("rdzv_backend", "tee")
# flags dist.ddp sets on every node's torchrun itself, and what it sets
_SET_BY_JOB = {
    "rdzv_id": "the app id",
    "role": "dist.ddp's",
    "node_rank": "the node's replica id",
    "master_addr": "the first node's host",
}
# flags read into dist.ddp's arguments by _ddp_args
_MAPPED = frozenset(
    "nnodes nproc_per_node rdzv_backend rdzv_endpoint rdzv_conf standalone max_restarts tee"
    " module master_port".split()
)
_ROLE_DESTS = ("image", "h", "cpu", "gpu", "memMB")
_NNODES = re.compile(r"[0-9]+(:[0-9]+)?")


@dataclass(frozen=True)
class TorchrunRequest:
    """What a torchrun command line asks for, as dist.ddp's arguments."""

    component_args: List[str]  # as on ``torchx run dist.ddp ...``
    script: str  # the script, module (``module``) or program (``no_python``)
    module: bool = False
    no_python: bool = False
    ignored: List[str] = field(default_factory=list)  # "--rdzv_id 7: the app id is used"
    component: ClassVar[str] = COMPONENT


class _RaisingParser(argparse.ArgumentParser):
    """For library callers: a bad line raises instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise InvalidArgumentError(f"torchrun: {message}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """dist.ddp's role flags, torchrun's own flags, then the script and its arguments.

    ``parser`` must have no ``-h`` of its own (``-h`` is the named resource, as in dist.ddp).
    """
    flags = torchrun_flags()
    role = parser.add_argument_group("torchx (the job's role, as dist.ddp's flags)")
    role.add_argument("--image", default=None, help="image (default: dist.ddp's)")
    role.add_argument(
        "-h", dest="h", default=None, metavar="NAMED_RESOURCE", help="a named resource"
    )
    role.add_argument("--cpu", type=int, default=None, help="cpus per node")
    role.add_argument("--gpu", type=int, default=None, help="gpus per node")
    role.add_argument("--memMB", type=int, default=None, help="memory in MB per node")
    role.add_argument(
        "--env", default=None, metavar="KEY=VALUE[,KEY=VALUE...]", help="the workers' env"
    )
    own = parser.add_argument_group("torchrun (the installed torch's flags)")
    add_flags(own, flags, unset=_UNSET)
    parser.add_argument("training_script", help="the script (or module, program) to run")
    parser.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="the script's arguments"
    )


def parse(argv: Sequence[str]) -> TorchrunRequest:
    """A torchrun command line (without ``torchrun`` itself) as dist.ddp's arguments; a bad
    line raises :class:`InvalidArgumentError` with torchrun's usage message."""
    parser = _RaisingParser(prog="torchrun", add_help=False)
    add_arguments(parser)
    return request_from_args(parser.parse_args(list(argv)))


def request_from_args(args: argparse.Namespace) -> TorchrunRequest:
    """The request of a namespace parsed by a parser given :func:`add_arguments`."""
    flags = {f.dest: f for f in torchrun_flags()}
    ignored: List[str] = []
    env: List[str] = [args.env] if args.env else []
    for dest, flag in flags.items():
        value = getattr(args, dest, flag.default)
        if dest in _MAPPED or value == flag.default or value is None:
            continue
        if dest in _SET_BY_JOB:
            ignored.append(f"{flag.option_strings[-1]} {value}: {_SET_BY_JOB[dest]} is used")
        elif not flag.env:
            raise InvalidArgumentError(
                f"torchrun {flag.option_strings[-1]}: torch reads it only from the command line,"
                " which dist.ddp writes; run this job without it"
            )
        else:
            env.append(f"{flag.env_name}={'1' if value is True else value}")
    component_args = _ddp_args(args)
    for dest in _ROLE_DESTS:
        value = getattr(args, dest)
        if value is not None:
            component_args += [f"--{dest}", str(value)]
    if env:
        component_args += ["--env", ",".join(env)]
    script: str = args.training_script
    component_args += ["--m" if args.module else "--script", script]
    if args.training_script_args:
        component_args += ["--", *args.training_script_args]
    return TorchrunRequest(component_args, script, bool(args.module), bool(args.no_python), ignored)


def _ddp_args(args: argparse.Namespace) -> List[str]:
    if args.module and args.no_python:
        raise InvalidArgumentError(
            "torchrun: don't use both the '--no-python' flag and the '--module' flag"
        )
    nnodes, nproc = str(args.nnodes), str(args.nproc_per_node)
    if not _NNODES.fullmatch(nnodes):
        raise InvalidArgumentError(
            f"torchrun --nnodes {nnodes}: give a number of nodes N or a range MIN:MAX"
        )
    if not re.fullmatch(r"[0-9]+", nproc):
        raise InvalidArgumentError(
            f"torchrun --nproc_per_node {nproc}: torchx reserves each node's resources"
            " from a number of workers; give one (e.g. --nproc_per_node 2)"
        )
    _check_bounds(nnodes, nproc)
    low, _, high = nnodes.partition(":")
    nnodes = low if not high or high == low else nnodes
    backend: Optional[str] = args.rdzv_backend
    if args.standalone:
        if int(low) != 1 or int(high or low) != 1:
            raise InvalidArgumentError(
                f"torchrun --standalone runs one node, not --nnodes {args.nnodes};"
                " for several use --rdzv_backend c10d"
            )
        backend = "c10d"
    if backend not in (None, "c10d", "static"):
        raise InvalidArgumentError(
            f"torchrun --rdzv_backend {backend}: torchx hosts the rendezvous on the job's"
            " first node, with c10d (elastic) or static"
        )
    out = ["-j", f"{nnodes}x{nproc}", "--max_restarts", str(args.max_restarts)]
    if backend:
        out += ["--rdzv_backend", backend]
    port = _rdzv_port(args.rdzv_endpoint, args.master_port if backend == "static" else None)
    if port is not None:
        out += ["--rdzv_port", str(port)]
    if args.rdzv_conf:
        out += ["--rdzv_conf", args.rdzv_conf]
    if args.tee is not None:
        if not str(args.tee).isdigit():
            raise InvalidArgumentError(
                f"torchrun --tee {args.tee}: dist.ddp takes one stream number (0-3)"
                " for every local rank"
            )
        out += ["--tee", str(args.tee)]
    return out


def _check_bounds(nnodes: str, nproc: str) -> None:
    """dist.ddp's ``-j`` bounds, named by torchrun's flags (the user never typed ``-j``)."""
    if any(count(n) > MAX_NNODES for n in nnodes.split(":")):
        raise InvalidArgumentError(
            f"torchrun --nnodes {nnodes}: at most {MAX_NNODES:,} nodes are supported;"
            " check for a typo"
        )
    if count(nproc) > MAX_NPROC_PER_NODE:
        raise InvalidArgumentError(
            f"torchrun --nproc_per_node {nproc}: at most {MAX_NPROC_PER_NODE:,} processes per"
            " node are supported; check for a typo"
        )


def _rdzv_port(endpoint: str, master_port: Optional[int]) -> Optional[int]:
    """The port of ``HOST[:PORT]`` (its host is replaced by the job's first node)."""
    host, sep, port = (endpoint or "").rpartition(":")
    if not sep or "]" in port:  # no port (an IPv6 host alone ends in "]")
        return master_port
    if not port.isdigit():
        raise InvalidArgumentError(f"torchrun --rdzv_endpoint {endpoint}: give HOST:PORT")
    return int(port)
