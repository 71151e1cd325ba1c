"""What Slurm says about one job, from the cheapest source that still knows it.

1. ``squeue -j ID`` while slurmctld holds the job (pending, running, and ``MinJobAge``
   seconds after it ended); a finished job's per-group exit codes then come from
   ``scontrol -d show job ID``.
2. ``sacct -j ID`` once slurmctld forgot it (clusters with slurmdbd accounting). A het
   group's exit code is the highest of its steps' own: sacct's ``DerivedExitCode`` can be
   written before the last step's (22.05 reported 0 for a group whose step exited 3).
3. The ``jobcomp/filetxt`` log, on clusters without accounting.

Each source yields the job's het groups as dicts ``{name, state, exit_code, offset, node,
restarts, work_dir, comment}`` sorted by offset (squeue's also ``reason``); ``exit_code`` is
None where no step reported one.
``list`` reads cluster-wide ``squeue`` in the same text form (``squeue_groups``): named
columns, not ``--json``, whose shape changed in 24.x.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from torchx.specs import AppState, TorchXError, is_terminal

SLURM_STATES: Mapping[str, AppState] = {
    **dict.fromkeys(
        ["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"],
        AppState.PENDING,
    ),
    **dict.fromkeys(
        ["RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"],
        AppState.RUNNING,
    ),
    "COMPLETED": AppState.SUCCEEDED,
    "CANCELLED": AppState.CANCELLED,
    **dict.fromkeys(
        ["FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"],
        AppState.FAILED,
    ),
    "REVOKED": AppState.FAILED,
}
TERMINAL = {s for s, a in SLURM_STATES.items() if is_terminal(a)}

# squeue -O: "Field:|" is unpadded and ends with "|"; the last field is unbounded. The job
# comment (the owner and idempotency token, ``batch.with_token``) comes last; the parsers
# also read output without it.
SQUEUE_FIELDS = (
    "JobID:|,HetJobID:|,HetJobOffset:|,State:|,RestartCnt:|,NodeList:|,Name:|,WorkDir:|,Comment:"
)
# cluster-wide, for ``list``: without the comments (up to 1 KB a job, unused there)
SQUEUE_LIST_FIELDS = SQUEUE_FIELDS.rsplit(",", 1)[0]
SACCT_FIELDS = "JobID,JobName,State,ExitCode,NodeList,WorkDir,Comment"


class SlurmError(TorchXError):
    """A Slurm command failed (message has its stderr)."""


def run(cmd: List[str], cwd: Optional[str] = None) -> str:
    """``cmd``'s stdout; a missing command or a non-zero exit raises ``SlurmError``."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)
    except FileNotFoundError:
        raise SlurmError(
            f"{cmd[0]} not found: is this a Slurm login node?"
            " (scripts/slurm_cluster.sh starts a local cluster)"
        ) from None
    if out.returncode != 0:
        raise SlurmError(f"{' '.join(cmd[:2])} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def _part(
    name: str,
    state: str,
    exit_code: Optional[int],
    offset: int,
    node: str,
    restarts: int = 0,
    work_dir: str = "",
    comment: str = "",
) -> Dict[str, Any]:
    return {
        "name": name,
        "state": state,
        "exit_code": exit_code,
        "offset": offset,
        "node": "" if node in ("(null)", "None assigned") else node,
        "restarts": restarts,
        "work_dir": work_dir,
        "comment": comment,
    }


def _code(text: str) -> Optional[int]:
    """``rc:signal`` (sacct, scontrol, jobcomp) as one exit code: 128+signal if signalled."""
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not m:
        return None
    rc, sig = int(m.group(1)), int(m.group(2))
    return 128 + sig if sig else rc


def squeue_groups(text: str, fields: str = SQUEUE_FIELDS) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """``(app id, group)`` of each het group in ``squeue -h -O <fields>`` output (the
    columns read by name; a trailing ``Comment`` may be missing); a het job's groups share
    its app id. No exit codes."""
    names = [field.split(":", 1)[0] for field in fields.split(",")]
    # a "Field:|" column ends with "|" (the line then ends with an empty value over);
    # a last field without it is unbounded (a comment may hold "|")
    cuts = len(names) if fields.endswith("|") else len(names) - 1
    optional = int(names[-1] == "Comment")  # output without the comment still reads
    for line in text.splitlines():
        values = line.split("|", cuts)
        if len(values) < len(names) - optional:
            continue
        row = dict(zip(names, values, strict=False))
        jid, het, offset, restarts = (
            row.get(k, "") for k in ("JobID", "HetJobID", "HetJobOffset", "RestartCnt")
        )
        part = _part(
            row.get("Name", ""),
            row.get("State", "").strip(),
            None,
            int(offset) if offset.isdigit() else 0,
            row.get("NodeList", ""),
            int(restarts) if restarts.isdigit() else 0,
            row.get("WorkDir", "").strip(),
            row.get("Comment", ""),
        )
        part["reason"] = row.get("Reason", "").strip()
        yield (het if het.isdigit() else jid), part


def parse_squeue_text(text: str, job_id: str) -> List[Dict[str, Any]]:
    """The groups of ``job_id`` in ``squeue -h -O SQUEUE_FIELDS`` output (no exit codes)."""
    parts = [part for app_id, part in squeue_groups(text) if app_id == job_id]
    return sorted(parts, key=lambda p: p["offset"])


