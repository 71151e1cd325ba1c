"""torchx: launch PyTorch jobs on any scheduler, as steps of Airflow, KFP and Prefect pipelines."""

__version__ = "0.8.0.dev0"

# Default image for builtin components; local schedulers ignore it (they run in the cwd).
IMAGE = f"ghcr.io/pytorch/torchx:{__version__}"
