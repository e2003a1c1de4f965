"""Shared LightningModule plumbing of the ``lmc`` tasks."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters


def save_task_hparams(module: L.LightningModule, ignore: Sequence[str] = ()) -> None:
    """``save_hyperparameters`` that keeps checkpoints loadable with ``weights_only=True``.

    Under LightningCLI the parsed config (class paths and plain values) is stored, so
    ``load_from_checkpoint`` rebuilds injected modules and callables. Built by hand, those
    objects cannot be stored safely: the ``ignore`` arguments are left out (pass them again
    when loading).
    """
    if _given_hyperparameters.get() is None:
        module.save_hyperparameters(ignore=list(ignore), frame=inspect.currentframe().f_back)
    else:
        module.save_hyperparameters()


class EvaluationTask(L.LightningModule, ABC):
    """A task run with ``lmc validate`` that trains nothing (anomalib's Padim pattern).

    It returns no optimizer, ignores the validation batches, and calls :meth:`evaluate` once
    when the validation epoch ends (not during the sanity check).
    """

    def configure_optimizers(self) -> None:
        return None

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.evaluate()

    @abstractmethod
    def evaluate(self) -> None:
        """The task's whole measurement and logging."""
