"""``kubernetes``: an AppDef as a Volcano Job or as Indexed Jobs plus a headless Service.

One concept per module, each saying what it holds: ``api``, ``manifests``, ``status``,
``logs``, ``claims``, and ``scheduler`` over them. ``torchx.schedulers.kubernetes_scheduler``
is upstream's module path. This package imports nothing itself.
"""
