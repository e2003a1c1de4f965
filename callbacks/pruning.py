"""Magnitude pruning strategies inside one ``lmc fit`` (000 §4.3, A.1.2, A.3)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from callbacks._utils import is_last_batch, log_metrics, network
from lmc.pruning.magnitude import (
    apply_masks,
    dense_snapshot,
    fold_masks,
    layer_sparsity,
    make_permanent,
    prune_magnitude,
    rewind,
)
from lmc.pruning.schedule import PruneEvent, RateSchedule, Strategy, pruning_events


class MagnitudePruning(L.Callback):
    """Local unstructured magnitude pruning (same rate per layer) on ``torch.nn.utils.prune``.

    Dense training runs until ``prune_epoch``; at the start of each pruning epoch the selected
    layers are pruned to the next rate of the schedule (see :mod:`lmc.pruning.schedule`), and
    training continues with the masks fixed (fine-tuning with the config's optimizer, i.e. the
    training hyper-parameters as in 000 A.1.2). ``lottery_ticket`` also rewinds every weight to
    the copy taken at fit start and resets the optimizer state. ``only_prune`` prunes right after
    the last optimizer step (end of ``max_epochs`` or ``max_steps``), so the final validation,
    the last checkpoint and ``test_after_fit`` see the pruned model.

    Checkpoints always hold the dense keys (pruned layers serialise as ``weight = weight_orig *
    weight_mask``, also with ``save_weights_only``), so they load into an unpruned model; the
    masks (and the lottery-ticket init) travel in this callback's state and are re-applied when a
    run resumes. With ``permanent_at_end`` the masks are folded into plain parameters when
    training ends, ready for matching and merging. Logs ``prune/rate`` and
    ``prune/sparsity/<layer>`` after every epoch.

    Args:
        strategy: ``only_prune``, ``lottery_ticket``, ``finetune_once`` or ``iterative``.
        rate: target fraction of every layer's weights pruned at the end.
        prune_epoch: epoch at whose start the first pruning happens.
        rounds: pruning rounds (``iterative`` >= 2; ``lottery_ticket`` any).
        every_n_epochs: epochs between rounds.
        schedule: ``geometric`` or ``linear`` growth of the rate over rounds.
        layers: layer names to prune (default every Linear/Conv layer of ``pl_module.net``).
        reset_optimizer: clear the optimizer state (e.g. Adam moments) at every pruning.
        finetune_lr: if set, the learning rate of every param group after pruning (an LR
            scheduler, if any, keeps stepping from its own state).
        permanent_at_end: make the masks permanent when training ends.
    """

    def __init__(
        self,
        strategy: Strategy = "finetune_once",
        rate: float = 0.5,
        prune_epoch: int = 0,
        rounds: int = 1,
        every_n_epochs: int = 1,
        schedule: RateSchedule = "geometric",
        layers: list[str] | None = None,
        reset_optimizer: bool = False,
        finetune_lr: float | None = None,
        permanent_at_end: bool = True,
    ) -> None:
        self.strategy = strategy
        self.events = pruning_events(strategy, rate, prune_epoch, rounds, every_n_epochs, schedule)
        self.layers = layers
        self.reset_optimizer = reset_optimizer
        self.finetune_lr = finetune_lr
        self.permanent_at_end = permanent_at_end
        self.rate = 0.0
        self._masks: dict[str, Tensor] = {}
        self._init: dict[str, Tensor] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        net = network(pl_module)
        epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        late = [e.epoch for e in self.events if e.epoch is not None and 0 <= epochs <= e.epoch]
        if late:
            rank_zero_warn(
                f"MagnitudePruning: pruning epochs {late} >= max_epochs={trainer.max_epochs} "
                "never run; raise trainer.max_epochs or lower prune_epoch"
            )
        if self._masks:  # resumed: the checkpoint holds dense weights, the masks live here
            apply_masks(net, self._masks)
        if self.strategy == "lottery_ticket" and self._init is None:
            self._init = dense_snapshot(net)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for event in self.events:
            if event.epoch == trainer.current_epoch:
                self._prune(trainer, pl_module, event)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._pending_final() and is_last_batch(trainer, batch_idx):
            self._prune(trainer, pl_module, self.events[-1])  # before the final validation

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending_final():  # stopped early, or no max_epochs/max_steps to see the end by
            self._prune(trainer, pl_module, self.events[-1])
            self._log(trainer, pl_module)
        if self.permanent_at_end:
            make_permanent(network(pl_module))

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["state_dict"] = fold_masks(checkpoint["state_dict"])

    def state_dict(self) -> dict[str, Any]:
        masks = {k: v.detach().bool().cpu() for k, v in self._masks.items()}
        return {"rate": self.rate, "masks": masks, "init": self._init}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rate = state_dict["rate"]
        self._masks = state_dict["masks"]
        self._init = state_dict["init"]

    def _pending_final(self) -> bool:
        return self.events[-1].epoch is None and self.rate < self.events[-1].rate

    def _prune(self, trainer: L.Trainer, pl_module: L.LightningModule, event: PruneEvent) -> None:
        net = network(pl_module)
        self._masks = prune_magnitude(net, event.rate, self.layers)
        self.rate = event.rate
        if event.rewind:
            assert self._init is not None, "the lottery-ticket init is taken in on_fit_start"
            rewind(net, self._init)
        for opt in trainer.optimizers:
            if event.rewind or self.reset_optimizer:
                opt.state.clear()
            if self.finetune_lr is not None:
                for group in opt.param_groups:
                    group["lr"] = self.finetune_lr

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sparsity = layer_sparsity(network(pl_module), self.layers)
        metrics = {f"prune/sparsity/{n}": s for n, s in sparsity.items()}
        log_metrics(trainer, {"prune/rate": self.rate, **metrics})
