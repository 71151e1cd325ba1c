"""``.dockerignore`` rules, applied the way Docker applies them to a build context
(``moby/patternmatcher``), for ``.dockerignore`` and ``.torchxignore`` alike.

Upstream TorchX matches with ``fnmatch``, where ``*`` also crosses ``/``; Docker does not,
and neither do we. An excluded directory is not read unless a ``!`` pattern names a path
inside it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import List

from torchx.specs import TorchXError


class InvalidIgnorePatternError(TorchXError, ValueError):
    """A line of an ignore file that is not a valid pattern."""


@dataclass(frozen=True)
class IgnorePattern:
    """One cleaned pattern; ``reinclude`` for a ``!`` line."""

    pattern: str
    reinclude: bool
    regex: re.Pattern[str]


def _translate_class(pattern: str, start: int, source: str) -> tuple[str, int]:
    """The regex for the bracket expression at ``pattern[start]`` and the index after it."""
    i = start + 1
    out = "["
    if i < len(pattern) and pattern[i] == "^":
        out += "^"
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out += re.escape(pattern[i + 1])
            i += 2
            continue
        out += ch if ch == "-" else re.escape(ch)
        i += 1
    if i >= len(pattern) or out in ("[", "[^"):
        raise InvalidIgnorePatternError(
            f"{source}: bad character class in pattern {pattern!r}; close it with ']'"
        )
    return out + "]", i + 1


def compile_pattern(pattern: str, source: str = ".dockerignore") -> re.Pattern[str]:
    """The anchored regex Docker builds for a cleaned ``pattern``."""
    out: List[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                out.append(".*" if i >= n else "(.*/)?")
                continue
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\":
            if i + 1 < n:
                out.append(re.escape(pattern[i + 1]))
                i += 2
                continue
            out.append(re.escape(ch))
        elif ch == "[":
            regex, i = _translate_class(pattern, i, source)
            out.append(regex)
            continue
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("^" + "".join(out) + "$", re.DOTALL)


class IgnoreRules:
    """The patterns of one ignore file, answering "is this path left out?"."""

    def __init__(self, text: str = "", source: str = ".dockerignore") -> None:
        self.patterns: List[IgnorePattern] = []
        for raw in text.removeprefix("\ufeff").splitlines():
            line = raw.strip()
            if not line or raw.startswith("#"):
                continue
            reinclude = line.startswith("!")
            if reinclude:
                line = line[1:].strip()
                if not line:
                    raise InvalidIgnorePatternError(
                        f"{source}: a lone '!' is not a pattern; write '!PATH' to re-include PATH"
                    )
            # Go's ``filepath.Clean``; a leading ``/`` is the context's root, as no ``/``
            pattern = posixpath.normpath(line).lstrip("/") or "/"
            self.patterns.append(
                IgnorePattern(pattern, reinclude, compile_pattern(pattern, source))
            )

    def excluded(self, relpath: str) -> bool:
        """Whether ``relpath`` is left out: the last pattern that matches it or one of its parent
        directories decides."""
        parent = posixpath.dirname(relpath)
        parents = parent.split("/") if parent else []
        excluded = False
        for p in self.patterns:
            if p.reinclude != excluded:
                continue  # cannot change the outcome
            hit = p.regex.match(relpath) or any(
                p.regex.match("/".join(parents[: i + 1])) for i in range(len(parents))
            )
            if hit:
                excluded = not p.reinclude
        return excluded

    def skip_dir(self, reldir: str) -> bool:
        """Whether ``reldir`` is excluded and no ``!`` pattern names a path under it."""
        if not self.excluded(reldir):
            return False
        prefix = reldir + "/"
        return not any(p.reinclude and (p.pattern + "/").startswith(prefix) for p in self.patterns)
