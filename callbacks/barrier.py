"""Barrier between the model being trained and reference checkpoints (SPEC C4, C5).

Watches linear mode connectivity emerge during training (000 §4; Frankle et al.'s stability
analysis): at chosen epochs the current network is interpolated with each reference, naive and
after matching the reference to it, on a fixed slice of the validation split.
"""

from __future__ import annotations

import copy

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from callbacks._utils import log_metrics, network
from lmc.engine.seam import datamodule_of
from lmc.evaluation import LossName, has_batchnorm
from lmc.interpolation import alpha_grid, cache_batches, check_definition, interpolate_path
from lmc.interpolation.barrier import BarrierDefinition
from lmc.interpolation.states import check_compatible
from lmc.interpolation.study import Matcher, Repair, match_states
from lmc.io import load_endpoints
from lmc.permutation import MATCHERS, check_spec_source, resolve_spec
from lmc.permutation.spec import PermutationSpec


class BarrierMonitor(Callback):
    """Log ``barrier/{i}/loss_naive``, ``loss_matched``, ``acc_*`` against reference ``i``.

    Args:
        checkpoints: reference ``.ckpt`` files or run folders of the same architecture (read
            when fit starts; non-finite weights refused).
        epochs: epochs (0-based, after the epoch's training) to measure at; ``None`` = every
            ``every_n_epochs``.
        every_n_epochs: cadence when ``epochs`` is not given.
        matcher: how references are aligned to the current model, a name registered in
            :data:`lmc.permutation.MATCHERS` (``none`` skips matching).
        num_alphas: points of the alpha grid.
        max_batches: validation batches used (cached once).
        loss: ``cross_entropy`` or ``mse``; default from the data module's task.
        spec: the permutation spec source (``auto``, ``builtin``, ``derive`` or
            ``package.module:function``; see :mod:`lmc.permutation.source`).
        barrier: ``chord`` (the largest rise above the chord between the endpoints) or
            ``abs_chord`` (the largest distance from it, 000 Def. 2.1); see
            :mod:`lmc.interpolation.barrier`.
    """

    def __init__(
        self,
        checkpoints: list[str],
        epochs: list[int] | None = None,
        every_n_epochs: int = 1,
        matcher: Matcher = "weight",
        num_alphas: int = 11,
        max_batches: int | None = 4,
        loss: LossName | None = None,
        spec: str = "auto",
        barrier: BarrierDefinition = "chord",
    ) -> None:
        MATCHERS.check(matcher, "matcher")
        self.barrier = check_definition(barrier, "BarrierMonitor barrier")
        self.spec_source = check_spec_source(spec, "spec")
        self.paths, self.epochs, self.every = list(checkpoints), epochs, every_n_epochs
        self.matcher, self.num_alphas, self.max_batches, self.loss = (
            matcher,
            num_alphas,
            max_batches,
            loss,
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        net = network(pl_module)
        self.paths, self.refs = load_endpoints(self.paths, None, "BarrierMonitor checkpoints")
        check_compatible([net.state_dict(), *self.refs], ["the trained model", *self.paths])
        self.work = copy.deepcopy(net)  # one scratch copy for all evaluations
        self.batches: list[tuple[Tensor, Tensor]] | None = None
        self.spec: PermutationSpec | None = None

    def _due(self, trainer: L.Trainer) -> bool:
        if self.epochs is not None:
            return trainer.current_epoch in self.epochs
        return (trainer.current_epoch + 1) % self.every == 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._due(trainer) or trainer.sanity_checking:
            return
        dm = datamodule_of(trainer)
        if self.batches is None:
            batches = cache_batches(dm.val_dataloader(), pl_module.device)
            self.batches = batches[: self.max_batches] if self.max_batches else batches
        loss = self.loss or ("mse" if getattr(dm, "task", "") == "regression" else "cross_entropy")
        repair: Repair = "reset_bn" if has_batchnorm(self.work) else "none"
        align = self.batches if repair != "none" else None
        if self.spec is None and self.matcher != "none":
            self.spec = resolve_spec(self.spec_source, self.work, self.batches[0][0][:2])
        current = {k: v.detach().clone() for k, v in network(pl_module).state_dict().items()}
        was_training = pl_module.training
        metrics: dict[str, float] = {}
        for i, ref in enumerate(self.refs):
            ref = {k: v.to(pl_module.device) for k, v in ref.items()}
            variants = {"naive": ref}
            if self.matcher != "none":
                (_, matched), _ = match_states(
                    self.work, [current, ref], self.matcher, align or self.batches, spec=self.spec
                )
                variants["matched"] = matched
            for name, other in variants.items():
                path, _ = interpolate_path(
                    self.work,
                    current,
                    other,
                    {"val": self.batches},
                    alpha_grid(self.num_alphas),
                    loss,
                    repair,
                    align,
                    barrier_definition=self.barrier,
                )
                b = path.barriers["val"]
                metrics[f"barrier/{i}/loss_{name}"] = b["loss"]
                if loss == "cross_entropy":
                    metrics[f"barrier/{i}/acc_{name}"] = b["acc"]
        pl_module.train(was_training)
        log_metrics(trainer, metrics)
