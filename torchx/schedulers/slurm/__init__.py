"""``slurm``: ``batch`` builds the ``sbatch`` request, ``status`` reads what Slurm says about
a job, ``scheduler`` is ``SlurmScheduler`` over both. ``torchx.schedulers.slurm_scheduler``
(upstream's module path) re-exports the public names; this package imports nothing itself.
"""
