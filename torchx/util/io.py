"""``read_conf_file``: upstream's reader of component and config files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the dir that holds the torchx package
COMPONENTS_DIR: Path = Path("torchx/components")  # upstream's name, relative to that dir


def get_abspath(relpath: str) -> str:
    """``relpath`` under the directory that holds the installed torchx package."""
    return str(_PACKAGE_ROOT / relpath)


def _bundled_contents(conf_file: str) -> Optional[str]:
    """``conf_file`` relative to where torchx is installed (``torchx/components/dist.py``)."""
    path = _PACKAGE_ROOT / conf_file
    return path.read_text() if path.is_file() else None


def read_conf_file(conf_file: str) -> str:
    """The text of ``conf_file``; ``FileNotFoundError`` naming it if no source has it."""
    if os.path.exists(conf_file):
        with open(conf_file) as f:
            return f.read()
    from torchx.util.entrypoints import load

    get_contents = load("torchx.file", "get_file_contents", default=_bundled_contents)
    contents = get_contents(str(conf_file))
    if contents is None:
        raise FileNotFoundError(
            f"{conf_file} does not exist and is not a builtin;"
            " for a list of available builtins run `torchx builtins`"
        )
    return contents
