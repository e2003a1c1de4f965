"""Readable failures: the one relevant line of a config or startup error first, third-party tips
and warnings that say nothing to ``lmc`` users silenced."""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "- Expected a <class 'NoneType'>",
    "Expected a <class 'NoneType'>",
)
_BARE_NOT_ACCEPTED = re.compile(r"Option '(\w+)' is not accepted")
_NOT_ACCEPTED = re.compile(
    r"Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted"
)


def _suggestion(class_path: str, option: str) -> str:
    """`` (did you mean 'x'?; accepted: ...)`` for an option the class does not take."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module or "lmc.tasks"), name)
        accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "kwargs")]
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return ""
    close = difflib.get_close_matches(option, accepted, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f" ({hint}accepted: {', '.join(accepted)})"


def condensed_error(err: BaseException | str, model_class: str | None = None) -> str:
    """The relevant lines of an error: jsonargparse's union bookkeeping dropped, an unknown
    option of the model completed with the closest accepted one and the accepted list
    (``model_class``: the model's class path when the message does not name it)."""
    text = str(err)
    match = _NOT_ACCEPTED.search(re.sub(r"\s+", " ", text))
    if match:
        class_path, option = match.groups()
        return f"{class_path}: option '{option}' is not accepted" + _suggestion(class_path, option)
    bare = _BARE_NOT_ACCEPTED.fullmatch(text.strip())
    if bare and model_class:
        option = bare.group(1)
        return f"{model_class}: option '{option}' is not accepted" + _suggestion(
            model_class, option
        )
    kept = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(_NOISE):
            continue
        kept.append(line[2:] if line.startswith("- ") else line)
    return "; ".join(dict.fromkeys(kept)) or text


class LMCArgumentParser(LightningArgumentParser):
    """Prints a parse error as its relevant line and a pointer to ``--help`` instead of the
    whole usage and the union bookkeeping (``LMC_DEBUG=1`` restores the full output)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if os.environ.get("LMC_DEBUG"):
            super().error(message, ex)
        subcommands = [
            t for t in self.prog.split()[1:] if t in ("fit", "validate", "test", "predict")
        ]
        prog = " ".join(["lmc", *subcommands])  # nested parsers may carry another program name
        from lmc.cli.moved import _model_class_path

        detail = condensed_error(message, _model_class_path(sys.argv[1:]))
        sys.stderr.write(
            f"{prog}: error: {detail}\n"
            f"(`{prog} --help` lists the options; LMC_DEBUG=1 shows the full message)\n"
        )
        raise SystemExit(2)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_third_party() -> None:
    """Silence what says nothing to ``lmc`` users: Lightning's product tips, W&B's banner and
    sync hints (``WANDB_SILENT``, unless set), and a known deprecation warning inside
    Lightning. Errors and warnings about the run itself still show."""
    os.environ.setdefault("WANDB_SILENT", "true")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in log.filters):
            log.addFilter(_DropTips())
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated")
    warnings.filterwarnings("ignore", message=r"The anonymous setting has no effect")


__all__ = ["LMCArgumentParser", "condensed_error", "quiet_third_party"]
