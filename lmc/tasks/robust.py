"""Adversarial training of endpoint models with PGD (Madry et al. 2017; 002 §2.3, §5)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lmc.curves.attack import PGD, as_pgd, data_normalization, pgd_attack
from lmc.optim import default_optimizer
from lmc.tasks.classification import ClassificationTask


class AdversarialClassificationTask(ClassificationTask):
    """:class:`~lmc.tasks.ClassificationTask` trained on PGD examples (robust endpoints).

    Every training batch is replaced by its PGD adversarial version, crafted against the
    network in train mode. Validation and test log the clean metrics and, with ``robust_eval``,
    ``{stage}/robust_acc`` and ``{stage}/robust_loss`` on PGD examples crafted in eval mode.

    Args:
        attack: PGD settings (default 8/255, step 2/255, 5 steps).
        pixel_space: attack in [0, 1] pixel space with the data module's mean/std; otherwise
            ``eps`` is in normalised input units.
        robust_eval: also evaluate under attack in validation and test.
        Other arguments: as in :class:`ClassificationTask`.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
        attack: PGD | None = None,
        pixel_space: bool = True,
        robust_eval: bool = True,
    ) -> None:
        self.attack = as_pgd(attack) or PGD()
        self.pixel_space, self.robust_eval = pixel_space, robust_eval
        super().__init__(
            net, num_classes, optimizer, lr_scheduler, scheduler_interval, label_smoothing
        )

    def _normalization(self) -> tuple[Any, Any]:
        dm = getattr(self.trainer, "datamodule", None)
        return data_normalization(dm) if self.pixel_space else (None, None)

    def _adversarial(self, x: Tensor, y: Tensor) -> Tensor:
        with torch.inference_mode(False):
            return pgd_attack(self.net, x.clone(), y.clone(), self.attack, *self._normalization())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return self._shared_step((self._adversarial(x, y), y), "train")

    def _robust(self, batch: Any, stage: str) -> None:
        x, y = batch
        x_adv = self._adversarial(x, y)
        with torch.no_grad():
            out = self.net(x_adv)
        self.log(f"{stage}/robust_loss", nn.functional.cross_entropy(out, y), on_epoch=True)
        self.log(f"{stage}/robust_acc", (out.argmax(1) == y).float().mean(), on_epoch=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if self.robust_eval:
            self._robust(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        if self.robust_eval:
            self._robust(batch, "test")
