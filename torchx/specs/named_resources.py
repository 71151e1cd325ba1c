"""The named-resource library behind ``specs.resource(h=...)`` and ``-h`` flags."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Optional

from torchx.specs.api import NULL_RESOURCE, InvalidArgumentError, Resource


class _NamedResourcesLibrary:
    """Generic + AWS sizes plus the ``torchx.named_resources`` entry points (on first use)."""

    def __init__(self) -> None:
        self._factories: Optional[Dict[str, Callable[[], Resource]]] = None

    def _load(self) -> Dict[str, Callable[[], Resource]]:
        if self._factories is None:
            from torchx.specs import named_resources_aws, named_resources_generic
            from torchx.util.entrypoints import load_group

            factories: Dict[str, Callable[[], Resource]] = {}
            factories.update(named_resources_generic.NAMED_RESOURCES)
            factories.update(named_resources_aws.NAMED_RESOURCES)
            for name, loader in load_group("torchx.named_resources").items():
                factories[name] = _deferred(loader)
            factories["NULL"] = lambda: NULL_RESOURCE
            factories["MISSING"] = lambda: NULL_RESOURCE
            self._factories = factories
        return self._factories

    def names(self) -> list[str]:
        return sorted(self._load())

    def __getitem__(self, key: str) -> Resource:
        factories = self._load()
        if key not in factories:
            import difflib

            close = difflib.get_close_matches(key, list(factories), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise NamedResourceNotFound(f"unknown named resource {key!r}{hint}")
        return factories[key]()

    def __contains__(self, key: object) -> bool:
        return key in self._load()

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError("named_resources is not iterable; use named_resources.names()")


class NamedResourceNotFound(InvalidArgumentError, KeyError):
    """``-h`` names a resource that no library or plugin defines."""

    def __str__(self) -> str:
        return str(self.args[0])


def _deferred(loader: Callable[[], Callable[[], Resource]]) -> Callable[[], Resource]:
    return lambda: loader()()


named_resources = _NamedResourcesLibrary()


def get_named_resources(res: str) -> Resource:
    return named_resources[res]


def resource(
    cpu: Optional[int] = None,
    gpu: Optional[int] = None,
    memMB: Optional[int] = None,
    h: Optional[str] = None,
) -> Resource:
    """``named_resources[h]``, else ``Resource(cpu or 2, gpu or 0, memMB or 1024)``."""
    if h:
        return get_named_resources(h)
    return Resource(cpu=cpu or 2, gpu=gpu or 0, memMB=memMB or 1024)
