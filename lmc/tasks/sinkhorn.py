"""``lmc fit`` task for Sinkhorn re-basin of two checkpoints (Peña et al. 2023; SPEC C7).

Thin glue around :class:`lmc.merging.SinkhornRebasin`: the logits are this module's parameters,
the optimizer comes from the config, every training step evaluates the midpoint (or random-alpha)
loss of the relaxed mixture at the annealed temperature; when training ends the hard permutation
is evaluated with the baselines and logged like every merge (``summary.json``, ``merge.png``,
``permutations.pt``, W&B).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from lmc.evaluation import batch_loss
from lmc.io import save_net_checkpoint
from lmc.merging import (
    MERGE_METHODS,
    Baseline,
    Merged,
    MergeSweep,
    SinkhornRebasin,
    merge_sweep,
    sinkhorn_optimizer,
    temperature,
)
from lmc.options import as_options
from lmc.permutation import apply_permutation, identity_permutation
from lmc.tasks.base import LMCTask, SpecSource, save_task_hparams
from lmc.tasks.merge import MergeReporter, load_models
from lmc.tasks.options import MergeEvaluationOptions, SinkhornOptions, moved_into


class SinkhornTask(LMCTask):
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
        search: ``tau_start``/``tau_end`` (temperature at the first and the last step),
            ``sinkhorn_iters``, ``mixing`` (``midpoint`` or ``dirichlet``), ``init``
            (``identity`` or ``weight_matching``) and ``init_scale``
            (:class:`~lmc.tasks.options.SinkhornOptions`).
        baselines: registered merge methods evaluated alongside (``naive``, ``wm_ref``, ...).
        evaluation: as in :class:`~lmc.tasks.MergeTask`, ``pairwise: false`` by default.
        save_matched: write pi(B) as ``matched.ckpt`` into the run directory.
        seed: seed of alpha, the weight-matching init and the sharpness probes.
        spec: the permutation spec source (``auto``, ``builtin`` or ``package.module:function``).
    """

    moved_keys: ClassVar[dict[str, str]] = {
        **moved_into("search", SinkhornOptions),
        **moved_into("evaluation", MergeEvaluationOptions),
    }

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        optimizer: OptimizerCallable = sinkhorn_optimizer,
        search: SinkhornOptions | None = None,
        baselines: list[Baseline] | None = None,
        evaluation: MergeEvaluationOptions | None = None,
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
        opts = as_options(SinkhornOptions, search)
        temperature(0, 2, opts.tau_start, opts.tau_end)  # validates the temperatures
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
            init=opts.init,
            init_scale=opts.init_scale,
            sinkhorn_iters=opts.sinkhorn_iters,
            mixing=opts.mixing,
            seed=seed,
            names=files,
        )
        self.optimizer = optimizer
        self.tau_start, self.tau_end = opts.tau_start, opts.tau_end
        self.baselines = list(baselines) if baselines is not None else ["naive", "wm_ref"]
        self.save_matched, self.seed, self.init = save_matched, seed, opts.init
        evaluation = as_options(
            MergeEvaluationOptions, evaluation, MergeEvaluationOptions(pairwise=False)
        )
        self.reporter = MergeReporter(evaluation, seed)
        self.sweep: MergeSweep | None = None

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
        loss = self.search.loss(x, y, tau, loss=self.loss_name)
        self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=True)
        self.log("train/tau", tau, on_step=True, on_epoch=False)
        return loss

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.search(x, 0.5, self.tau)
        self.log("val/loss", batch_loss(out, y, self.loss_name) / y.shape[0])
        if self.loss_name == "cross_entropy":
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
