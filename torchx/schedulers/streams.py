"""``Tee``: copy what is written to some files into one writer (upstream's
``torchx.schedulers.streams``; ``local_cwd`` itself merges replica output in its
supervisor and does not use it)."""

from __future__ import annotations

import io
import os
import threading
import time
from typing import BinaryIO, List

_BUFSIZE = 64000
_IDLE_SECONDS = 0.1


class Tee:
    """Appends what appears in each of ``sources`` (file paths, e.g. FIFOs or files a
    process writes) to ``out``, from a background thread, until ``close()`` (which copies
    what is left, then closes everything). ``write`` adds bytes directly."""

    def __init__(self, out: BinaryIO, *sources: str) -> None:
        if not sources:
            raise ValueError("Tee needs at least one source")
        self._lock = threading.Lock()
        self.out = out
        self.streams: List[io.FileIO] = []
        for source in sources:
            r = io.FileIO(source, "rb")
            os.set_blocking(r.fileno(), False)
            self.streams.append(r)
        self._closed = False
        self.thread = threading.Thread(target=self._copy, name="torchx-tee", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        while True:
            got = False
            for r in self.streams:
                data = r.read(_BUFSIZE)
                if data:
                    got = True
                    self.write(data)
            if not got:
                if self._closed:
                    return
                time.sleep(_IDLE_SECONDS)

    def write(self, s: bytes) -> int:
        with self._lock:
            return self.out.write(s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.thread.join()
        with self._lock:
            for s in self.streams:
                s.close()
            self.out.close()
