"""torchx: launch PyTorch jobs on any scheduler, as steps of Airflow, KFP and Prefect pipelines."""

import os

__version__ = "0.8.0.dev0"

# The default image of builtin components, KFP steps and the container schedulers: the tag the
# repository's Dockerfile is built as. Push it to your registry and name it in $TORCHX_IMAGE
# (read once, at import) so clusters pull it; local_cwd and slurm ignore images.
IMAGE = os.environ.get("TORCHX_IMAGE", "").strip() or f"torchx:{__version__}"
