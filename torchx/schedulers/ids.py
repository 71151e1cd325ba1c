"""App ids: the one generator every scheduler uses.

Ids come from ``os.urandom``, so a script that seeds ``random`` still gets fresh ids
(``secrets`` is not imported: it costs ~4 ms of every CLI start for what a few bytes give).
"""

from __future__ import annotations

import os
import re
import string

_LETTERS = string.ascii_lowercase
_ALPHABET = string.ascii_lowercase + string.digits


def _choices(alphabet: str, n: int) -> str:
    """``n`` characters drawn uniformly from ``alphabet`` (a byte is kept only below the
    largest multiple of ``len(alphabet)``, so no character is favoured)."""
    size = len(alphabet)
    limit = 256 - 256 % size
    out: list[str] = []
    while len(out) < n:
        out.extend(alphabet[b % size] for b in os.urandom(2 * n) if b < limit)
    return "".join(out[:n])


def random_id(length: int = 10) -> str:
    """``length`` random characters of ``[a-z0-9]`` (the first one a letter)."""
    return _choices(_LETTERS, 1) + _choices(_ALPHABET, length - 1)


def random_uint64() -> int:
    return int.from_bytes(os.urandom(8), "big")


def make_unique(name: str, string_length: int = 0) -> str:
    """``{name}-{random}``, like upstream; ``string_length`` defaults to 10 characters."""
    return f"{name}-{random_id(string_length or 10)}"


def unique_name(name: str, max_base: int = 40, suffix_length: int = 10) -> str:
    """``make_unique`` of ``name`` lower-cased, runs of characters outside ``[a-z0-9-]``
    turned into ``-`` and the base cut to ``max_base`` characters (never empty)."""
    return f"{_base(name, max_base)}-{random_id(suffix_length)}"


def keyed_name(name: str, token: str, generation: str, max_base: int = 40) -> str:
    """``{name}-{token's last 12 hex digits}-{generation}``, ``name`` as ``unique_name``
    cuts it: the id every racing submission of one key picks when they saw the same apps,
    so the backend's refusal of a second job under one name decides between them."""
    return f"{_base(name, max_base)}-{token[-12:]}-{generation}"


def _base(name: str, max_base: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:max_base].strip("-") or "app"
