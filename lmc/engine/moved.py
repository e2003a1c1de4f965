"""Config keys that moved (e.g. grouped curve options): name the new key before jsonargparse
rejects the old one as unknown without saying where it went."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

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
    "OTFusionTask": "lmc validate with lmc.tasks.MergeTask and methods: [otfusion, naive] (naive: "
    "the plain average it reported as vanilla_avg); otfusion.* -> method_options.otfusion.*; "
    "results: fused/{split}/* -> otfusion/n{n}/{split}/*; see configs/merge/mnist_mlp_otfusion.yaml",
    "FedMATask": "a study that trains each client with lmc fit on lmc.data.FederatedClients "
    "(federated.{clients, alpha} -> data.init_args.*, one run per data.init_args.client) and "
    "merges them with lmc validate, lmc.tasks.MergeTask, methods: [fedma] (fedma.* -> "
    "method_options.fedma.*); see configs/studies/000_fedma.yaml and "
    "configs/merge/mnist_mlp_fedma.yaml",
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


#: init arguments that are mappings of mappings (``{method: {option: value}}``), whose entries
#: a config or a study's grid sets by dotted key (``--model.init_args.method_options.zip.alpha``)
MAPPING_OPTIONS = ("method_options",)


def merge_mapping_args(args: Sequence[str]) -> list[str]:
    """``args`` with every dotted key into a :data:`MAPPING_OPTIONS` mapping
    (``--model.init_args.method_options.otfusion.prune_rate=0.5``) merged into the mapping the
    config files and earlier arguments give, passed as one ``--model.init_args.<option>=<json>``
    after them: jsonargparse would otherwise replace the whole mapping with that one entry,
    silently dropping the config's other options (a study's grid sets them one key at a time).
    """
    items = [str(a) for a in args]
    current: dict[str, dict[str, Any]] = {}
    dotted: set[str] = set()
    out: list[str] = []
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        name, eq, value = arg.partition("=")
        given = [arg]
        if not eq and name.startswith("-") and i < len(items):
            if not items[i].startswith("--") and items[i] != "-c":
                value, i = items[i], i + 1
                given.append(value)
        if name in ("-c", "--config", "--model"):
            cfg = _load(value)
            cfg = {"model": cfg} if name == "--model" else cfg
            for section in (
                [cfg, *(cfg.get(sub) for sub in _SUBCOMMANDS)] if _is_mapping(cfg) else []
            ):
                model = section.get("model") if _is_mapping(section) else None
                init = model.get("init_args") if _is_mapping(model) else None
                for key in MAPPING_OPTIONS:
                    if _is_mapping(init) and _is_mapping(init.get(key)):
                        current[key] = _copy_mapping(init[key])
        option = name.removeprefix("--model.").removeprefix("init_args.")
        key, dot, rest = option.partition(".")
        if not name.startswith("--model.") or key not in MAPPING_OPTIONS:
            out += given
            continue
        parsed = _load(value)
        if not dot:  # the whole mapping: it replaces what came before
            current[key] = _copy_mapping(parsed) if _is_mapping(parsed) else {}
            dotted.discard(key)
            out += given
            continue
        entry, _, field = rest.partition(".")
        target = current.setdefault(key, {})
        if field:
            if not _is_mapping(target.get(entry)):
                target[entry] = {}
            target[entry][field] = parsed
        else:
            target[entry] = parsed
        dotted.add(key)
    out += [f"--model.init_args.{k}={json.dumps(current[k])}" for k in sorted(dotted)]
    return out


def _copy_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if _is_mapping(v) else v for k, v in value.items()}


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
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
