"""A run's resolved configuration without running it: the arguments of ``lmc <command> ...``
parsed by the CLI's own parser (nothing seeded, instantiated or run), as a plain dict. The
studies check every planned job this way before any runs."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import yaml


class ConfigError(ValueError):
    """Arguments that do not parse; the message is the parser's."""


def _parse_only_cli() -> type:
    from lmc.engine.app import LMCCLI

    class ParseOnlyCLI(LMCCLI):
        """Parse and check the arguments, then stop: no seed, no classes, no run."""

        def parse_checkpoint_path(self) -> None:
            pass

        def set_seed(self) -> None:
            pass

        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

        def after_instantiate_classes(self) -> None:
            pass

        def run_subcommand(self, subcommand: str) -> None:
            pass

    return ParseOnlyCLI


def resolve_config(args: Sequence[str]) -> dict[str, Any]:
    """The resolved config of ``lmc <args>`` (e.g. ``["fit", "-c", base]``) as a plain dict.

    Raises:
        ConfigError: the arguments do not parse; the message is the parser's.
    """
    return _resolve(tuple(args))


_PARSER: list[Any] = []  # the parse-only CLI, built once: a parse is then ~3x cheaper


@lru_cache(maxsize=256)
def _resolve(args: tuple[str, ...]) -> dict[str, Any]:
    from lmc.engine.app import cli_kwargs

    err_text = io.StringIO()
    try:
        with contextlib.redirect_stderr(err_text):
            if _PARSER:
                cli = _PARSER[0]
                cli.parse_arguments(cli.parser, list(args))
            else:
                cli = _parse_only_cli()(**cli_kwargs(), args=list(args), run=True)
                _PARSER.append(cli)
    except SystemExit:  # jsonargparse exits on a parse error, message on stderr
        lines = [ln for ln in err_text.getvalue().splitlines() if ln.startswith("lmc: error:")]
        detail = lines[0][len("lmc: error:") :].strip() if lines else err_text.getvalue().strip()
        raise ConfigError(f"`lmc {' '.join(args)}` does not parse: {detail}") from None
    except Exception as err:
        raise ConfigError(f"`lmc {' '.join(args)}` does not parse: {err}") from err
    sub = args[0]
    return yaml.safe_load(cli.subcommand_parser(sub).dump(cli.config[sub], skip_none=False))
