"""The image torchx's KFP steps run in: ``$TORCHX_KFP_BASE_IMAGE`` (read when the pipeline
is compiled), default ``torchx.IMAGE``; it must have torchx installed.
"""

from __future__ import annotations

import os

from torchx import IMAGE

ENV_BASE_IMAGE = "TORCHX_KFP_BASE_IMAGE"


def base_image() -> str:
    return os.environ.get(ENV_BASE_IMAGE, "").strip() or IMAGE
