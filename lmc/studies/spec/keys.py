"""Dotted keys of a resolved ``lmc`` config (``a.b.c`` = ``cfg["a"]["b"]["c"]``) and the
command-line form of config values, shared by the study's planner and its checks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def cli_value(value: Any) -> str:
    """``value`` as one command-line token (strings as they are, the rest as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def _child(node: Any, part: str) -> Any:
    """``node[part]``, or ``KeyError``; in a list (e.g. ``trainer.callbacks``) the key is looked
    up in its last entry, as the CLI applies ``--trainer.callbacks.init_args.rate`` there."""
    if isinstance(node, list) and node:
        node = node[-1]
    if not isinstance(node, Mapping) or part not in node:
        raise KeyError(part)
    return node[part]


def has_key(cfg: Mapping[str, Any], dotted: str) -> bool:
    """Whether ``cfg`` has the dotted key ``dotted`` (``a.b.c`` = ``cfg["a"]["b"]["c"]``; a
    list stands for its last entry)."""
    node: Any = cfg
    for part in dotted.split("."):
        try:
            node = _child(node, part)
        except KeyError:
            return False
    return True


def near_keys(cfg: Mapping[str, Any], dotted: str) -> str:
    node: Any = cfg
    prefix: list[str] = []
    for part in dotted.split("."):
        try:
            node, prefix = _child(node, part), [*prefix, part]
        except KeyError:
            break
    if isinstance(node, list) and node:
        node = node[-1]
    keys = sorted(node) if isinstance(node, Mapping) else []
    where = ".".join(prefix) or "the top level"
    return f"keys under {where}: {', '.join(keys)}" if keys else f"{where} holds no keys"


def config_args(configs: Sequence[Path], extra: Sequence[str]) -> list[str]:
    return [arg for path in configs for arg in ("-c", str(path))] + list(extra)


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key shortened to its last part, or to as many last parts as keep the keys
    apart (``model.init_args.net.init_args.width`` -> ``width``; ``a.x.seed`` and ``b.seed``
    -> ``x.seed`` and ``b.seed``), ``init_args`` left out of the shortened form."""

    def tail(key: str, n: int) -> str:
        parts = [p for p in key.split(".") if p != "init_args"] or [key]
        return ".".join(parts[-n:])

    out: dict[str, str] = {}
    for key in keys:
        n = 1
        while n < len(key.split(".")) and any(
            tail(key, n) == tail(other, n) for other in keys if other != key
        ):
            n += 1
        out[key] = tail(key, n)
    return out


def readable_coordinates(coordinates: Mapping[str, Any]) -> str:
    """A job's coordinates as one line for people: ``width=512 seed=0`` (short keys, values
    as given on the command line)."""
    names = short_keys(list(coordinates))
    return " ".join(f"{names[k]}={cli_value(v)}" for k, v in coordinates.items())
