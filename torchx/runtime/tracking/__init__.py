"""Simple results an app hands to whoever launched it (upstream's ``torchx.runtime.tracking``).

An app writes ``tracker[key] = {"name": number_or_short_str}`` under a base URL (any fsspec
URL); a driver (an HPO loop, a pipeline) reads ``tracker[key]`` with the same base. Each key
is one JSON file ``<base>/<key>``, as upstream, so results written by either implementation
read back in the other. For run metadata and lineage use ``torchx.tracker`` instead.
"""

from torchx.runtime.tracking.api import FsspecResultTracker, KeyType, ResultTracker, ResultType

__all__ = ["FsspecResultTracker", "KeyType", "ResultTracker", "ResultType"]
