"""App states and the data model's placeholder strings, apart from ``api`` so that
``status_format`` can use them without an import circle (``api`` re-exports them)."""

from __future__ import annotations

from enum import Enum

ALL = "all"
MISSING = "<MISSING>"
NONE = "<NONE>"


class AppState(int, Enum):
    """Lifecycle of an app (and of each replica: ``ReplicaState``)."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{self.name} ({self.value})"


# its public home is upstream's: pickles and ``repr(AppStatus)``'s YAML name
# torchx.specs.api.AppState
AppState.__module__ = "torchx.specs.api"

ReplicaState = AppState

_TERMINAL_STATES = (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)


def is_terminal(state: AppState) -> bool:
    """True once the app can no longer change state."""
    return state in _TERMINAL_STATES


def is_started(state: AppState) -> bool:
    return is_terminal(state) or state == AppState.RUNNING
