"""The ``lmc`` command line.

``lmc fit|validate|test|predict`` is LightningCLI (:mod:`lmc.cli.app`); ``lmc study`` plans and
runs studies (:mod:`lmc.cli.study`) and starts its workers before Lightning is imported here.
``LMCCLI``, ``cli_kwargs``, ``build_cli`` and the rest of :mod:`lmc.cli.app` are importable from
``lmc.cli`` as before; they are loaded on first use.
"""

from __future__ import annotations

import sys
from typing import Any


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lmc`` console script; ``args`` lets tests call it in-process."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["study"]:  # lmc study plan|run|status
        from lmc.cli.study import study_main

        return study_main(argv[1:], raise_errors=args is not None)
    from lmc.cli.app import main as app_main

    app_main(args)


def __getattr__(name: str) -> Any:
    import importlib

    app = importlib.import_module("lmc.cli.app")
    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module 'lmc.cli' has no attribute {name!r}") from None
