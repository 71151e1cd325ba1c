"""Workspaces: run the user's local code on a scheduler without building an image by hand.

A workspace is an fsspec path (``file://.`` is the current directory, ``memory://x/``
an in-memory one). Schedulers that mix in a ``WorkspaceMixin`` put its files in front of
``app.roles[0]``'s image at submit time:

- ``local_cwd`` and ``slurm`` (dir workspaces): the files are copied into the job's
  directory and the role runs there; ``.torchxignore`` says what to leave out.
- ``kubernetes`` and ``aws_batch`` (docker workspaces): the files are built into a new
  image on top of the role's image, pushed to ``image_repo`` and the role runs that
  image; ``.dockerignore`` says what to leave out.

``torchx run`` uses the current directory unless ``--workspace`` says otherwise;
``--workspace ""`` turns workspaces off.
"""

from torchx.workspace.api import (  # noqa: F401
    Workspace,
    WorkspaceBuild,
    WorkspaceError,
    WorkspaceMixin,
    apply_workspace,
    walk_workspace,
)
