"""Free rendezvous ports for schedulers whose replicas run on this host (local_cwd,
local_docker on the host network).

A role that leaves its rendezvous port to the scheduler (``dist.ddp`` without
``--rdzv_port`` puts ``${rdzv_port}`` in its args) gets a port the kernel has free now, so
two multi-node jobs on one host, or a job next to someone's torchrun on 29500, do not collide.
A port is picked by binding port 0 and releasing it: another process may take it before the
job binds it, which is rare (the kernel hands out ephemeral ports at random) and fails the
rendezvous the same way a fixed port taken by someone else does.
"""

from __future__ import annotations

import collections
import socket
import threading
from typing import Deque

from torchx.specs.api import DEFAULT_RDZV_PORT, Role, macros

# ports handed out lately by this process: a job submitted right after another (a pipeline
# fanning out) gets another port, even before the first job has bound its own
_RECENT: Deque[int] = collections.deque(maxlen=256)
_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port no socket of this host holds now, and not one this process handed out lately."""
    with _LOCK:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                # all addresses: the rendezvous store listens on every interface
                s.bind(("", 0))
                port = int(s.getsockname()[1])
            if port not in _RECENT:
                _RECENT.append(port)
                return port
        _RECENT.append(port)
        return port


def uses_rdzv_port(role: Role) -> bool:
    """Whether ``role`` leaves its rendezvous port to the scheduler (``${rdzv_port}``)."""
    return any(macros.rdzv_port in a for a in role.args) or any(
        macros.rdzv_port in v for v in role.env.values()
    )


def rdzv_port_for(role: Role) -> str:
    """The value of ``${rdzv_port}`` for a role that runs on this host: a free port if the
    role asks for one, torchrun's default otherwise (the value is then unused)."""
    return str(free_port()) if uses_rdzv_port(role) else str(DEFAULT_RDZV_PORT)
