"""Where a run's own files go (config, checkpoints, figures, summaries)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger


def logger_dir(logger: Logger, default_root: str | Path) -> Path:
    """The run folder of ``logger``: ``<save_dir>/<name>/<version>`` (its ``log_dir`` for the CSV
    and TensorBoard loggers), with ``default_root`` where it has no ``save_dir``."""
    if isinstance(logger, (CSVLogger, TensorBoardLogger)):
        return Path(logger.log_dir)
    save_dir = logger.save_dir if logger.save_dir is not None else default_root
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(save_dir) / str(logger.name) / version


def run_dir(trainer: L.Trainer) -> Path:
    """The run's own directory: the parent of its ``checkpoints/`` folder.

    Mirrors ``ModelCheckpoint``'s rule (``<save_dir>/<name>/<version>``) so the saved
    ``config.yaml``, the checkpoints and any summary of one run sit side by side, also with the
    W&B logger, whose ``save_dir`` is shared by all runs. Call it on every rank: rank 0's
    folder is broadcast (other ranks do not know the logger's version).
    """
    if trainer.loggers and trainer.is_global_zero:
        path = logger_dir(trainer.loggers[0], trainer.default_root_dir)
    else:
        path = Path(trainer.default_root_dir)
    return Path(trainer.strategy.broadcast(str(path)))
