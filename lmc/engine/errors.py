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
from typing import Any, NoReturn

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


def owner_class_path(args: list[str], option: str) -> str | None:
    """The class path of the component (data module, network, task, ...) that was given
    ``option`` in ``args``: the last ``--<path>.init_args.<option>`` on the command line, else
    the last config file's ``<path>: {init_args: {<option>: ...}}``; its class is the last one
    given at ``<path>`` (the config files, then ``--<path>=`` / ``--<path>.class_path=``)."""
    from lmc.engine.moved import _load  # the CLI's own reading of configs and inline YAML

    configs: list[Any] = []
    owner_path: list[str] | None = None
    i = 0
    while i < len(args):
        name, eq, value = str(args[i]).partition("=")
        i += 1
        if not name.startswith("-"):  # the subcommand, or a value already taken
            continue
        if not eq and i < len(args) and not str(args[i]).startswith("-"):
            value, i = str(args[i]), i + 1
        if name in ("-c", "--config"):
            configs.append(_load(value))
        elif name.startswith("--") and name.endswith(f".init_args.{option}"):
            owner_path = name[2:].split(".")[:-2]
    if owner_path is None:  # the option sits in a config file, under some <path>.init_args

        def walk(node: Any, path: list[str]) -> None:
            nonlocal owner_path
            if isinstance(node, dict):
                init = node.get("init_args")
                if isinstance(init, dict) and option in init:
                    owner_path = path
                for k, v in node.items():
                    walk(v, [*path, str(k)])

        for cfg in configs:
            walk(cfg, [])
        if owner_path is None:
            return None
    found: str | None = None
    for cfg in configs:  # the class given at owner_path, last one wins
        node: Any = cfg
        for part in owner_path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and "class_path" in node:
            found = str(node["class_path"])
        elif isinstance(node, str):
            found = node
    dotted = ".".join(owner_path)
    for a in args:
        name, eq, value = str(a).partition("=")
        if eq and name in (f"--{dotted}", f"--{dotted}.class_path"):
            found = value
    return found


def condensed_error(
    err: BaseException | str, model_class: str | None = None, args: list[str] | None = None
) -> str:
    """The relevant lines of an error: jsonargparse's union bookkeeping dropped, an unknown
    option completed with the closest accepted one and the accepted list, and attributed to the
    class that rejected it (found from ``args``, the command line; else ``model_class``, the
    model's class path, when the message does not name it)."""
    text = str(err)
    match = _NOT_ACCEPTED.search(re.sub(r"\s+", " ", text))
    if match:
        class_path, option = match.groups()
        return f"{class_path}: option '{option}' is not accepted" + _suggestion(class_path, option)
    bare = _BARE_NOT_ACCEPTED.fullmatch(text.strip())
    if bare:
        option = bare.group(1)
        owner = owner_class_path(args, option) if args is not None else None
        owner = owner or model_class
        if owner:
            return f"{owner}: option '{option}' is not accepted" + _suggestion(owner, option)
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
        commands = ("fit", "validate", "test", "predict")
        subcommands = [t for t in self.prog.split()[1:] if t in commands]
        if not subcommands:  # a nested parser (a class's options) carries only "lmc"
            first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
            subcommands = [first] if first in commands else []
        prog = " ".join(["lmc", *subcommands])  # nested parsers may carry another program name
        from lmc.engine.moved import _model_class_path

        argv = sys.argv[1:]
        detail = condensed_error(message, _model_class_path(argv), argv)
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
