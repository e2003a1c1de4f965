"""``lmc fit`` task for Sinkhorn re-basin of two checkpoints (Peña et al. 2023; SPEC C7).

Thin glue around :class:`lmc.merging.SinkhornRebasin`: the logits are this module's parameters,
the optimizer comes from the config, every training step evaluates the midpoint (or random-alpha)
loss of the relaxed mixture at the annealed temperature; when training ends the hard permutation
is evaluated with the baselines and logged like every merge (``summary.json``, ``merge.png``,
``permutations.pt``, W&B).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from lmc.evaluation import LossName, batch_loss
from lmc.io import save_net_checkpoint
from lmc.merging import (
    MERGE_METHODS,
    Baseline,
    Merged,
    MergeSweep,
    Mixing,
    SinkhornRebasin,
    merge_sweep,
    sinkhorn_optimizer,
    temperature,
)
from lmc.merging.sinkhorn import Init
from lmc.permutation import apply_permutation, identity_permutation
from lmc.tasks.base import SpecSource, Split, default_loss, save_task_hparams
from lmc.tasks.merge import MergeReporter, load_models


class SinkhornTask(L.LightningModule):
    """Sinkhorn re-basin of model B (``checkpoints[1]``) onto model A, trained with ``lmc fit``.

    One matrix of logits per permutation group; each step the loss of
    ``(1 - alpha) theta_A + alpha S(theta_B)`` with ``S = sinkhorn(logits / tau)`` trains the
    logits, the temperature annealed geometrically from ``tau_start`` to ``tau_end`` over the
    run's optimizer steps. When training ends the hard permutation (Hungarian rounding of the
    logits) is evaluated as method ``sinkhorn`` beside the ``baselines`` (merged = midpoint of A
    and pi(B), BatchNorm reset on the alignment subset), written and logged as for
    :class:`~lmc.tasks.STETask`. Validation logs the relaxed midpoint's loss.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: exactly two ``.ckpt`` files or run folders, model A then model B.
        optimizer: builds the optimizer from the logits (default Adam, lr 0.1).
        tau_start, tau_end: temperature at the first and the last step.
        sinkhorn_iters: log-domain Sinkhorn iterations per relaxation.
        mixing: ``midpoint`` (alpha = 1/2) or ``dirichlet`` (alpha ~ U(0, 1)).
        init: the logits' start: ``identity`` or ``weight_matching``.
        init_scale: the logits start at this times the initial permutation matrix.
        baselines: merge methods evaluated alongside (``naive``, ``wm_ref``, ...).
        splits, max_batches, pairwise, sharpness_probes, sharpness_batches: evaluation, as in
            :class:`~lmc.tasks.MergeTask`.
        save_matched: write pi(B) as ``matched.ckpt`` into the run directory.
        seed: seed of alpha, the weight-matching init and the sharpness probes.
        spec: the permutation spec source (``auto``, ``builtin`` or ``package.module:function``).
    """

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        optimizer: OptimizerCallable = sinkhorn_optimizer,
        tau_start: float = 1.0,
        tau_end: float = 0.01,
        sinkhorn_iters: int = 20,
        mixing: Mixing = "midpoint",
        init: Init = "identity",
        init_scale: float = 1.0,
        baselines: list[Baseline] | None = None,
        splits: list[Split] | None = None,
        max_batches: int | None = None,
        pairwise: bool = False,
        sharpness_probes: int = 0,
        sharpness_batches: int = 1,
        save_matched: bool = True,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net", "optimizer"])
        if len(checkpoints) != 2:
            raise ValueError(
                f"SinkhornTask aligns exactly 2 checkpoints (model A, model B), got "
                f"{len(checkpoints)}; use MergeTask with methods [ccmm, mergemany] for more"
            )
        for b in baselines or []:
            MERGE_METHODS.check(b, "model.init_args.baselines")
        temperature(0, 2, tau_start, tau_end)  # validates the temperatures
        source = SpecSource(spec, net)
        self.spec = source.require(type(self).__name__)
        files, states, _ = load_models(net, checkpoints, None, 0, source)
        object.__setattr__(self, "_net", net)
        object.__setattr__(self, "_states", states)
        self.checkpoints = files
        self.search = SinkhornRebasin(
            net,
            states[0],
            states[1],
            self.spec,
            init=init,
            init_scale=init_scale,
            sinkhorn_iters=sinkhorn_iters,
            mixing=mixing,
            seed=seed,
            names=files,
        )
        self.optimizer = optimizer
        self.tau_start, self.tau_end = tau_start, tau_end
        self.baselines = list(baselines) if baselines is not None else ["naive", "wm_ref"]
        self.save_matched, self.seed, self.init = save_matched, seed, init
        self.reporter = MergeReporter(
            splits, max_batches, pairwise, sharpness_probes, sharpness_batches, seed
        )
        self.sweep: MergeSweep | None = None

    @property
    def _loss(self) -> LossName:
        return default_loss(self.trainer.datamodule)

    @property
    def tau(self) -> float:
        """The temperature of the current optimizer step."""
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        return temperature(self.global_step, total, self.tau_start, self.tau_end)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer(self.search.parameters())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        tau = self.tau
        loss = self.search.loss(x, y, tau, loss=self._loss)
        self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=True)
        self.log("train/tau", tau, on_step=True, on_epoch=False)
        return loss

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.search(x, 0.5, self.tau)
        self.log("val/loss", batch_loss(out, y, self._loss) / y.shape[0])
        if self._loss == "cross_entropy":
            self.log("val/acc", (out.argmax(1) == y).float().mean())

    def on_train_end(self) -> None:
        sizes = self.spec.sizes(self._states[0])
        perm = {g: p.cpu() for g, p in self.search.permutation().items()}
        merges = {
            "sinkhorn": {
                2: Merged.from_perms(self._states, self.spec, [identity_permutation(sizes), perm])
            }
        }
        inputs = self.reporter.inputs(self, self._net, self._states, self.spec, seed=self.seed)
        for b in self.baselines:
            merges[b] = merge_sweep(inputs, b, [2])
        extra = {
            "checkpoints": self.checkpoints,
            "tau": [self.tau_start, self.tau_end],
            "init": self.init,
        }
        self.sweep, out = self.reporter.run(self, self._net, self._states, self.spec, merges, extra)
        if self.trainer.is_global_zero and self.save_matched:
            matched = apply_permutation(self._states[1], self.spec, perm)
            save_net_checkpoint(matched, out / "matched.ckpt")
