"""The engine under the command line: parse and resolve a run's config, run it (train,
validate, a population), save its config, resume it.

Floors: ``lmc/cli`` (argv -> the engine or the studies) on top of ``lmc/studies`` on top of
this; nothing here imports either. :func:`main` runs ``lmc fit|validate|test|predict``;
``LMCCLI``, ``build_cli`` and ``cli_kwargs`` (:mod:`lmc.engine.app`), ``resolve_config``
(:mod:`lmc.engine.parse`) are importable from ``lmc.engine`` and load Lightning on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "main": "lmc.engine.app",
    "LMCCLI": "lmc.engine.app",
    "build_cli": "lmc.engine.app",
    "cli_kwargs": "lmc.engine.app",
    "moved_keys_error": "lmc.engine.moved",
    "resolve_config": "lmc.engine.parse",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'lmc.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
