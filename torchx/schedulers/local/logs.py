"""``local_cwd`` log lines, cut into whole lines (by the supervisor as it writes
``combined.log``, and by readers) in bounded memory. Stdlib only: the supervisor imports it.

``LogLines`` (what ``LocalScheduler.log_iter`` returns) is an iterator of lines, as the
Scheduler API promises; its ``blocks()`` gives the same text in pieces of many lines, so
``torchx run``/``torchx log`` print a million lines in a few writes instead of a million.
"""

from __future__ import annotations

import os
import re
import time
from typing import BinaryIO, Callable, Generator, Iterator, List, Optional

Chunks = Generator[bytes, None, None]

READ_SIZE = 1 << 20
POLL_SECONDS = 0.02
# a follower that just read something checks again sooner (doubling up to POLL_SECONDS):
# output and the app's end come together, so a short app's end is seen within ms
FIRST_POLL_SECONDS = 0.002

# A log line longer than LINE_LIMIT bytes is cut into pieces of at most LINE_LIMIT bytes,
# each ending with LINE_SPLIT_MARKER, so no reader ever buffers more than that per line.
LINE_LIMIT = 1 << 20
LINE_SPLIT_MARKER = b" [torchx: line longer than 1 MiB, continued on the next line]"


def utf8_cut(buf: bytes | bytearray, limit: int) -> int:
    """The largest cut <= ``limit`` that does not split a UTF-8 character (if there is one)."""
    for back in range(4):
        cut = limit - back
        if cut > 0 and (buf[cut] & 0xC0) != 0x80:
            return cut
    return limit


class LineBuffer:
    """Bytes in, whole lines out; a line over ``LINE_LIMIT`` comes out in marked pieces.

    Memory stays bounded by the limit plus one chunk, however long a line is.
    """

    def __init__(self, limit: int = LINE_LIMIT) -> None:
        self._buf = bytearray()
        self._piece = limit - len(LINE_SPLIT_MARKER)
        self._limit = limit

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines (each ending in ``\\n``) that ``chunk`` completes."""
        if len(chunk) > self._limit:  # keeps the invariant below: no line spans > 2 chunks
            step = self._limit
            return b"".join(self.feed(chunk[i : i + step]) for i in range(0, len(chunk), step))
        if not self._buf:  # the common case: one cheap cut
            cut = chunk.rfind(b"\n") + 1
            self._buf += chunk[cut:]
            return chunk[:cut]
        start = len(self._buf)
        self._buf += chunk
        buf = self._buf
        out = []
        nl = buf.find(b"\n", start)  # the pending line had no newline before ``start``
        while nl > self._limit or (nl < 0 and len(buf) > self._limit):
            cut = utf8_cut(buf, self._piece)
            out.append(bytes(buf[:cut]) + LINE_SPLIT_MARKER + b"\n")
            del buf[:cut]
            nl = nl - cut if nl >= 0 else -1
        cut = buf.rfind(b"\n") + 1
        if cut:
            out.append(bytes(buf[:cut]))
            del buf[:cut]
        return b"".join(out)

    def rest(self) -> bytes:
        """What is left (a last line without ``\\n``), emptying the buffer."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


def split_text(text: str) -> List[str]:
    """Lines of ``text`` split at ``\\n`` only (not at ``\\r`` or other separators)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


class LogLines:
    """An iterator of log lines; ``blocks()`` gives the rest as large pieces of lines."""

    def __init__(self, chunks: Chunks, regex: Optional[str] = None) -> None:
        self._chunks = chunks
        self._pattern = re.compile(regex) if regex else None
        self._lines: List[str] = []
        self._pos = 0

    def _filter(self, lines: List[str]) -> List[str]:
        pattern = self._pattern
        return [ln for ln in lines if pattern.search(ln)] if pattern else lines

    def __iter__(self) -> LogLines:
        return self

    def __next__(self) -> str:
        while self._pos >= len(self._lines):
            self._lines = self._filter(split_text(next(self._chunks).decode(errors="replace")))
            self._pos = 0
        self._pos += 1
        return self._lines[self._pos - 1]

    def blocks(self) -> Iterator[str]:
        """The remaining lines, many at a time (joined; whole lines only)."""
        if self._pos < len(self._lines):
            rest = "".join(self._lines[self._pos :])
            self._lines, self._pos = [], 0
            yield rest
        for chunk in self._chunks:
            text = chunk.decode(errors="replace")
            if self._pattern:
                text = "".join(self._filter(split_text(text)))
            if text:
                yield text

    def close(self) -> None:
        self._chunks.close()


def _open(path: str) -> BinaryIO:
    """A log for reading; a symlink planted at its name is not followed (ELOOP)."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


def read_chunks(path: str) -> Chunks:
    """Whole lines of the file as it is now, a chunk at a time."""
    try:
        f = _open(path)
    except FileNotFoundError:
        return
    lines = LineBuffer()
    with f:
        yield from _drain(f, lines)
    if rest := lines.rest():
        yield rest


def follow_chunks(path: str, finished: Callable[[], bool]) -> Chunks:
    """Whole lines of the file as they are written, until ``finished()`` and all is read."""
    while not os.path.exists(path):
        if finished():
            yield from read_chunks(path)  # created between the check and ``finished``
            return
        time.sleep(POLL_SECONDS * 2)
    lines = LineBuffer()
    pause = FIRST_POLL_SECONDS
    with _open(path) as f:
        while True:
            if (yield from _drain(f, lines)):
                pause = FIRST_POLL_SECONDS
            elif finished():
                yield from _drain(f, lines)  # written between the last read and the end
                break
            else:
                time.sleep(pause)
                pause = min(pause * 2, POLL_SECONDS)
    if rest := lines.rest():
        yield rest


def _drain(f: BinaryIO, lines: LineBuffer) -> Generator[bytes, None, bool]:
    """The whole lines of what ``f`` holds now; whether there was anything to read."""
    read = False
    while chunk := f.read(READ_SIZE):
        read = True
        if out := lines.feed(chunk):
            yield out
    return read
