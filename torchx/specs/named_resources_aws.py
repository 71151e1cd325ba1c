"""AWS EC2 instance types as named resources (memory reduced by MEM_TAX for the OS/agent)."""

from __future__ import annotations

from typing import Callable, Mapping

from torchx.specs.api import Resource

MEM_TAX = 0.96
GiB = 1024
K8S_ITYPE = "node.kubernetes.io/instance-type"
EFA_DEVICE = "vpc.amazonaws.com/efa"
NEURON_DEVICE = "aws.amazon.com/neurondevice"

# name: (instance type, vcpu, gpu, memory GiB, devices)
_INSTANCES = {
    "aws_t3_medium": ("t3.medium", 2, 0, 4, {}),
    "aws_m5_2xlarge": ("m5.2xlarge", 8, 0, 32, {}),
    "aws_c5_18xlarge": ("c5.18xlarge", 72, 0, 144, {}),
    "aws_p3_2xlarge": ("p3.2xlarge", 8, 1, 61, {}),
    "aws_p3_8xlarge": ("p3.8xlarge", 32, 4, 244, {}),
    "aws_p3_16xlarge": ("p3.16xlarge", 64, 8, 488, {}),
    "aws_p3dn_24xlarge": ("p3dn.24xlarge", 96, 8, 768, {EFA_DEVICE: 1}),
    "aws_p4d_24xlarge": ("p4d.24xlarge", 96, 8, 1152, {EFA_DEVICE: 4}),
    "aws_p4de_24xlarge": ("p4de.24xlarge", 96, 8, 1152, {EFA_DEVICE: 4}),
    "aws_p5_48xlarge": ("p5.48xlarge", 192, 8, 2048, {EFA_DEVICE: 32}),
    "aws_g4dn_xlarge": ("g4dn.xlarge", 4, 1, 16, {}),
    "aws_g4dn_12xlarge": ("g4dn.12xlarge", 48, 4, 192, {}),
    "aws_g5_xlarge": ("g5.xlarge", 4, 1, 16, {}),
    "aws_g5_2xlarge": ("g5.2xlarge", 8, 1, 32, {}),
    "aws_g5_4xlarge": ("g5.4xlarge", 16, 1, 64, {}),
    "aws_g5_8xlarge": ("g5.8xlarge", 32, 1, 128, {}),
    "aws_g5_12xlarge": ("g5.12xlarge", 48, 4, 192, {}),
    "aws_g5_16xlarge": ("g5.16xlarge", 64, 1, 256, {}),
    "aws_g5_24xlarge": ("g5.24xlarge", 96, 4, 384, {}),
    "aws_g5_48xlarge": ("g5.48xlarge", 192, 8, 768, {}),
    "aws_g6e_xlarge": ("g6e.xlarge", 4, 1, 32, {}),
    "aws_g6e_12xlarge": ("g6e.12xlarge", 48, 4, 384, {}),
    "aws_g6e_48xlarge": ("g6e.48xlarge", 192, 8, 1536, {}),
    "aws_trn1_2xlarge": ("trn1.2xlarge", 8, 0, 32, {NEURON_DEVICE: 1}),
    "aws_trn1_32xlarge": ("trn1.32xlarge", 128, 0, 512, {NEURON_DEVICE: 16, EFA_DEVICE: 8}),
}


def _factory(itype: str, cpu: int, gpu: int, mem: int, devices: dict) -> Callable[[], Resource]:
    return lambda: Resource(
        cpu=cpu,
        gpu=gpu,
        memMB=int(mem * GiB * MEM_TAX),
        capabilities={K8S_ITYPE: itype},
        devices=dict(devices),
    )


NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {
    name: _factory(*spec) for name, spec in _INSTANCES.items()
}
