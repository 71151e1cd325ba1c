"""Result trackers: a small map from a key to a dict of numbers or short strings."""

from __future__ import annotations

import abc
import json
from typing import Dict, Union

KeyType = Union[int, str]
ResultType = Union[int, float, str]


class ResultTracker(abc.ABC):
    """A key -> results store; ``tracker[k] = {...}`` is ``put(k, **...)``, ``tracker[k]`` is
    ``get(k)``. Keys are made strings with ``str(key)``; a missing key reads as ``{}``."""

    def __getitem__(self, key: KeyType) -> Dict[str, ResultType]:
        return self.get(key)

    def __setitem__(self, key: KeyType, results: Dict[str, ResultType]) -> None:
        self.put(key, **results)

    @abc.abstractmethod
    def put(self, key: KeyType, **results: ResultType) -> None:
        """Store ``results`` under ``key`` (overwrites; the store decides consistency)."""

    @abc.abstractmethod
    def get(self, key: KeyType) -> Dict[str, ResultType]:
        """The results stored under ``key``, or ``{}`` when there are none (does not wait)."""


class FsspecResultTracker(ResultTracker):
    """Results as pretty-printed JSON files ``<tracker_base>/<key>`` on any fsspec URL."""

    def __init__(self, tracker_base: str) -> None:
        self._tracker_base = tracker_base

    def _path(self, key: KeyType) -> tuple:
        import fsspec  # only when a result is read or written

        fs, base = fsspec.core.url_to_fs(self._tracker_base)
        return fs, f"{base.rstrip('/')}/{key}"

    def put(self, key: KeyType, **results: ResultType) -> None:
        fs, path = self._path(key)
        if parent := path.rsplit("/", 1)[0]:  # the base, or a key's own directory under it
            fs.makedirs(parent, exist_ok=True)
        fs.write_text(path, json.dumps(results, indent=2))

    def get(self, key: KeyType) -> Dict[str, ResultType]:
        fs, path = self._path(key)
        try:
            return json.loads(fs.read_text(path))
        except FileNotFoundError:
            return {}
