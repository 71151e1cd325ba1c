"""Workspaces: run the user's local code on a scheduler without building an image by hand.

Dir workspaces (local_cwd, slurm) copy the files into the job's directory; docker
workspaces (kubernetes, aws_batch) build them into an image on top of the role's image.
"""

from torchx.workspace.api import (  # noqa: F401
    Workspace,
    WorkspaceBuild,
    WorkspaceError,
    WorkspaceMixin,
    apply_workspace,
    walk_workspace,
)
