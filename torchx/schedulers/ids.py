"""App ids: the one generator every scheduler uses.

Ids come from ``secrets`` (the OS's entropy), so a launching script that seeds
``random`` (``random.seed(42)``) still gets a fresh id on every submission.
"""

from __future__ import annotations

import re
import secrets
import string

_ALPHABET = string.ascii_lowercase + string.digits


def random_id(length: int = 10) -> str:
    """``length`` random characters of ``[a-z0-9]`` (the first one a letter)."""
    first = secrets.choice(string.ascii_lowercase)
    return first + "".join(secrets.choice(_ALPHABET) for _ in range(length - 1))


def random_uint64() -> int:
    """A random 64-bit unsigned integer."""
    return secrets.randbits(64)


def make_unique(name: str, string_length: int = 0) -> str:
    """``{name}-{random}``, like upstream; ``string_length`` defaults to 10 characters."""
    return f"{name}-{random_id(string_length or 10)}"


def unique_name(
    name: str, max_base: int = 40, suffix_length: int = 10, pattern: str = r"[^a-z0-9-]+"
) -> str:
    """``make_unique`` of ``name`` lower-cased, with characters outside ``pattern``'s complement
    turned into ``-`` and the base cut to ``max_base`` characters (never empty)."""
    base = re.sub(pattern, "-", name.lower()).strip("-_")[:max_base].strip("-_") or "app"
    return f"{base}-{random_id(suffix_length)}"
