"""Shared LightningModule plumbing of the ``lmc`` tasks: the evaluation splits a task caches,
the default loss of a data module, hyper-parameter saving and the evaluation-only base class."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

import lightning as L
from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters

from lmc.evaluation import LossName, cache_batches

Split = Literal["train", "val", "test"]


def split_batches(
    datamodule: Any, splits: list[str], max_batches: int | None, device: Any
) -> dict[str, list]:
    """Cached batches per split; ``train`` is the fixed, un-augmented alignment subset of train."""
    loaders = {
        "train": datamodule.alignment_dataloader,
        "val": datamodule.val_dataloader,
        "test": datamodule.test_dataloader,
    }
    out = {}
    for split in splits:
        batches = cache_batches(loaders[split](), device)
        out[split] = batches[:max_batches] if max_batches else batches
    return out


def eval_and_align_batches(
    datamodule: Any, splits: list[str], max_batches: int | None, device: Any
) -> tuple[dict[str, list], list]:
    """The cached evaluation splits and the alignment subset (shared with ``train`` if asked)."""
    batches = split_batches(datamodule, splits, max_batches, device)
    align = (
        batches.get("train") or split_batches(datamodule, ["train"], max_batches, device)["train"]
    )
    return batches, align


def default_loss(datamodule: Any) -> LossName:
    """``mse`` for a regression data module (``task = "regression"``), else ``cross_entropy``."""
    return (
        "mse" if getattr(datamodule, "task", "classification") == "regression" else "cross_entropy"
    )


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
