"""Which app and role names are accepted: schedulers use them in paths, hostnames and
labels, so ``../../victim`` must be refused before anything is written."""

from __future__ import annotations

import re

from torchx.specs.api import AppDef, InvalidArgumentError

MAX_NAME_LENGTH = 128
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class InvalidNameError(InvalidArgumentError):
    """An app or role name that is empty, too long, or not of ``[A-Za-z0-9_.-]``."""


def validate_name(kind: str, name: str) -> None:
    """Raise ``InvalidNameError`` naming ``kind`` (``app``/``role``) unless ``name`` is usable."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"{kind} name {name!r} is not allowed: use letters, digits, '_', '.' and '-',"
            " starting with a letter, digit or '_'"
        )
    _check_length(kind, name)


def _check_length(kind: str, name: str) -> None:
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{kind} name {name[:40]!r}... is {len(name)} characters long;"
            f" use at most {MAX_NAME_LENGTH}"
        )


def role_name_from(text: str, default: str = "worker") -> str:
    """A valid role name made from ``text`` (a file stem, a module): ``"my script"`` ->
    ``"my_script"``. Only for names torchx derives: a name the user gives is checked as is."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).lstrip(".-")[:MAX_NAME_LENGTH]
    return name or default


def validate_app_name(name: str) -> None:
    """App names are looser than role names (schedulers normalize them into ids), but must
    not be empty, over-long, a path, or hold control characters."""
    if (
        not isinstance(name, str)
        or not name.strip()
        or name in (".", "..")
        or any(c in name for c in "/\\")
        or any(ord(c) < 32 for c in name)
    ):
        raise InvalidNameError(
            f"app name {name!r} is not allowed: give a non-empty name without '/', '\\'"
            " or control characters"
        )
    _check_length("app", name)


def validate_app_names(app: AppDef) -> None:
    """Check the app's name and every role's name (role names must also be distinct)."""
    validate_app_name(app.name)
    seen = set()
    for role in app.roles:
        validate_name("role", role.name)
        if role.name in seen:
            raise InvalidNameError(
                f"role name {role.name!r} is used twice in app {app.name!r}; give each role its own"
            )
        seen.add(role.name)
