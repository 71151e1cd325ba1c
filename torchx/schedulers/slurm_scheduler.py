"""Upstream's module path of the slurm scheduler: ``slurm`` lives in the
``torchx.schedulers.slurm`` package; this module re-exports what upstream's
``torchx.schedulers.slurm_scheduler`` offered (and ``SlurmError``), so code written against
it keeps working.
"""

from torchx.schedulers.slurm.batch import (  # noqa: F401
    RANK0_ENV,
    SBATCH_GROUP_OPTIONS,
    SBATCH_JOB_OPTIONS,
    SlurmBatchRequest,
    SlurmOpts,
    SlurmReplicaRequest,
)
from torchx.schedulers.slurm.scheduler import SlurmScheduler, create_scheduler  # noqa: F401
from torchx.schedulers.slurm.status import SLURM_STATES, SlurmError  # noqa: F401
