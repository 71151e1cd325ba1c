"""The one setting for the image torchx's KFP steps run in.

``$TORCHX_KFP_BASE_IMAGE`` (read when a pipeline is built, i.e. compiled), default
``torchx.IMAGE``. It is the image of ``torchx_launcher``, ``start_pipeline_run`` and
``close_pipeline_run``, and of ``component_from_app`` containers whose role keeps torchx's
default image. It must have torchx installed (with the ``kfp`` and tracker extras).
One task can still use another image with KFP's ``task.set_container_image(...)``.
"""

from __future__ import annotations

import os

from torchx import IMAGE

ENV_BASE_IMAGE = "TORCHX_KFP_BASE_IMAGE"


def base_image() -> str:
    """``$TORCHX_KFP_BASE_IMAGE``, else ``torchx.IMAGE``."""
    return os.environ.get(ENV_BASE_IMAGE, "").strip() or IMAGE
