"""``local_cwd``: run each replica as a local process, in the current directory.

Unlike upstream TorchX, an app's state lives on disk, so any process can see it:

- ``schedule`` writes the app's ``Request`` into its directory under
  ``$TORCHX_HOME/local_cwd/<session>/<app_id>/`` (0700; files 0600, the environment may
  hold secrets) and starts a small detached supervisor. It starts the replicas, copies
  their output to ``{log_dir}/{session}/{app_id}/{role}/{replica}/{stdout,stderr,combined}.log``,
  applies retries and records the state.
- ``describe``/``list``/``log_iter`` only read those files; ``cancel`` signals the
  supervisor. So ``torchx status``/``log``/``list``/``cancel`` work from any shell.
- A terminal state never changes again; a bad file makes only its own app unreadable.
- ``cancel`` ends every process the app started (SIGTERM, then SIGKILL after
  ``GRACE_SECONDS``), also ones that ignore SIGTERM or left the session, and returns once
  the app is CANCELLED. A cancel while the app is still being launched sticks.
- If the supervisor itself dies, readers notice (pid and start time, never a pid alone),
  and ``cancel`` kills what is left of the app.
- A keyed submission claims its idempotency token before launching, so of racing
  submitters exactly one launches and the others re-attach to its app.

One job per module:

- ``protocol``: the app directory's files, the typed request and state, the state names
  and transitions, the lock (stdlib only);
- ``supervisor``: the detached per-app process (stdlib only, so a bare ``python -S -E``
  can run it);
- ``launch``: starting it, by forking a small single-threaded launcher, else by exec;
- ``processes``: which processes are an app's, and ending them (stdlib only);
- ``logs``: cutting output into lines and reading it back (stdlib only);
- ``control``: the state seen from outside the supervisor, and cancel;
- ``claims``: idempotency-token claims;
- ``images``: image providers and GPUs (upstream's API);
- ``scheduler``: ``LocalScheduler``, the ``Scheduler`` over all of the above;
- ``compat``: upstream names ``local_cwd`` does not use itself.

``torchx.schedulers.local_scheduler`` (upstream's module path) re-exports the public names.
This package imports nothing itself: the supervisor is imported through it.
"""
