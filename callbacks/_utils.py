"""Helpers shared by the callbacks: the wrapped network, epoch cadence, direct logging."""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
from torch import nn


def network(pl_module: L.LightningModule) -> nn.Module:
    """The injected network (``pl_module.net`` for ``lmc.tasks``), else the module itself."""
    net = getattr(pl_module, "net", None)
    return net if isinstance(net, nn.Module) else pl_module


def due(trainer: L.Trainer, every_n_epochs: int) -> bool:
    """True after every ``every_n_epochs``-th epoch and after the last one."""
    epoch = trainer.current_epoch + 1
    last = trainer.max_epochs is not None and epoch >= trainer.max_epochs
    return epoch % every_n_epochs == 0 or last


def log_metrics(trainer: L.Trainer, metrics: Mapping[str, float]) -> None:
    """Send ``metrics`` to every logger at the current global step (any hook, no aggregation)."""
    if trainer.sanity_checking or not trainer.is_global_zero:
        return
    row = {**metrics, "epoch": float(trainer.current_epoch)}
    for logger in trainer.loggers:
        logger.log_metrics(row, step=trainer.global_step)


def is_last_batch(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the batch that just ended is the last of the whole fit."""
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return True
    epochs = trainer.max_epochs
    last_epoch = epochs is not None and epochs >= 0 and trainer.current_epoch >= epochs - 1
    return last_epoch and batch_idx + 1 >= trainer.num_training_batches
