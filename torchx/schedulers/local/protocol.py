"""The on-disk record of a ``local_cwd`` app, shared by the scheduler and its supervisor.

Stdlib only: the supervisor runs this as a plain sibling module (no ``torchx`` import) so
it starts fast.

An app directory holds ``request.json`` (what to run, written once by the launcher),
``state.json`` (the app's state, replaced atomically on every change), ``supervisor.pid``
(``PID STAMP``, written by the supervisor once its signal handlers are installed),
``cancel`` (created by ``cancel``), ``state.lock`` and ``progress.json`` (rank 0's last
progress report, written by the job). Every directory is created 0700 and
every file 0600: the request holds the replicas' environment, which may hold secrets.

A state that is terminal never changes again: every writer goes through ``transition``,
which holds ``state.lock`` and refuses to replace a terminal state.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any, Dict, Iterator, Optional

REQUEST = "request.json"
STATE = "state.json"
PID = "supervisor.pid"
CANCEL = "cancel"
LOCK = "state.lock"
SUPERVISOR_LOG = "supervisor.log"
PROGRESS = "progress.json"  # rank 0's last ``report_progress`` (torchx.runtime.progress)

# cancel: SIGTERM to every process of the app, SIGKILL to what still runs this much later
GRACE_SECONDS = 5.0

DIR_MODE = 0o700
FILE_MODE = 0o600

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# every AppState name a state file may hold
STATES = frozenset({"UNSUBMITTED", "SUBMITTED", "PENDING", "RUNNING", "UNKNOWN"}) | TERMINAL

# A log line longer than LINE_LIMIT bytes is cut into pieces of at most LINE_LIMIT bytes,
# each ending with LINE_SPLIT_MARKER, so no reader ever buffers more than that per line.
LINE_LIMIT = 1 << 20
LINE_SPLIT_MARKER = b" [torchx: line longer than 1 MiB, continued on the next line]"


def makedirs_private(path: str) -> None:
    """``mkdir -p`` creating each missing directory 0700 (existing ones are left alone)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    makedirs_private(os.path.dirname(path))
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def open_private(path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor of ``path``, created 0600."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data))


def read_json(path: str) -> Optional[Any]:
    """The parsed file; None if it does not exist. Raises ValueError for other bad content."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"cannot read it ({e.strerror})") from None
    try:
        return json.loads(data)
    except ValueError:
        raise ValueError("it is not valid JSON") from None


def state_name(doc: Any) -> Optional[str]:
    """The ``state`` of a state document, if it is a known one."""
    if isinstance(doc, dict) and doc.get("state") in STATES:
        return doc["state"]
    return None


@contextlib.contextmanager
def locked(app_dir: str) -> Iterator[None]:
    """Hold the app's state lock (across processes)."""
    import fcntl

    fd = open_private(os.path.join(app_dir, LOCK), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def current_state(app_dir: str) -> Optional[Dict[str, Any]]:
    """The state document if it is readable, else None."""
    try:
        doc = read_json(os.path.join(app_dir, STATE))
    except ValueError:
        return None
    return doc if state_name(doc) else None


def transition(app_dir: str, doc: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``doc`` as the app's state unless the state on disk is already terminal.

    Returns the state on disk afterwards (``doc``, or the terminal state that won).
    """
    with locked(app_dir):
        return transition_locked(app_dir, doc)


def transition_locked(app_dir: str, doc: Dict[str, Any]) -> Dict[str, Any]:
    """``transition`` for a caller that already holds ``locked(app_dir)``."""
    cur = current_state(app_dir)
    if cur is not None and cur["state"] in TERMINAL:
        return cur
    write_json_atomic(os.path.join(app_dir, STATE), doc)
    return doc


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
