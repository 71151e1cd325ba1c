"""AWS EC2 instance types as named resources (``-h aws_p4d.24xlarge``), as upstream's."""

from __future__ import annotations

import warnings
from typing import Callable, Dict, Mapping, Optional

from torchx.specs.api import Resource

EFA_DEVICE = "vpc.amazonaws.com/efa"
NEURON_DEVICE = "aws.amazon.com/neurondevice"
MEM_TAX = 0.96
K8S_ITYPE = "node.kubernetes.io/instance-type"
GiB: int = int(1024 * MEM_TAX)


def instance_type_from_resource(resource: Resource) -> Optional[str]:
    """The EC2 instance type a resource was made for, or None (with a warning)."""
    instance_type = resource.capabilities.get(K8S_ITYPE)
    if instance_type is None:
        warnings.warn(
            "Cannot determine the instance type of the resource, which can cause issues for"
            " non-homogeneous compute environments and multinode jobs; add the capability"
            f" {K8S_ITYPE!r} (torchx.specs.named_resources_aws.K8S_ITYPE) to the resource",
            stacklevel=2,
        )
    return instance_type


def _instance(
    itype: str, cpu: int, gpu: int, mem_gib: int, devices: Optional[Dict[str, int]] = None
) -> Callable[[], Resource]:
    """The factory of the named resource ``aws_<itype>``: a new ``Resource`` per call."""

    def factory() -> Resource:
        return Resource(
            cpu=cpu,
            gpu=gpu,
            memMB=mem_gib * GiB,
            capabilities={K8S_ITYPE: itype},
            devices=dict(devices or {}),
        )

    factory.__name__ = factory.__qualname__ = "aws_" + itype.replace(".", "_")
    return factory


aws_p3_2xlarge = _instance("p3.2xlarge", 8, 1, 61)
aws_p3_8xlarge = _instance("p3.8xlarge", 32, 4, 244)
aws_p3_16xlarge = _instance("p3.16xlarge", 64, 8, 488)
aws_p3dn_24xlarge = _instance("p3dn.24xlarge", 96, 8, 768, {EFA_DEVICE: 1})
aws_p4d_24xlarge = _instance("p4d.24xlarge", 96, 8, 1152, {EFA_DEVICE: 4})
aws_p4de_24xlarge = _instance("p4de.24xlarge", 96, 8, 1152, {EFA_DEVICE: 4})
aws_p5_48xlarge = _instance("p5.48xlarge", 192, 8, 2048, {EFA_DEVICE: 32})
aws_p5en_48xlarge = _instance("p5en.48xlarge", 192, 8, 2048, {EFA_DEVICE: 16})
aws_t3_medium = _instance("t3.medium", 2, 0, 4)
aws_m5_2xlarge = _instance("m5.2xlarge", 8, 0, 32)
aws_c5_18xlarge = _instance("c5.18xlarge", 72, 0, 142)
aws_g4dn_xlarge = _instance("g4dn.xlarge", 4, 1, 16)
aws_g4dn_2xlarge = _instance("g4dn.2xlarge", 8, 1, 32)
aws_g4dn_4xlarge = _instance("g4dn.4xlarge", 16, 1, 64)
aws_g4dn_8xlarge = _instance("g4dn.8xlarge", 32, 1, 128, {EFA_DEVICE: 1})
aws_g4dn_12xlarge = _instance("g4dn.12xlarge", 48, 4, 192, {EFA_DEVICE: 1})
aws_g4dn_16xlarge = _instance("g4dn.16xlarge", 64, 1, 256, {EFA_DEVICE: 1})
aws_g4dn_metal = _instance("g4dn.metal", 96, 8, 384, {EFA_DEVICE: 1})
aws_g5_xlarge = _instance("g5.xlarge", 4, 1, 16)
aws_g5_2xlarge = _instance("g5.2xlarge", 8, 1, 32)
aws_g5_4xlarge = _instance("g5.4xlarge", 16, 1, 64)
aws_g5_8xlarge = _instance("g5.8xlarge", 32, 1, 128, {EFA_DEVICE: 1})
aws_g5_12xlarge = _instance("g5.12xlarge", 48, 4, 192, {EFA_DEVICE: 1})
aws_g5_16xlarge = _instance("g5.16xlarge", 64, 1, 256, {EFA_DEVICE: 1})
aws_g5_24xlarge = _instance("g5.24xlarge", 96, 4, 384, {EFA_DEVICE: 1})
aws_g5_48xlarge = _instance("g5.48xlarge", 192, 8, 768, {EFA_DEVICE: 1})
aws_g6e_xlarge = _instance("g6e.xlarge", 4, 1, 32)
aws_g6e_2xlarge = _instance("g6e.2xlarge", 8, 1, 64)
aws_g6e_4xlarge = _instance("g6e.4xlarge", 16, 1, 128)
aws_g6e_8xlarge = _instance("g6e.8xlarge", 32, 1, 256)
aws_g6e_16xlarge = _instance("g6e.16xlarge", 64, 1, 512)
aws_g6e_12xlarge = _instance("g6e.12xlarge", 48, 4, 384)
aws_g6e_24xlarge = _instance("g6e.24xlarge", 96, 4, 768, {EFA_DEVICE: 2})
aws_g6e_48xlarge = _instance("g6e.48xlarge", 192, 8, 1536, {EFA_DEVICE: 4})
aws_trn1_2xlarge = _instance("trn1.2xlarge", 8, 0, 32, {NEURON_DEVICE: 1})
aws_trn1_32xlarge = _instance("trn1.32xlarge", 128, 0, 512, {EFA_DEVICE: 8, NEURON_DEVICE: 16})
aws_inf2_xlarge = _instance("inf2.xlarge", 4, 0, 16, {NEURON_DEVICE: 1})
aws_inf2_8xlarge = _instance("inf2.8xlarge", 32, 0, 128, {NEURON_DEVICE: 1})
aws_inf2_24xlarge = _instance("inf2.24xlarge", 96, 0, 384, {NEURON_DEVICE: 6})
aws_inf2_48xlarge = _instance("inf2.48xlarge", 192, 0, 768, {NEURON_DEVICE: 12})

# upstream's names: the function aws_p3_2xlarge is the named resource "aws_p3.2xlarge"
NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {
    "{}.{}".format(*name.rsplit("_", 1)): fn
    for name, fn in list(globals().items())
    if name.startswith("aws_") and callable(fn)
}
AWS_NAMED_RESOURCES = NAMED_RESOURCES  # torchx.specs' name for it
