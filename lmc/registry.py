"""Name -> function registries (the pattern of timm's and torchgeo's model registries).

A registry maps a name that configs and study files use to a pure function with one documented
signature. Adding a method is one new function plus ``@REGISTRY.register("name")``; tasks list
``REGISTRY.names()`` in their errors and help.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)

#: modules the ``lmc`` command imports first, comma-separated: your registrations
PLUGINS_ENV = "LMC_PLUGINS"
#: the entry-point group of installed packages' registrations
PLUGINS_GROUP = "lmc.plugins"
_HOW = (
    f"register your own in a module named in ${PLUGINS_ENV} (or a package's {PLUGINS_GROUP!r} "
    "entry point), which the lmc command imports first"
)
_loaded: set[str] = set()


def load_plugins() -> list[str]:
    """Import the modules that register user code (matchers, merge methods): those named in
    ``$LMC_PLUGINS`` (comma-separated, e.g. ``LMC_PLUGINS=mylab.merges``) and the
    ``lmc.plugins`` entry points of installed packages. The ``lmc`` command (and every study
    job, in-process, in a worker or on a cluster) calls it before reading a config, so a name
    registered there is accepted everywhere a built-in one is. Each module is imported once.

    Returns:
        The modules imported by this call.

    Raises:
        ImportError: a module that does not import, naming where it was listed.
    """
    from importlib.metadata import entry_points

    named = [(m.strip(), f"${PLUGINS_ENV}") for m in os.environ.get(PLUGINS_ENV, "").split(",")]
    named += [(ep.value, f"entry point {ep.name!r}") for ep in entry_points(group=PLUGINS_GROUP)]
    done = []
    for module, where in named:
        if not module or module in _loaded:
            continue
        try:
            importlib.import_module(module.split(":")[0])
        except ImportError as err:
            raise ImportError(f"{where}: cannot import {module!r}: {err}") from err
        _loaded.add(module)
        done.append(module)
    return done


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
                f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())} ({_HOW})"
            ) from None

    def check(self, name: str, field: str) -> str:
        """``name`` if registered, else a ``ValueError`` naming the config ``field``."""
        if name not in self._entries:
            raise ValueError(
                f"{field}: unknown {self.kind} {name!r}; choose one of {', '.join(self.names())} "
                f"({_HOW})"
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
