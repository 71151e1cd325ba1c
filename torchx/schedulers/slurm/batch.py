"""The ``sbatch`` request of the ``slurm`` scheduler: one het group per replica, one script.

Everything a user supplies (entrypoint, args, env values, log names) reaches the batch script
or an env file shell-quoted; the only expansion left to the shell is ``${app_id}``, which
becomes ``"$SLURM_JOB_ID"``. Env names must be identifiers and ``#SBATCH`` values single
plain tokens, so nothing a user writes can become shell code on a node.

A replica's env never rides on a command line (``/proc/*/cmdline`` is world-readable): it
is written to its own env file (0600, in the job's directory), which the replica's ``srun``
component sources before it ``exec``s the command, so each het group keeps its own env and
argv names only the file. The dry run shows the env files with secrets masked.
"""

from __future__ import annotations

import os
import re
import shlex
import string
import sys
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, TypedDict

from torchx.runtime.watchdog import STALLED_EXIT, wrap
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER, InvalidAppError
from torchx.schedulers.ids import random_id
from torchx.specs import NONE, Role, macros
from torchx.specs.secrets import Masker, mask_env

RANK0_ENV = "TORCHX_RANK0_HOST"

# cfg keys passed once, on the sbatch command line (they describe the whole job)
SBATCH_JOB_OPTIONS = {"comment", "mail-user", "mail-type"}
# cfg keys repeated on every het group's ``#SBATCH`` line (each group is scheduled on its own);
# a bool key (``exclusive``) becomes a bare flag when true
SBATCH_GROUP_OPTIONS = {"partition", "time", "constraint", "account", "qos", "exclusive"}

