"""Checks of a run's arguments before any work: config files that are not YAML, a spawn point
that cannot start a run, endpoints that do not load or do not fit together, data other than the
endpoints learned, and the differences between two configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.utilities import rank_zero_warn

from lmc.io import load_checkpoint


def config_file_error(args: Any) -> str | None:
    """The first ``-c``/``--config`` file that is not valid YAML, named with the line (the
    parser's own message says ``<unicode string>``, not which of several files), or ``None``."""
    if not isinstance(args, (list, tuple)):
        return None
    for i, arg in enumerate(args):
        value = None
        if arg in ("-c", "--config") and i + 1 < len(args):
            value = args[i + 1]
        elif isinstance(arg, str) and arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        if not isinstance(value, str) or not Path(value).is_file():
            continue
        try:
            yaml.safe_load(Path(value).read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            return f"the config file {value} is not valid YAML{where}: {problem}"
        except (OSError, UnicodeDecodeError) as err:
            return f"the config file {value} cannot be read: {err}"
    return None


def config_differences(a: Any, b: Any, where: str) -> list[tuple[str, Any, Any]]:
    """``(key, value in a, value in b)`` for every leaf of two configs that differs (keys only
    one side has are left out: a checkpoint may predate an option)."""
    if a is None or b is None:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a if k in b for d in config_differences(a[k], b[k], f"{where}.{k}")]
    return [] if a == b else [(where, a, b)]


def check_spawn_from(path: str, subcommand: str, max_epochs: int | None = None) -> None:
    """``--spawn_from`` names a readable checkpoint, for ``fit`` only, of fewer epochs than
    ``max_epochs`` (else the child would train nothing and leave a run without checkpoints)."""
    if subcommand != "fit":
        raise ValueError(
            f"--spawn_from starts a training run: it is for `lmc fit`, not {subcommand}"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"--spawn_from {path}: no such checkpoint file (spawn points are saved by a run "
            "given --spawn_points [k, ...], as <run>/checkpoints/spawn/epoch=<k>.ckpt)"
        )
    ckpt = load_checkpoint(path, mmap=True)  # corrupt or untrusted: refused now, before any work
    progress = ((ckpt.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    current = progress.get("current") or {}
    done = max(int(current.get("completed") or 0), int(current.get("processed") or 0))
    if isinstance(max_epochs, int) and max_epochs >= 0 and done >= max_epochs:
        raise ValueError(
            f"--spawn_from {path}: the checkpoint has trained {done} epoch(s) and "
            f"trainer.max_epochs is {max_epochs}, so the new run would train nothing; give "
            "a larger --trainer.max_epochs (the epochs in all, the parent's included)"
        )


def check_model_checkpoints(cfg: Any) -> None:
    """Read every ``model.init_args.checkpoints`` entry now (run folders resolved to their final
    checkpoint), so a missing, corrupt or untrusted file, non-finite weights, or endpoints of
    different architectures stop the run before anything is built."""
    init_args = getattr(cfg.get("model"), "init_args", None)
    paths = init_args.get("checkpoints") if init_args is not None else None
    if not paths:
        return
    from lmc.interpolation.states import check_compatible
    from lmc.io import check_finite, model_state_dict, resolve_checkpoint

    files = [resolve_checkpoint(p) for p in paths]  # run folders -> their final checkpoint
    states = [model_state_dict(load_checkpoint(f, mmap=True)) for f in files]
    for f, state in zip(files, states):
        check_finite(state, str(f))
    check_compatible(states, [str(f) for f in files])
    warn_other_data(cfg, files)


def warn_other_data(cfg: Any, files: list[Path]) -> None:
    """Warn when the data of this run differ from what the checkpoints' runs trained on (their
    saved config.yaml), in what a model learns (:func:`lmc.data.base.data_differences`): on
    purpose (a shifted test set) it stands, by mistake it gives numbers of the wrong task."""
    from lmc.data.base import data_differences

    data = cfg.get("data")
    here = data.as_dict() if hasattr(data, "as_dict") else data
    for f in files:
        saved = f.parent.parent / "config.yaml"
        try:
            trained = (yaml.safe_load(saved.read_text()) or {}).get("data")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        lines = data_differences(trained, here)
        if lines:
            rank_zero_warn(
                f"the data here differ from what {f} was trained on ({'; '.join(lines)}): the "
                "numbers are of another task than the model learned, unless that is the point"
            )
