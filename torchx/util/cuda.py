"""Whether this host can put tensors on a GPU (upstream's ``torchx.util.cuda``)."""

from __future__ import annotations


def has_cuda_devices() -> bool:
    """True when torch is CUDA-capable AND the host has a CUDA device (``is_available``
    alone is true for a CUDA build on a CPU-only host). Imports torch on call."""
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0
