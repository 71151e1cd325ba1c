"""Device mounts for a role's ``resource.devices`` (upstream's ``torchx.schedulers.devices``):
``{"vpc.amazonaws.com/efa": 2}`` -> ``/dev/infiniband/uverbs0`` and ``...1`` mounted as is."""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable, Dict, List, Mapping

from torchx.specs.api import DeviceMount
from torchx.specs.named_resources_aws import EFA_DEVICE, NEURON_DEVICE


def to_devicemounts(num_devices: int, device_type: str) -> List[DeviceMount]:
    """``num_devices`` mounts of ``<device_type>0``, ``<device_type>1``, ... at the same path."""
    return [DeviceMount(f"{device_type}{i}", f"{device_type}{i}") for i in range(num_devices)]


neuron_to_devicemounts: Callable[[int], List[DeviceMount]] = partial(
    to_devicemounts, device_type="/dev/neuron"
)
efa_to_devicemounts: Callable[[int], List[DeviceMount]] = partial(
    to_devicemounts, device_type="/dev/infiniband/uverbs"
)

DEVICES: Mapping[str, Callable[[int], List[DeviceMount]]] = {
    EFA_DEVICE: efa_to_devicemounts,
    NEURON_DEVICE: neuron_to_devicemounts,
}


def get_device_mounts(devices: Dict[str, int]) -> List[DeviceMount]:
    """The mounts for named devices; an unknown name is skipped with a warning."""
    mounts: List[DeviceMount] = []
    for name, count in devices.items():
        if name not in DEVICES:
            warnings.warn(f"Could not find named device: {name}", stacklevel=2)
            continue
        mounts += DEVICES[name](count)
    return mounts
