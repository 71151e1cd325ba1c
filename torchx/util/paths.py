"""Where torchx keeps its own files (local job state, the embedded MLflow store).

Another user who can write there could plant a job whose recorded pid names one of our
processes, for our ``cancel`` to signal, or a symlink for our writes to follow. So, as ssh
refuses a group-writable ``~/.ssh``, a state directory owned by another user, or writable
by group or others, is refused (``UnsafeStateRootError``); what torchx creates is 0700.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import Union

ENV_TORCHX_HOME = "TORCHX_HOME"
DIR_MODE = 0o700


class UnsafeStateRootError(PermissionError):
    """A state directory another user can write: nothing in it is read or signalled.
    A user error whose one-line message says how to fix it; defined here, below ``specs``,
    like ``torchx.util.modules.MissingExtraError``."""


def torchx_home(given: Union[str, Path, None] = None) -> Path:
    """``given`` (a scheduler's ``torchx_home`` parameter, e.g. from an Airflow Connection),
    else ``$TORCHX_HOME``, else ``~/.torchx``; created 0700 on first use (job requests hold
    the replicas' environment, secrets included) and refused if another user can write it."""
    home = str(given or os.environ.get(ENV_TORCHX_HOME) or Path.home() / ".torchx")
    if not check_private_dir(home):
        makedirs_private(home)
        check_private_dir(home)
    return Path(home)


def state_dir(*parts: str, given: Union[str, Path, None] = None) -> Path:
    """``torchx_home(given)/parts...`` (e.g. ``local_cwd/<session>``), each level that exists
    checked like the root (one ``stat`` each: a poll resolves it per app); missing levels are
    left for the writer to create (``makedirs_private``), so a reader writes nothing."""
    path = str(torchx_home(given))
    exists = True
    for name in "/".join(parts).split("/"):
        path = os.path.join(path, name)
        exists = exists and check_private_dir(path)
    return Path(path)


def check_private_dir(path: Union[str, Path]) -> bool:
    """Whether ``path`` exists; ``UnsafeStateRootError`` if it is owned by another user or
    writable by group or others."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if not hasattr(os, "getuid"):  # no owners to check (Windows)
        return True
    me = os.getuid()
    own = "set TORCHX_HOME to a directory of your own"
    if st.st_uid != me:
        raise UnsafeStateRootError(
            f"refusing {path}: it is owned by {_user(st.st_uid)}, not by you ({_user(me)}); {own}"
        )
    if st.st_mode & 0o022:
        who = "others" if st.st_mode & 0o002 else "its group"
        raise UnsafeStateRootError(
            f"refusing {path}: it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o});"
            f" chmod go-w {shlex.quote(str(path))}, or {own}"
        )
    return True


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def makedirs_private(path: Union[str, Path]) -> None:
    """``mkdir -p`` creating each missing directory 0700, whatever the umask (existing ones
    are left alone, and checked by the caller)."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        return
    makedirs_private(path.parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def write_private(path: Union[str, Path], text: str) -> None:
    """Replace ``path`` with ``text``, readable by its owner only (0600; a directory it
    creates is 0700), atomically: a reader sees the old file or the new one, never half.
    The new file is written aside under a random name (``O_EXCL | O_NOFOLLOW``) and renamed
    over ``path``, so a symlink planted at either name never redirects the write."""
    import tempfile  # 5 ms of imports, for the few commands that write

    path = Path(path)
    makedirs_private(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):  # left only when the write failed
            os.unlink(tmp)
