"""Magnitude pruning of every member of a population, as ``callbacks.MagnitudePruning`` prunes
its sequential run (000 §4.3, A.1.2, A.3).

The sequential callback registers ``weight = weight_orig * weight_mask`` on each pruned layer:
the optimizer keeps updating ``weight_orig`` (the same parameter), and the forward sees the
masked weight. Here the stacked parameters play ``weight_orig``, and each pruned layer's
stacked mask (one slice per member) multiplies it in the forward, so member k computes,
back-propagates and steps exactly as its sequential twin. Member k's mask is the twin's: the
same :func:`~lmc.pruning.magnitude.magnitude_mask` of its own effective weights, at the same
epochs (the schedule's :class:`~lmc.pruning.schedule.PruneEvent` list). A rewind (lottery
ticket) restores the members' initial weights, and it or ``reset_optimizer`` clears the
optimizer's state, as the callback does; ``finetune_lr`` sets every group's learning rate.
Checkpoints hold the folded weight (``orig * mask``), as the callback's do.

The callback is read, not run: its settings (``events``, ``layers``, ``reset_optimizer``,
``finetune_lr``) and its ``rate``, which this sets so that the callback's own per-epoch log
(``prune/rate``, ``prune/sparsity/<layer>``) reads the right value for each member.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmc.metrics.layers import weight_layers
from lmc.pruning.magnitude import magnitude_mask
from lmc.pruning.schedule import PruneEvent

Stacked = dict[str, Tensor]

#: the callback's class, as a config names it (and by its module path)
PRUNING_CALLBACK = "callbacks.MagnitudePruning"
PRUNING_CALLBACK_PATHS = (PRUNING_CALLBACK, "callbacks.pruning.MagnitudePruning")


def is_pruning_callback(callback: Any) -> bool:
    """Whether ``callback`` is a ``callbacks.MagnitudePruning`` (by class, without importing
    the ``callbacks`` package, which sits outside ``lmc``)."""
    cls = type(callback)
    return f"{cls.__module__}.{cls.__qualname__}" in PRUNING_CALLBACK_PATHS


class PopulationPruning:
    """The masks of every member and the schedule that grows them.

    Args:
        callback: the run's ``callbacks.MagnitudePruning`` (its settings are used; its
            ``rate`` is kept current for its log).
        net: one member's network (for the layer names).
        params: the population's stacked parameters (``weight_orig`` of every member).
        buffers: its stacked buffers (a rewind restores BatchNorm's statistics too, as the
            callback's does).
    """

    def __init__(self, callback: Any, net: nn.Module, params: Stacked, buffers: Stacked) -> None:
        self.callback = callback
        self.events: list[PruneEvent] = list(callback.events)
        layers = weight_layers(net, callback.layers)  # KeyError names the available layers
        self.keys = {name: f"{name}.weight" for name in layers}
        missing = [k for k in self.keys.values() if k not in params]
        if missing:
            raise ValueError(f"pruned layers {missing} are not parameters of the population")
        self.masks: Stacked = {}
        self.init: Stacked | None = None
        if callback.strategy == "lottery_ticket":  # the callback's snapshot at fit start
            self.init = {n: t.detach().clone() for n, t in {**params, **buffers}.items()}

    @property
    def rate(self) -> float:
        """The rate pruned to so far: the callback's own, which its log reads."""
        return float(self.callback.rate)

    def due(self, epoch: int) -> list[PruneEvent]:
        """The events at the start of ``epoch``."""
        return [e for e in self.events if e.epoch == epoch]

    def pending_final(self) -> bool:
        """Whether the schedule's last event prunes after the last step (``only_prune``) and
        has not yet."""
        return self.events[-1].epoch is None and self.rate < self.events[-1].rate

    @torch.no_grad()
    def prune(
        self,
        event: PruneEvent,
        params: Stacked,
        buffers: Stacked,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Every member's layers to ``event.rate``, each from its own effective weights."""
        for key in self.keys.values():
            weight = params[key]
            old = self.masks.get(key)
            effective = weight * old if old is not None else weight
            self.masks[key] = torch.stack(
                [
                    magnitude_mask(effective[k], event.rate, None if old is None else old[k])
                    for k in range(len(weight))
                ]
            )
        self.callback.rate = event.rate
        if event.rewind:
            assert self.init is not None, "the lottery-ticket init is taken at the start"
            for name, value in self.init.items():
                (params[name] if name in params else buffers[name]).copy_(value)
        if event.rewind or self.callback.reset_optimizer:
            optimizer.state.clear()
        if self.callback.finetune_lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.callback.finetune_lr

    def effective(self, params: Stacked) -> Stacked:
        """The parameters the members compute with: each pruned weight times its mask
        (differentiable in the weight, as ``weight_orig * weight_mask`` is)."""
        if not self.masks:
            return params
        return {n: p * self.masks[n] if n in self.masks else p for n, p in params.items()}

    def member_state(self, k: int) -> dict[str, Any]:
        """The callback's checkpoint state of member ``k`` (its masks by layer name)."""
        masks = {name: self.masks[key][k].detach().bool().cpu() for name, key in self.keys.items()}
        init = None
        if self.init is not None:
            init = {n: v[k].detach().cpu().clone() for n, v in self.init.items()}
        return {"rate": self.rate, "masks": masks if self.masks else {}, "init": init}
