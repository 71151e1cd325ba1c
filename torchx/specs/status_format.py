"""How an ``AppStatus`` reads: ``format()``, ``repr()`` and a one-line ``error_summary()``.

``format()`` and ``repr()`` print what upstream prints, so scripts that parse them keep
working; where upstream raised on a status it could not format, these print what they have,
and a cancelled replica reads ``CANCELLED``, not upstream's ``CANCELLED (no reply file)``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from datetime import datetime
from string import Template
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torchx.specs.states import NONE, AppState

if TYPE_CHECKING:
    from torchx.specs.api import AppStatus, ReplicaStatus

_TEMPLATE = """AppStatus:
    State: ${state}
    Num Restarts: ${num_restarts}
    Roles: ${roles}
    Msg: ${msg}
    Structured Error Msg: ${structured_error_msg}
    UI URL: ${url}
    """

# an RPC error: RuntimeError('On WorkerInfo(id=1, name=trainer:0:0):\n<traceback>\n')
_RPC_ERROR = re.compile(r"(?P<exception_type>\w*)\('On WorkerInfo\(.+\):\n(.*\n)*'\)")
# an exception nested in another's message: "c10::Error: ...\nException raised from ..."
_EMBEDDED_ERROR = re.compile(r"(?P<msg>.+)\nException.*")


def wrap_error_message(msg: str, header: str, width: int = 80) -> str:
    """Break ``msg`` at the first space after ``width`` chars; later lines indent under header."""
    rpc = _RPC_ERROR.search(msg)
    if rpc:
        msg = msg[rpc.start() : rpc.end()]
    embedded = _EMBEDDED_ERROR.search(msg)
    if embedded:
        msg = embedded.group("msg")
    lines = []
    start = 0
    for i, ch in enumerate(msg):
        if ch == " " and i - start >= width:
            lines.append(header + msg[start:i])
            header = " " * len(header)
            start = i
    lines.append(header + msg[start:])
    return "\n".join(lines)


def _parse_json(structured: str) -> Optional[Dict[str, Any]]:
    if not structured or structured == NONE:
        return None
    try:
        data = json.loads(structured)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _replica(replica: ReplicaStatus) -> str:
    state = str(replica.state)
    err = replica.structured_error_msg
    data = _parse_json(err)
    message = data.get("message") if data else None
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        ts = extra.get("timestamp") if isinstance(extra, dict) else None
        try:
            when = str(datetime.fromtimestamp(int(ts))) if ts is not None else "<N/A>"
        except (TypeError, ValueError, OverflowError, OSError):
            when = str(ts)
        body = (
            f"{state} (exitcode: {message.get('errorCode') or '<N/A>'})\n"
            f"        timestamp: {when}\n"
            f"        hostname: {replica.hostname}\n"
            f"    {wrap_error_message(str(message.get('message', '')), '    error_msg: ')}"
        )
    elif err and err != NONE:
        body = f"{state}\n    {wrap_error_message(err.strip(), '    error_msg: ')}"
    else:
        body = state
        if replica.state == AppState.FAILED:  # a cancelled replica is not missing one
            body += " (no reply file)"
    marker = "*" if replica.id == 0 else " "  # marks where each role's replicas start
    return f"\n {marker}{replica.role}[{replica.id}]:{body}"


def format_status(status: AppStatus, filter_roles: Optional[List[str]] = None) -> str:
    """The multi-line text ``torchx status`` prints (upstream's layout)."""
    roles = "".join(
        _replica(replica)
        for role in status.roles
        if not filter_roles or role.role in filter_roles
        for replica in sorted(role.replicas, key=lambda r: r.id)
    )
    return Template(_TEMPLATE).substitute(
        state=status.state,
        num_restarts=status.num_restarts,
        roles=roles,
        msg=status.msg,
        structured_error_msg=status.structured_error_msg,
        url=status.ui_url,
    )


def status_yaml(status: AppStatus) -> str:
    """``{"AppStatus": ...}`` as YAML, the reply-file JSON expanded (upstream's ``repr``)."""
    import yaml

    d = asdict(status)
    err = d.pop("structured_error_msg")
    parsed = _parse_json(err) if err != NONE else None
    d["structured_error_msg"] = parsed if parsed is not None else err
    d["state"] = repr(d["state"])
    return yaml.dump({"AppStatus": d})


def error_message(structured: str) -> str:
    """The last line of a torchelastic reply file's message (usually ``ExcType: text``)."""
    if not structured or structured == NONE:
        return ""
    data = _parse_json(structured)
    if data is None:
        return structured.strip().splitlines()[-1] if structured.strip() else ""
    message = data.get("message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = [ln for ln in str(message).strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln.strip()):
            return ln.strip()
    return lines[-1].strip() if lines else ""


def error_summary(status: AppStatus) -> str:
    """One line: the state plus the most useful error (the worker's exception if known)."""
    detail = status.msg if status.msg and status.msg != NONE else ""
    replica_errors = (
        error_message(r.structured_error_msg) for role in status.roles for r in role.replicas
    )
    err = error_message(status.structured_error_msg) or next(filter(None, replica_errors), "")
    if err and err in detail:  # the message names the exception already (and its rank)
        err = ""
    parts = [str(status.state)] + [p for p in (err, detail) if p]
    return ": ".join(parts[:2]) + (f" ({parts[2]})" if len(parts) > 2 else "")
