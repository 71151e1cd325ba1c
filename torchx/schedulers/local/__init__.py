"""``local_cwd``, the local scheduler (its modules: see ``scheduler``)."""
