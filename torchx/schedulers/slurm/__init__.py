"""``slurm``: an AppDef as one heterogeneous ``sbatch`` job, one het group per replica.

One job per module:

- ``batch``: the ``sbatch`` request and its batch script (options, het groups, the
  idempotency token in the job comment);
- ``status``: what Slurm says about one job (``squeue``, ``sacct``, ``scontrol``, the
  ``jobcomp`` log), parsed into het groups and states;
- ``scheduler``: ``SlurmScheduler``, the ``Scheduler`` over both.

``torchx.schedulers.slurm_scheduler`` (upstream's module path) re-exports the public names.
This package imports nothing itself.
"""
