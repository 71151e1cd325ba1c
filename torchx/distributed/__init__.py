"""Conveniences over ``torch.distributed`` for programs launched by torchx (upstream's
``torchx.distributed``): rank helpers that also work in a plain single process, a
process-group init that picks the backend, and "rank 0 first" blocks.

Needs torch (imported here); no other torchx module imports this one.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from typing import Any, ContextManager, Iterator, Literal

import torch
import torch.distributed as dist

from torchx.util.cuda import has_cuda_devices

log: logging.Logger = logging.getLogger(__name__)

Backend = Literal["nccl", "gloo", "auto"]


def local_rank() -> int:
    """``$LOCAL_RANK`` (set by torchrun/torchx); 0 in a plain process (with a warning if a
    process group exists without it)."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if dist.is_initialized():
        warnings.warn(
            "the default process group is initialized but LOCAL_RANK is not set;"
            " local_rank() returns 0 (launch with torchrun or torchx)",
            stacklevel=2,
        )
    return 0


def local_cuda_device() -> torch.device:
    """``cuda:<local_rank>``."""
    return torch.device(f"cuda:{local_rank()}")


def local_device() -> torch.device:
    """The device this rank should use: its GPU under an nccl group, else cpu; without a
    group, ``cuda`` if the host has a GPU."""
    if dist.is_initialized():
        return local_cuda_device() if dist.get_backend() == "nccl" else torch.device("cpu")
    return torch.device("cuda") if has_cuda_devices() else torch.device("cpu")


def rank() -> int:
    """The global rank, 0 without a process group."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of ranks, 1 without a process group."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank0() -> bool:
    return rank() == 0


def is_local_rank0() -> bool:
    return local_rank() == 0


def init_pg(backend: Backend = "auto", **kwargs: Any) -> torch.device:
    """Initialize the default process group and return this rank's device (``auto``: nccl
    with a CUDA device, else gloo). In a plain ``python`` process the group has one rank over
    an in-process store: no port and, unlike upstream, no ``MASTER_*`` env written."""
    if backend == "auto":
        backend = "nccl" if has_cuda_devices() and dist.is_nccl_available() else "gloo"
    if dist.is_torchelastic_launched():
        dist.init_process_group(backend=backend, **kwargs)
    else:
        kwargs.setdefault("store", dist.HashStore())
        dist.init_process_group(backend=backend, rank=0, world_size=1, **kwargs)
    return local_cuda_device() if backend == "nccl" else torch.device("cpu")


@contextmanager
def _first(first: bool) -> Iterator[None]:
    if dist.is_initialized() and not first:
        dist.barrier()
    try:
        yield
    finally:
        if dist.is_initialized() and first:
            dist.barrier()


def on_rank0_first() -> ContextManager[None]:
    """Run the block on rank 0 first, then on the other ranks (e.g. a download)."""
    return _first(is_rank0())


def on_local_rank0_first() -> ContextManager[None]:
    """Run the block on each host's local rank 0 first, then on that host's other ranks."""
    return _first(is_local_rank0())
