"""The configs shipped with ``lmc`` (``lmc/configs``; ``configs/`` in a clone points there),
reachable by name from an installed wheel: ``lmc fit --config lmc:quickstart``,
``lmc configs list``, ``lmc configs copy mnist/mlp``."""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Sequence
from pathlib import Path

#: a config argument that names a shipped config
PREFIX = "lmc:"
#: where the shipped configs are (inside the package)
ROOT = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> list[str]:
    """The names of the shipped configs (``mnist/mlp``, ``studies/004_merge_n``, ...), sorted."""
    return sorted(p.relative_to(ROOT).with_suffix("").as_posix() for p in ROOT.rglob("*.yaml"))


def shipped_path(name: str) -> Path:
    """The file of the shipped config ``name`` (``lmc:`` and ``.yaml`` optional).

    Raises:
        ValueError: no such config, naming the nearest and listing the shipped ones.
    """
    key = name.removeprefix(PREFIX).removesuffix(".yaml")
    path = ROOT / f"{key}.yaml"
    if key and path.is_file() and ROOT in path.resolve().parents:
        return path
    names = shipped_configs()
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(f'lmc:{n}' for n in near)}? " if near else ""
    raise ValueError(
        f"no shipped config {PREFIX}{key}; {hint}the shipped configs (lmc configs list): "
        + ", ".join(names)
    )


def resolve_shipped(args: Sequence[str]) -> list[str]:
    """``args`` with every ``-c``/``--config`` value ``lmc:NAME`` replaced by that config's
    file (:func:`shipped_path`)."""
    out = [str(a) for a in args]
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out) and out[i + 1].startswith(PREFIX):
            out[i + 1] = str(shipped_path(out[i + 1]))
        elif arg.startswith("--config=" + PREFIX):
            out[i] = f"--config={shipped_path(arg.split('=', 1)[1])}"
    return out


def copy_shipped(name: str, dest: str | Path | None = None) -> Path:
    """Copy the shipped config ``name`` to ``dest`` (default ``./<its file name>``; a folder:
    into it), refusing to overwrite a file; returns the path written.

    Raises:
        FileExistsError: ``dest`` exists (a file).
        ValueError: no such config.
    """
    source = shipped_path(name)
    target = Path(dest) if dest is not None else Path(source.name)
    if target.is_dir():
        target = target / source.name
    if target.exists():
        raise FileExistsError(f"{target} exists: give another destination (lmc configs copy)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target
