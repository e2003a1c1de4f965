"""Config keys that moved (e.g. grouped curve options): name the new key before jsonargparse
rejects the old one as unknown without saying where it went."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

_SUBCOMMANDS = ("fit", "validate", "test", "predict")

_TRAINED = (
    "lmc.tasks.TrainedMergeTask with methods: [{m}, <methods to compare, e.g. wm_ref>]; "
    "{search}baselines -> methods (after {m}), save_matched -> save_merged (pi(B) is in "
    "permutations.pt); see configs/merge/{example}"
)

#: merge tasks that one merge front door replaced (issue 49), each with its new form
REPLACED_TASKS: dict[str, str] = {
    "STEMMTask": _TRAINED.format(
        m="stemm",
        search="search.{mixing, keep_best} -> method_options.stemm.*, search.wm_method -> "
        "wm_method, ",
        example="mnist_mlp_stemm.yaml",
    ),
    "STETask": _TRAINED.format(
        m="ste",
        search="search.{mixing, keep_best} -> method_options.ste.*, search.wm_method -> "
        "wm_method, ",
        example="mnist_mlp_ste.yaml",
    ),
    "SinkhornTask": _TRAINED.format(
        m="sinkhorn",
        search="search.* -> method_options.sinkhorn.*, ",
        example="mnist_mlp_sinkhorn.yaml",
    ),
}


def replaced_task_error(class_path: str | None) -> str | None:
    """The error for a model class that was replaced (:data:`REPLACED_TASKS`), or ``None``."""
    if not class_path:
        return None
    module, _, name = class_path.rpartition(".")
    if module not in ("", "lmc.tasks") or name not in REPLACED_TASKS:
        return None
    return (
        f"model.class_path {class_path} was replaced by one merge task per way of running: "
        f"use {REPLACED_TASKS[name]}. Update the config to the new form."
    )


def moved_keys_error(args: Any) -> str | None:
    """The error for ``model.init_args`` keys that the model class lists as moved, or ``None``.

    A task declares ``moved_keys = {old: new}`` (paths under ``model.init_args``). ``args`` are
    the raw CLI arguments (or a config mapping): ``-c``/``--config`` files and inline configs,
    ``--model``, ``--model.class_path`` and ``--model.init_args.*`` are read. An old key that
    is now the name of a group (``plane`` -> ``plane.kind``) counts only when given a plain
    value rather than a mapping.
    """
    class_path, given = _raw_model_args(args)
    replaced = replaced_task_error(class_path)
    if replaced:
        return replaced
    moved = getattr(class_named(class_path), "moved_keys", None) or {}
    problems: list[str] = []
    for key, value, where in given:
        new = moved.get(key)
        if new is None or (new.startswith(f"{key}.") and (value is None or _is_mapping(value))):
            continue
        problem = f"model.init_args.{key} moved to model.init_args.{new} (in {where})"
        if problem not in problems:
            problems.append(problem)
    if not problems:
        return None
    return f"{class_path}: " + "; ".join(problems) + ". Update the config to the new keys."


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


def _load(value: Any, base: Path | None = None) -> Any:
    """A config file's content, or an inline YAML string parsed (``None`` if invalid YAML)."""
    if not isinstance(value, str):
        return value
    try:
        for path in (base / value if base is not None else None, Path(value)):
            if path is not None and path.is_file():
                return yaml.safe_load(path.read_text())
        return yaml.safe_load(value)
    except (OSError, yaml.YAMLError):  # e.g. an inline config too long for a file name
        return None


def _raw_model_args(args: Any) -> tuple[str | None, list[tuple[str, Any, str]]]:
    """The model's class path (last given) and every ``init_args`` key given, with its value
    and where it was given."""
    class_path: str | None = None
    given: list[tuple[str, Any, str]] = []

    def take_model(model: Any, where: str, base: Path | None = None) -> None:
        nonlocal class_path
        model = _load(model, base)
        if isinstance(model, str):
            class_path = model
        elif _is_mapping(model):
            class_path = model.get("class_path", class_path)
            init = model.get("init_args")
            given.extend((k, v, where) for k, v in (init.items() if _is_mapping(init) else ()))

    def take_config(cfg: Any, where: str, base: Path | None = None) -> None:
        for section in (cfg, *(cfg.get(sub) for sub in _SUBCOMMANDS)) if _is_mapping(cfg) else ():
            if _is_mapping(section) and "model" in section:
                take_model(section["model"], where, base)

    if not isinstance(args, (list, tuple)):
        take_config(args.as_dict() if hasattr(args, "as_dict") else args, "the config")
        return class_path, given
    items = [str(a) for a in args]
    i = 0
    while i < len(items):
        name, eq, value = items[i].partition("=")
        i += 1
        if not name.startswith("-"):
            continue
        if not eq and i < len(items) and not items[i].startswith("--"):
            value, i = items[i], i + 1
        if name in ("-c", "--config"):
            cfg = _load(value)
            take_config(
                cfg,
                "an inline config" if value.lstrip().startswith("{") else value,
                Path(value).parent,
            )
        elif name == "--model":
            take_model(value, "--model")
        elif name == "--model.class_path":
            class_path = value
        elif name == "--model.init_args":
            take_model({"init_args": _load(value)}, "the command line")
        elif name.startswith("--model."):
            key, dot, _ = name.removeprefix("--model.").removeprefix("init_args.").partition(".")
            given.append((key, {} if dot else _load(value), "the command line"))
    return class_path, given


def class_named(class_path: str | None) -> type | None:
    """The class named by ``class_path`` (a bare name is looked up in :mod:`lmc.tasks`), or
    ``None`` when it does not import."""
    if not class_path:
        return None
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module or "lmc.tasks"), name, None)
    except ImportError:
        return None


def _model_class_path(args: Any) -> str | None:
    """The model's class path given in ``args`` (config files or options), if any."""
    try:
        return _raw_model_args(args)[0]
    except Exception:  # noqa: BLE001 - only a hint for an error message
        return None
