"""The ``lmc`` command line: argv to the engine or the studies.

``lmc fit|validate|test|predict`` runs :func:`lmc.engine.main` (LightningCLI); ``lmc study``
plans and runs studies (:mod:`lmc.cli.study`) and starts its workers before Lightning is
imported here. ``LMCCLI``, ``cli_kwargs``, ``build_cli`` and ``moved_keys_error``, which live in
:mod:`lmc.engine`, stay importable from ``lmc.cli``; they are loaded on first use.
"""

from __future__ import annotations

import sys
from typing import Any


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lmc`` console script; ``args`` lets tests call it in-process."""
    from lmc.registry import load_plugins

    argv = sys.argv[1:] if args is None else list(args)
    try:
        load_plugins()  # the user's registered matchers and merge methods ($LMC_PLUGINS)
    except ImportError as err:
        if args is not None:
            raise
        sys.stderr.write(f"lmc: error: {err}\n")
        raise SystemExit(1) from None
    if argv[:1] == ["study"]:  # lmc study plan|run|status|report|claims
        from lmc.cli.study import study_main

        return study_main(argv[1:], raise_errors=args is not None)
    from lmc.engine.app import main as run

    run(args)


def __getattr__(name: str) -> Any:
    import lmc.engine

    try:
        return getattr(lmc.engine, name)
    except AttributeError:
        raise AttributeError(f"module 'lmc.cli' has no attribute {name!r}") from None
