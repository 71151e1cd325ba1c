"""What the ``torchx`` command writes goes through one ``Masker`` (torchx.specs.secrets):
the secrets of its own env and arguments, and those a verb learns (an app's env), are
shown as ``***`` on stdout, stderr and in its log lines, wherever they appear."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, List, Optional, TextIO, cast

from torchx.specs.secrets import Masker, mask_args

_current: Optional[Masker] = None


def masker() -> Masker:
    """The running command's masker (a fresh one outside a command: nothing to mask yet)."""
    return _current if _current is not None else Masker()


class MaskedStream:
    """A text stream that masks what is written to it, then passes it on."""

    def __init__(self, stream: TextIO, mask: Masker) -> None:
        self._stream, self._mask = stream, mask
        self.encoding = stream.encoding

    def write(self, text: str) -> int:
        self._stream.write(self._mask.mask(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()


@contextlib.contextmanager
def masked_output(argv: List[str]) -> Iterator[Masker]:
    """For the command's duration: stdout and stderr masked, with the secrets of this
    process's env and of ``argv`` registered."""
    global _current
    mask = Masker()
    mask.add_env(os.environ)
    found: List[str] = []
    mask_args(list(argv), found)
    for value in found:
        mask.add(value)
    saved = _current, sys.stdout, sys.stderr
    _current = mask
    sys.stdout = cast(TextIO, MaskedStream(sys.stdout, mask))
    sys.stderr = cast(TextIO, MaskedStream(sys.stderr, mask))
    try:
        yield mask
    finally:
        _current, sys.stdout, sys.stderr = saved
