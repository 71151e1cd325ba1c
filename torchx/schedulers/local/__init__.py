"""``local_cwd``: run each replica as a local process, in the current directory.

Unlike upstream TorchX, an app's state lives on disk, in
``$TORCHX_HOME/local_cwd/<session>/<app_id>/``, so ``torchx status``/``log``/``list``/``cancel``
work from any shell. ``schedule`` writes the app's request there and starts a detached
supervisor, which runs the replicas, copies their output to
``{log_dir}/{session}/{app_id}/{role}/{replica}/{stdout,stderr,combined}.log``, applies
retries and records the state. Readers only read those files. A terminal state never
changes again, and a bad file makes only its own app unreadable.

Modules: ``protocol`` (the app directory's files, states and lock), ``supervisor`` and
``launch`` (the per-app process, and how it is started), ``processes`` (which processes
are an app's), ``logs``, ``control`` (the state seen from outside, and cancel), ``claims``
(idempotency tokens), ``images`` (upstream's image providers) and ``scheduler``
(``LocalScheduler``). ``torchx.schedulers.local_scheduler`` is upstream's module path.
The supervisor imports this package, so it imports nothing itself.
"""
