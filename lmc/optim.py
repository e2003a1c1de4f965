"""The default optimizer and the learning-rate schedules of the papers' recipes (pure torch,
usable without Lightning)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def default_optimizer(params: Iterable[nn.Parameter]) -> Optimizer:
    """Adam with learning rate 1e-3 (004 App. B.2), every task's and loop's default."""
    return torch.optim.Adam(params, lr=1e-3)


class WarmupLinearDecay(LambdaLR):
    """Linear warm-up from 0 to the base LR, then linear decay back to 0 (004 App. B.1).

    The factor at step ``s`` is ``interp(s, [0, warmup_steps, total_steps], [0, 1, 0])``, the
    schedule 004 takes from Jordan et al.'s REPAIR code. Step it once per optimizer step
    (``scheduler_interval: step`` in the task) with ``total_steps`` = epochs x batches per epoch,
    or once per epoch with both counts in epochs.
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int, total_steps: int, last_epoch: int = -1
    ) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"need 0 <= warmup_steps < total_steps, got warmup_steps={warmup_steps}, "
                f"total_steps={total_steps}"
            )
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        return max(0.0, (self.total_steps - step) / (self.total_steps - self.warmup_steps))