def parse_scontrol(text: str, job_id: str) -> List[Dict[str, Any]]:
    """The groups of ``job_id`` in ``scontrol -d -o show job`` output (one line per group).

    ``Comment=`` comes late and may hold anything: the first ``Key=`` of each kind is the
    real one, and the comment is the rest of the line."""
    parts = []
    for line in text.splitlines():

        def get(key: str, line: str = line) -> str:
            m = re.search(rf"(?:^|\s){key}=(\S*)", line)
            return m.group(1) if m else ""

        het, jid = get("HetJobId"), get("JobId")
        if (het or jid) != job_id or not jid:
            continue
        offset = get("HetJobOffset")
        parts.append(
            _part(
                get("JobName"),
                get("JobState"),
                _code(get("DerivedExitCode")),
                int(offset) if offset.isdigit() else 0,
                get("NodeList"),
                int(get("Restarts") or 0),
                get("WorkDir"),
                line.split(" Comment=", 1)[1] if " Comment=" in line else "",
            )
        )
    return sorted(parts, key=lambda p: p["offset"])


def parse_sacct(text: str, job_id: str) -> List[Dict[str, Any]]:
    """The groups of ``job_id`` in ``sacct -P -n -D -o SACCT_FIELDS -j ID`` output.

    With ``-D`` each run of a requeued job is listed (an ``ID+k`` row, then its steps): the
    last run wins, its exit code the highest of its numbered steps' (not the batch step's)."""
    parts: Dict[int, Dict[str, Any]] = {}
    runs: Dict[int, int] = {}
    for line in text.splitlines():
        fields = line.split("|", 6)
        if len(fields) < 6:
            continue
        jid, name, state, code, node, work_dir = fields[:6]
        m = re.fullmatch(r"(\d+)(?:\+(\d+))?(?:\.(\w+))?", jid)
        if not m or m.group(1) != job_id:
            continue
        offset, step = int(m.group(2) or 0), m.group(3)
        state = state.split()[0] if state.strip() else "UNKNOWN"
        if step is None:
            runs[offset] = runs.get(offset, 0) + 1
            comment = fields[6] if len(fields) > 6 else ""
            parts[offset] = _part(
                name, state, None, offset, node, runs[offset] - 1, work_dir, comment
            )
        elif step.isdigit() and offset in parts:
            rc = _code(code)
            if rc is not None:
                prev = parts[offset]["exit_code"]
                parts[offset]["exit_code"] = rc if prev is None else max(prev, rc)
    return [parts[k] for k in sorted(parts)]


def parse_jobcomp(text: str, job_id: str) -> List[Dict[str, Any]]:
    """Groups of ``job_id`` from a ``jobcomp/filetxt`` log (the latest record of each wins)."""
    parts: Dict[int, Dict[str, Any]] = {}
    for line in text.splitlines():
        kv = dict(re.findall(r"(\w+)=(\S*)", line))
        het, jid = kv.get("HetJobId", ""), kv.get("JobId", "")
        if (het if het and het != "0" else jid) != str(job_id):
            continue
        offset = int(kv.get("HetJobOffset", "0") or 0)
        code = _code(kv.get("DerivedExitCode") or kv.get("ExitCode") or "0:0")
        parts[offset] = _part(
            kv.get("Name", ""),
            kv.get("JobState", "UNKNOWN"),
            code,
            offset,
            kv.get("NodeList", ""),
            0,
            kv.get("WorkDir", ""),
        )
    return [parts[k] for k in sorted(parts)]


def query_job(job_id: str) -> List[Dict[str, Any]]:
    """The groups of one job, from squeue, then sacct, then the jobcomp log ([] if unknown);
    ``SlurmError`` if a source failed and no other knew the job (it may well exist)."""
    failure: Optional[SlurmError] = None
    try:
        out = run(["squeue", "-h", "-t", "all", "-j", job_id, "-O", SQUEUE_FIELDS])
    except SlurmError as e:  # an id slurmctld no longer (or never) knew fails in 22.05
        out = ""
        if "Invalid job id" not in str(e):
            failure = e
    parts = parse_squeue_text(out, job_id)
    if parts and all(p["state"] in TERMINAL for p in parts):
        # squeue has no exit codes: the same in-memory record through scontrol has them
        try:
            detailed = parse_scontrol(run(["scontrol", "-d", "-o", "show", "job", job_id]), job_id)
        except SlurmError:
            detailed = []  # forgotten in between: accounting has it now
        parts = detailed if len(detailed) == len(parts) else []
    if parts:
        return parts
    try:
        found = parse_sacct(
            run(["sacct", "-P", "-n", "-D", "-j", job_id, "-o", SACCT_FIELDS]), job_id
        )
    except SlurmError as e:  # no accounting here (or slurmdbd is down): the jobcomp log
        if "accounting storage is disabled" not in str(e).lower():
            failure = failure or e
        found = jobcomp_parts(job_id) or []
    if not found and failure is not None:
        raise failure
    return found


def jobcomp_parts(job_id: str) -> Optional[List[Dict[str, Any]]]:
    """``job_id``'s groups from the ``JobCompLoc`` file (None: no such log to read)."""
    try:
        loc = re.search(r"JobCompLoc\s*=\s*(\S+)", run(["scontrol", "show", "config"]))
    except SlurmError:
        return None
    if not loc or not os.path.isfile(loc.group(1)):
        return None
    with open(loc.group(1)) as f:
        return parse_jobcomp(f.read(), job_id)
