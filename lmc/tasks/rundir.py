"""Where a run's own files go (config, checkpoints, figures, summaries)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger


def run_dir(trainer: L.Trainer) -> Path:
    """The run's own directory: the parent of its ``checkpoints/`` folder.

    Mirrors ``ModelCheckpoint``'s rule (``<save_dir>/<name>/<version>``) so the saved
    ``config.yaml``, the checkpoints and any summary of one run sit side by side, also with the
    W&B logger, whose ``save_dir`` is shared by all runs. Call it on every rank.
    """
    if not trainer.loggers:
        path = Path(trainer.default_root_dir)
    else:
        logger = trainer.loggers[0]
        if isinstance(logger, (CSVLogger, TensorBoardLogger)):
            path = Path(logger.log_dir)
        else:
            save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
            version = logger.version if trainer.is_global_zero else None
            version = version if isinstance(version, str) else f"version_{version}"
            path = Path(save_dir) / str(logger.name) / version
    return Path(trainer.strategy.broadcast(str(path)))
