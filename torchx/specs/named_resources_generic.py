"""Scheduler-agnostic named resources (``-h gpu.small``); memory in MB, GiB = 1024 MB."""

from __future__ import annotations

from typing import Callable, Mapping

from torchx.specs.api import Resource

GiB = 1024


def _res(cpu: int, gpu: int, mem_gib: float) -> Callable[[], Resource]:
    return lambda: Resource(cpu=cpu, gpu=gpu, memMB=int(mem_gib * GiB))


NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {
    "gpu.small": _res(8, 1, 32),
    "gpu.medium": _res(16, 2, 64),
    "gpu.large": _res(32, 4, 128),
    "gpu.xlarge": _res(64, 8, 256),
    "cpu.nano": _res(1, 0, 0.5),
    "cpu.micro": _res(1, 0, 1),
    "cpu.small": _res(1, 0, 2),
    "cpu.medium": _res(2, 0, 4),
    "cpu.large": _res(2, 0, 8),
    "cpu.xlarge": _res(8, 0, 32),
}
GENERIC_NAMED_RESOURCES = NAMED_RESOURCES  # torchx.specs' name for it
