"""Name -> function registries (the pattern of timm's and torchgeo's model registries).

A registry maps a name that configs and study files use to a pure function with one documented
signature. Adding a method is one new function plus ``@REGISTRY.register("name")``; tasks list
``REGISTRY.names()`` in their errors and help.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind (e.g. ``matcher``), looked up by name.

    Args:
        kind: what the entries are, used in messages (``"matcher"``, ``"merge method"``).
        signature: the documented signature every entry follows, shown in errors.
    """

    def __init__(self, kind: str, signature: str = "") -> None:
        self.kind, self.signature = kind, signature
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering a function under ``name`` (a name is registered once)."""

        def add(fn: F) -> F:
            if name in self._entries and self._entries[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return add

    def get(self, name: str) -> F:
        """The function registered as ``name``.

        Raises:
            ValueError: an unknown name; the message lists the registered names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def check(self, name: str, field: str) -> str:
        """``name`` if registered, else a ``ValueError`` naming the config ``field``."""
        if name not in self._entries:
            raise ValueError(
                f"{field}: unknown {self.kind} {name!r}; choose one of {', '.join(self.names())}"
            )
        return name

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


def declared(fn: Callable[..., Any], **offered: Any) -> dict[str, Any]:
    """The ``offered`` keywords that ``fn`` declares (all of them when it takes ``**kwargs``):
    a registry's caller offers every setting, each entry names only those it uses."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return offered
    return {k: v for k, v in offered.items() if k in params}
