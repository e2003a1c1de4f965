"""The training loop of a population: N members trained as one vectorised program.

Every step gathers each member's own minibatch from in-memory training tensors (its own data
order), computes all members' losses with one ``vmap``'d forward, and back-propagates their
SUM, so member k's gradient is exactly the gradient of its own loss; one elementwise optimizer
over the stacked parameters then gives member k its sequential update. Pure torch: no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lmc.population.pruning import PopulationPruning
from lmc.population.vectorize import Stacked, population_forward, population_losses

Loss = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Population:
    """N members of ``net``'s architecture: stacked parameters and buffers, and the loss.

    Args:
        net: one member (its weights are not used; only its structure and mode).
        params: stacked parameters, each (N, ...).
        buffers: stacked buffers, each (N, ...).
        loss: a member's loss of (outputs, targets) on one batch.
        pruning: the members' pruning masks, applied in every forward (``None``: dense).
    """

    net: nn.Module
    params: Stacked
    buffers: Stacked
    loss: Loss
    pruning: PopulationPruning | None = None
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(next(iter(self.params.values())))

    def computing(self) -> Stacked:
        """The parameters the members compute with (pruned weights masked)."""
        return self.params if self.pruning is None else self.pruning.effective(self.params)

    def losses(self, x: Tensor, y: Tensor) -> Tensor:
        """Each member's loss on its own batch ``x[k], y[k]``, shape (N,)."""
        out = population_forward(self.net, self.computing(), self.buffers, x)
        return population_losses(self.loss, out, y)

    @torch.inference_mode()
    def evaluate(
        self, batches: Iterable[Any], device: torch.device, update: Callable[[Tensor, Tensor], None]
    ) -> None:
        """Run every member on each (shared) batch in eval mode; ``update(outputs (N, B, ...),
        targets (B, ...))`` accumulates the caller's metrics."""
        was_training = self.net.training
        self.net.eval()
        params = self.computing()
        try:
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                update(population_forward(self.net, params, self.buffers, x, True), y)
        finally:
            self.net.train(was_training)


def train_population(
    population: Population,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    interval: Literal["epoch", "step"],
    x: Tensor,
    y: Tensor,
    orders: Callable[[int], Tensor],
    epochs: int,
    batch_size: int,
    on_epoch_end: Callable[[int, int, Tensor], None] | None = None,
    on_epoch_start: Callable[[int], None] | None = None,
) -> int:
    """Train all members for ``epochs`` epochs; returns the number of optimizer steps.

    Args:
        population: the members.
        optimizer: an elementwise optimizer over ``population.params`` (in ``net``'s order).
        scheduler: LR scheduler of ``optimizer``, stepped every ``interval``, or ``None``.
        interval: ``epoch`` (before ``on_epoch_end``: Lightning's epoch-end checkpoints hold
            the stepped scheduler) or ``step``.
        x: all training inputs, on the training device.
        y: all training targets.
        orders: epoch -> (N, n) index tensor: member k's sample order of that epoch.
        epochs: number of epochs.
        batch_size: samples per step; the last batch of an epoch is smaller (no drop_last).
        on_epoch_end: called with (epoch, optimizer steps so far, each member's mean training
            loss of the epoch) after the epoch's last step.
        on_epoch_start: called with the epoch before its first step (where a pruning
            callback prunes).
    """
    population.net.train()
    step = 0
    for epoch in range(epochs):
        if on_epoch_start is not None:
            on_epoch_start(epoch)
        order = orders(epoch).to(x.device)
        total = torch.zeros(population.size, device=x.device)
        for idx in order.split(batch_size, dim=1):
            losses = population.losses(x[idx], y[idx])
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            optimizer.step()
            step += 1
            if scheduler is not None and interval == "step":
                scheduler.step()
            total += losses.detach() * idx.shape[1]
        if scheduler is not None and interval == "epoch":
            scheduler.step()
        if on_epoch_end is not None:
            on_epoch_end(epoch, step, total / order.shape[1])
    return step
