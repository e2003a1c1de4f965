"""Exact resume of ``lmc fit``: atomic checkpoints, the random state inside them, and the run a
``--ckpt_path last`` continues.

Together with the data modules' epoch-seeded sampler (the data order of epoch ``e`` is a function
of the seed and ``e`` only), a run killed at any point and resumed from its ``last.ckpt`` ends
with the same weights, optimizer state and metrics as a run that was never interrupted.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lmc.engine.seam import experiment_started, set_experiment
from lmc.io import atomic_write, load_checkpoint, remove_orphans, spawn_point


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but atomic: a crash or a full disk while writing leaves
    the previous file under its name (never a truncated checkpoint that a later read picks up)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_write(path, lambda f: torch.save(checkpoint, f))


def rng_states() -> dict[str, Any]:
    """The global random states of torch (CPU and CUDA), NumPy and Python, as tensors and plain
    containers only (a checkpoint stays loadable with ``weights_only=True``)."""
    # the global RandomState is an MT19937: the legacy tuple (numpy's stub picks the dict)
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    kind, keys, pos, has_gauss, gauss = legacy
    version, state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(state), py_gauss],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` captured."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, state, py_gauss = states["python"]
    random.setstate((version, tuple(state), py_gauss))


class RandomStateCheckpoint(Callback):
    """Keeps the global random state in every checkpoint and restores it when a resumed run
    starts its first epoch (after model building and the sanity check, which draw from it too),
    so augmentation, dropout and any other draw continue as if the run had never stopped.

    ``lmc``'s CLI adds it to every run; with ``restore=False`` (a run spawned from another
    run's checkpoint, ``--spawn_from``) the checkpoint's random state is not restored, so the
    new run draws from its own seed.
    """

    def __init__(self, restore: bool = True) -> None:
        self._pending: dict[str, Any] | None = None
        self.restore = restore

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("rng") if self.restore else None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None:
            set_rng_states(self._pending)
            self._pending = None


def logged_step(checkpoint: Mapping[str, Any]) -> int:
    """The logging step a checkpoint was saved at: the ``step`` of the first row its run logs
    after it (Lightning logs rows at the count of batches that stepped an optimizer, which
    the fit loop keeps; ``global_step`` for checkpoints without it)."""
    loops = checkpoint.get("loops") or {}
    epoch_loop = (loops.get("fit_loop") or {}).get("epoch_loop.state_dict") or {}
    return int(epoch_loop.get("_batches_that_stepped", checkpoint.get("global_step", 0)))


class ResumedCSVWriter(ExperimentWriter):
    """Lightning's CSV writer for a resumed run: the rows its killed attempt logged before the
    checkpoint (``step`` below ``before_step``) are kept and the new rows appended after them,
    so the run's ``metrics.csv`` is an uninterrupted run's row for row; rows logged after the
    checkpoint are dropped, as the resumed run logs them again. Lightning's own writer deletes
    the file instead ("Previous log files in this directory will be deleted")."""

    def __init__(self, log_dir: str, before_step: int) -> None:
        self.before_step = before_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            keys, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if not r.get("step") or float(r["step"]) < self.before_step]

        def write(f: Any) -> None:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)

        atomic_write(path, write, mode="w")
        self.metrics_keys = keys


class LogsForResume(Callback):
    """What a resumed run needs of its logs: CSV rows written to disk at every epoch start and
    checkpoint (a killed run keeps the rows its ``last.ckpt`` covers, not only those of the
    last 100-step flush), and, in a resumed run, each checkpoint's saved paths re-spelt when
    its folder is the same one under another spelling (a relative root the first time, an
    absolute one the second): Lightning would otherwise not know its ``last.ckpt`` and write
    ``last-v1.ckpt`` beside it.

    ``lmc``'s CLI adds it to every ``fit``.
    """

    @staticmethod
    def _flush(trainer: L.Trainer) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger) and experiment_started(logger):
                logger.save()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush(trainer)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._flush(trainer)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint.get("callbacks") or {}
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint):
                continue
            state = states.get(callback.state_key)
            if state is not None and callback.dirpath:
                respell_checkpoint_state(state, str(callback.dirpath))


def respell_checkpoint_state(state: dict[str, Any], dirpath: str) -> None:
    """A ``ModelCheckpoint`` state saved with its folder spelt otherwise (``a/b`` then
    ``/x/a/b``): its folder and file paths spelt as ``dirpath`` (in place); a state of another
    folder is left as it is."""
    old = state.get("dirpath")
    if not old or old == dirpath or os.path.realpath(old) != os.path.realpath(dirpath):
        return

    def respell(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(old))
        return path if rel.startswith("..") else os.path.join(dirpath, rel)

    state["dirpath"] = dirpath
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = respell(state[key])
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {respell(k): v for k, v in state["best_k_models"].items()}


def keep_logged_rows(trainer: L.Trainer, checkpoint: str | Path) -> None:
    """Before a run continues from ``checkpoint`` in its own folder: its CSV loggers keep the
    rows logged before it (:class:`ResumedCSVWriter`) instead of starting a new file, and an
    offline W&B run continues at the step after them
    (:func:`lmc.loggers.continue_offline_history`)."""
    from lmc.loggers import continue_offline_history

    if not trainer.is_global_zero or not trainer.loggers:
        return
    step = logged_step(load_checkpoint(checkpoint, mmap=True))
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger) and not experiment_started(logger):
            os.makedirs(logger.root_dir, exist_ok=True)
            set_experiment(logger, ResumedCSVWriter(logger.log_dir, step))
        else:
            continue_offline_history(logger, step)


class SpawnPoints(Callback):
    """Save a full checkpoint (weights, optimizer, loop state) after each of ``epochs`` epochs
    of training (0: before the first step) as ``checkpoints/spawn/epoch=<k>.ckpt``: the points
    other runs start from with ``--spawn_from`` (Frankle et al. 2020's instability analysis:
    two children of one parent at epoch k, trained on with different data orders).

    ``lmc``'s CLI adds it for ``--spawn_points [k, ...]``.
    """

    def __init__(self, epochs: list[int]) -> None:
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in epochs):
            raise ValueError(f"--spawn_points: give whole numbers of epochs >= 0, got {epochs}")
        self.epochs = sorted(set(epochs))

    def _save(self, trainer: L.Trainer, epoch: int) -> None:
        from lmc.tasks.rundir import run_dir

        path = spawn_point(run_dir(trainer), epoch)
        if epoch in self.epochs and not path.exists():  # a resumed run keeps what it saved
            trainer.save_checkpoint(path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0 and trainer.global_step == 0:
            self._save(trainer, 0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer, trainer.current_epoch + 1)


def is_run_dir(path: Path) -> bool:
    """A folder written by ``lmc fit``: its ``config.yaml`` beside ``checkpoints/``."""
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def run_of_config(config_paths: list[str]) -> Path | None:
    """The run folder whose saved ``config.yaml`` is among the ``--config`` files, if any."""
    for p in reversed(config_paths):
        path = Path(p)
        if path.name == "config.yaml" and is_run_dir(path.parent):
            return path.parent
    return None


def resumable_runs(root: Path) -> list[Path]:
    """Run folders under ``root`` (``<save_dir>/<name>/<version>``) holding a ``last.ckpt``,
    newest first."""
    found = [p.parent.parent for p in root.glob("*/*/checkpoints/last.ckpt")]
    return sorted(
        (p for p in found if is_run_dir(p)),
        key=lambda p: (p / "checkpoints" / "last.ckpt").stat().st_mtime,
        reverse=True,
    )


def same_experiment(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether a run's saved config is the experiment ``current`` describes (model, data and
    seed; trainer and logger settings may differ)."""
    return all(saved.get(k) == current.get(k) for k in ("model", "data", "seed_everything"))


def continue_run(cfg: Any, run: Path) -> Path:
    """Point ``cfg``'s loggers at ``run`` (same folder, same W&B run) and return the checkpoint
    to resume from, ``run/checkpoints/last.ckpt``.

    Raises:
        FileNotFoundError: the run has no ``last.ckpt``.
    """
    last = run / "checkpoints" / "last.ckpt"
    remove_orphans(last.parent)  # a checkpoint write the kill interrupted
    if not last.is_file():
        raise FileNotFoundError(
            f"--ckpt_path: {run} has no checkpoints/last.ckpt to resume from (runs save it at "
            "every epoch end); give one of its checkpoints as --ckpt_path FILE instead"
        )
    trainer = cfg.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init = getattr(logger, "init_args", None)
        if init is None:
            continue
        init.save_dir = os.path.abspath(run.parent.parent)
        if "WandbLogger" in str(getattr(logger, "class_path", "")):
            init.id, init.resume = run.name, "allow"
        else:  # CSV / TensorBoard: <save_dir>/<name>/<version>
            init.name, init.version = run.parent.name, run.name
    return last