# The job comment is ``[comment] [OWNER_MARK<owner>] [TOKEN_MARK<token>]``; the owner is
# percent-encoded to one word without ``|`` (``squeue -O``/``sacct -P``'s separator).
TOKEN_MARK = "torchx-token="
OWNER_MARK = "torchx-owner="
# rank 0's progress reports (``report_progress``), beside the job's logs in its directory
PROGRESS_FILE = "slurm-{job_id}.progress.json"
# slurmctld refuses a longer comment ("Pathname of a file, directory or other parameter too
# long"; measured on 22.05)
COMMENT_MAX = 1024
_OWNER_SAFE = "".join(c for c in string.printable if not c.isspace() and c not in "%|")
# what each replica's srun component runs: ``sh -c LOAD_ENV <env file> <command...>`` sources
# the replica's env file, then becomes the command (argv holds the file's path, no value)
LOAD_ENV = '. "$0" && exec "$@"'
# a private file of the request: created, never replaced or followed through a symlink
_NEW_PRIVATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# Using the functional TypedDict form for the hyphenated keys, as upstream does
SlurmOpts = TypedDict(
    "SlurmOpts",
    {
        "partition": Optional[str],
        "time": Optional[str],
        "comment": Optional[str],
        "constraint": Optional[str],
        "mail-user": Optional[str],
        "mail-type": Optional[str],
        "job_dir": Optional[str],
        "account": Optional[str],
        "qos": Optional[str],
        "exclusive": Optional[bool],
    },
    total=False,
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_VALUE = re.compile(r"[^\s'\"\\]+")


def quote(arg: str) -> str:
    """Shell-quote one token for the batch script; ``${app_id}`` becomes ``"$SLURM_JOB_ID"``."""
    return '"$SLURM_JOB_ID"'.join(
        shlex.quote(part) if part else "" for part in arg.split(macros.app_id)
    ) or shlex.quote(arg)


def check_env_name(name: str, role: str) -> None:
    """Env names are written into ``env NAME=value``: anything but an identifier is refused."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise InvalidAppError(
            f"env var name {name!r} of role {role!r} is not allowed: use letters, digits and"
            " '_', not starting with a digit"
        )


def write_new_private(path: str, text: str) -> None:
    """Create ``path`` (0600) holding ``text``; an existing file or symlink there is refused
    (``O_EXCL|O_NOFOLLOW``), so nobody can pre-plant what the job reads. Any byte of a
    value is kept (``surrogateescape``: what ``os.environ`` holds for non-UTF-8 bytes)."""
    fd = os.open(path, _NEW_PRIVATE, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))


def sbatch_value(key: str, value: Any) -> str:
    """A ``#SBATCH`` line is parsed by sbatch, not a shell: allow one plain token only."""
    text = str(value)
    if not _SBATCH_VALUE.fullmatch(text):
        raise InvalidAppError(
            f"slurm option {key}={text!r} is not allowed: give one token without spaces,"
            " quotes or '\\'"
        )
    return text


def with_token(
    comment: Optional[str], token: Optional[str], owner: Optional[str] = None
) -> Optional[str]:
    """The job comment: the user's, the owner, then the token (last, where ``token_of`` looks)."""
    words = [comment] if comment else []
    if owner:
        words.append(OWNER_MARK + urllib.parse.quote(owner, safe=_OWNER_SAFE))
    if token:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", token):
            raise InvalidAppError(f"idempotency token {token!r} must be a plain word")
        words.append(TOKEN_MARK + token)
    text = " ".join(words)
    if len(text) > COMMENT_MAX:
        raise InvalidAppError(
            f"the slurm job comment would be {len(text)} characters (Slurm takes at most"
            f" {COMMENT_MAX}): shorten -cfg comment or the job's owner"
        )
    return text or None


def token_of(comment: str) -> Optional[str]:
    """The idempotency token in a job comment written by ``with_token`` (None if it has none)."""
    found = re.search(rf"(?:^|\s){re.escape(TOKEN_MARK)}(\S+)\s*$", comment or "")
    return found.group(1) if found else None


def comment_metadata(text: str) -> Dict[str, str]:
    """``{IDEMPOTENCY_TOKEN, OWNER}`` from a job comment written by ``with_token`` (or a line
    holding one): the last of each mark, since ours follow the user's comment."""
    found: Dict[str, str] = {}
    for key, mark in ((IDEMPOTENCY_TOKEN, TOKEN_MARK), (OWNER, OWNER_MARK)):
        if values := re.findall(rf"(?:^|\s){re.escape(mark)}(\S+)", text or ""):
            found[key] = urllib.parse.unquote(values[-1]) if key == OWNER else values[-1]
    return found


def _opts(opts: Mapping[str, Optional[str]]) -> List[str]:
    return [f"--{k}={v}" if v is not None else f"--{k}" for k, v in opts.items()]


@dataclass
class SlurmReplicaRequest:
    """One replica: its ``#SBATCH`` group options and its part of the ``srun`` line."""

    name: str
    entrypoint: str
    args: List[str]
    srun_opts: Dict[str, str]
    sbatch_opts: Dict[str, Optional[str]]
    env: Dict[str, str]

    @classmethod
    def from_role(
        cls,
        name: str,
        role: Role,
        cfg: Mapping[str, Any],
        nomem: bool = False,
        stall_timeout: Optional[float] = None,
        job_dir: str = "",
    ) -> SlurmReplicaRequest:
        """The request for replica ``name`` of ``role`` (macros already applied); ``nomem``
        leaves out ``--mem`` (partitions that declare no memory). The watchdog (with
        ``stall_timeout``) judges the gang: every replica's logs in ``job_dir`` count."""
        for key in role.env:
            check_env_name(key, role.name)
        sbatch: Dict[str, Optional[str]] = {"requeue": None}
        for key in sorted(SBATCH_GROUP_OPTIONS):
            value = cfg.get(key)
            if isinstance(value, bool):
                if value:
                    sbatch[key] = None
            elif value not in (None, ""):
                sbatch[key] = sbatch_value(key, value)
        sbatch["ntasks-per-node"] = "1"
        res = role.resource
        if res is not NONE and res != NONE:
            if res.cpu > 0:
                sbatch["cpus-per-task"] = str(res.cpu)
            if res.memMB > 0 and not nomem:
                sbatch["mem"] = str(res.memMB)
            if res.gpu > 0:
                sbatch["gpus-per-task"] = str(res.gpu)
        elastic = bool(role.min_replicas and role.min_replicas < role.num_replicas)
        srun = {  # in the job's directory (the job may run elsewhere: its working dir)
            "output": os.path.join(job_dir, f"slurm-{macros.app_id}-{name}.out"),
            "error": os.path.join(job_dir, f"slurm-{macros.app_id}-{name}.err"),
            # a failed replica ends the job, unless the role is elastic (the rest carry on)
            "kill-on-bad-exit": "0" if elastic else "1",
        }
        # the watchdog runs on the job's Python (first on PATH), which has torchx
        peers = os.path.join(job_dir, f"slurm-{macros.app_id}-*")
        cmd = wrap([role.entrypoint, *role.args], stall_timeout, "--peers", peers)
        return cls(name, cmd[0], cmd[1:], srun, sbatch, dict(role.env))

    def materialize(self, env_file: Optional[str] = None) -> Tuple[List[str], List[str]]:
        """``(sbatch args, srun group)``: the group's ``#SBATCH`` options and its shell-quoted
        ``srun`` tokens, which load the env from ``env_file`` (written from ``env_text``;
        default ``<name>.env`` in the job's working directory)."""
        sbatch = [f"--job-name={self.name}", *_opts(self.sbatch_opts)]
        srun = [quote(o) for o in _opts(self.srun_opts)]
        load = ["sh", "-c", quote(LOAD_ENV), shlex.quote(env_file or f"{self.name}.env")]
        return sbatch, [*srun, *load, quote(self.entrypoint), *map(quote, self.args)]

    def env_text(self, masked: bool = False) -> str:
        """The env file: one ``export NAME=<shell-quoted value>`` line per variable (any
        value, newlines included, is one shell word); ``masked``: secrets as ``***``, for
        the dry run."""
        env = mask_env(self.env) if masked else self.env
        lines = []
        for key, value in env.items():
            check_env_name(key, self.name)
            if "\0" in value:
                raise InvalidAppError(f"env var {key} of role {self.name!r} holds a NUL byte")
            lines.append(f"export {key}={quote(value)}\n")
        return "".join(lines)


@dataclass
class SlurmBatchRequest:
    """The whole job: the sbatch command and the script it submits."""

    cmd: List[str]
    replicas: Dict[str, SlurmReplicaRequest]
    job_dir: Optional[str] = None
    max_retries: int = 0
    app: Dict[str, Any] = field(default_factory=dict)
    bin_dir: str = field(default_factory=lambda: os.path.dirname(sys.executable))
    # names this submission's files in the job's directory (several may share one job_dir)
    submission: str = field(default_factory=random_id)

    def path(self, suffix: str) -> str:
        """``torchx-<submission><suffix>`` in the job's directory."""
        return os.path.join(self.job_dir or "", f"torchx-{self.submission}{suffix}")

    def env_file(self, replica: str) -> str:
        return self.path(f"-{replica}.env")

    @property
    def script_file(self) -> str:
        return self.path(".sh")

    def write(self) -> str:
        """Write the env files and the batch script (each new, 0600) into the job's
        directory, which is created (0700) if missing; returns the script's path."""
        os.makedirs(self.job_dir or ".", mode=0o700, exist_ok=True)
        for replica in self.replicas.values():
            write_new_private(self.env_file(replica.name), replica.env_text())
        write_new_private(self.script_file, self.materialize())
        return self.script_file

    def materialize(self) -> str:
        """The batch script: het groups, then one ``srun`` over all of them."""
        groups = list(self.replicas.values())
        headers, sruns = [], []
        for i, replica in enumerate(groups):
            sbatch, srun = replica.materialize(self.env_file(replica.name))
            headers.append("#SBATCH " + " ".join(sbatch))
            het = [f"--het-group={i}"] if len(groups) > 1 else []
            sruns.append(" ".join([*het, *srun]))
        header = "\n#SBATCH hetjob\n".join(headers)
        srun_line = " :\\\n    ".join(sruns)
        bin_dir = shlex.quote(self.bin_dir)
        return f"""#!/bin/bash
{header}

# generated by torchx
set -eo pipefail
export PYTHONUNBUFFERED=1 SLURM_UNBUFFEREDIO=1 TORCHX_MAX_RETRIES={int(self.max_retries)}
# the submitting interpreter's environment first, as if it were activated (shared filesystems)
[ -d {bin_dir} ] && export PATH={bin_dir}:$PATH
# the rank-0 host for rendezvous: the address of het group 0's node (node names may not resolve)
first_node=$(scontrol show hostnames \
"${{SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}}" | head -n 1)
export {RANK0_ENV}=$(scontrol show node "$first_node" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
export {RANK0_ENV}=${{{RANK0_ENV}:-$first_node}}
set +e
srun {srun_line}
rc=$?
# a stall (the watchdog's exit) is never retried
if [ $rc -ne 0 ] && [ $rc -ne {STALLED_EXIT} ] \\
    && [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$TORCHX_MAX_RETRIES" ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
exit $rc
"""

    def __repr__(self) -> str:
        """The dry run: the command, the script and each env file, secrets masked."""
        masker = Masker()
        parts = [f"# {shlex.join(self.cmd)} {shlex.quote(self.script_file)}", self.materialize()]
        for replica in self.replicas.values():
            masker.add_env(replica.env)
            parts.append(f"# {self.env_file(replica.name)}\n{replica.env_text(masked=True)}")
        return masker.mask("\n".join(parts))
