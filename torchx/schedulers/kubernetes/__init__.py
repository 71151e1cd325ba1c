"""``kubernetes``: an AppDef as a Volcano Job or as Indexed Jobs plus a headless Service.

One job per module:

- ``api``: the client set-up, and every API failure as one ``KubernetesError``;
- ``manifests``: the Volcano Job / Indexed Jobs / Service an AppDef becomes (labels,
  annotations, resources, mounts);
- ``status``: Kubernetes objects to torchx states (pure functions, no client calls);
- ``logs``: reading and following a replica's pod log;
- ``claims``: a keyed submission's claim on its name (a ConfigMap);
- ``scheduler``: ``KubernetesScheduler``, the ``Scheduler`` over all of the above.

``torchx.schedulers.kubernetes_scheduler`` (upstream's module path) re-exports the public
names and defines upstream's names the scheduler does not use itself. This package imports
nothing itself.
"""
