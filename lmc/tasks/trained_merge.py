"""``lmc fit`` task for the merge methods that train (STE-MM, STE, Sinkhorn re-basin; SPEC C6, C7).

Thin glue around a :class:`~lmc.merging.MergeSearch`: the trained method named in ``methods``
builds one search per n of the sweep (its parameters are this module's, so Lightning logs,
checkpoints and resumes it), every training step sums their losses, and when training ends
each search's result is evaluated beside the other methods named, at the same n, and logged
as every merge is (``summary.json``, ``merge.png``, ``permutations.pt``, W&B).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from lmc.evaluation import batch_loss
from lmc.merging import MERGE_METHODS, Merged, MergeInputs, MergeSweep, ModelBank, merge_sweep
from lmc.merging.search import MergeSearch, Progress, adam, build_search
from lmc.permutation.weight_matching import Method
from lmc.tasks.base import LMCTask, SpecSource, save_task_hparams
from lmc.tasks.merge import MergeArgs
from lmc.tasks.options import MergeEvaluationOptions, moved_into


class TrainedMergeTask(MergeArgs, LMCTask):
    """Merge checkpoints with a method that trains, run with ``lmc fit``.

    ``methods`` names exactly one method that trains (``stemm``: STE-MM, 004 Alg. 1; ``ste``:
    STE for two models, Ainsworth et al. 2023; ``sinkhorn``: Sinkhorn re-basin, Peña et al.
    2023; or one registered in user code with ``trains=True``) and any methods to compare with
    it. For every n in ``num_models`` the trained method searches independently over the first
    n checkpoints (a sweep over n in one run, seeded ``seed + n``); all searches see the same
    batches and share one optimizer (with an element-wise optimizer such as Adam they do not
    interact). BatchNorm uses batch statistics during the search.

    When training ends: each search's result, the other methods at the same n, and for every
    method and n the merged model's loss/accuracy against the originals, the average pairwise
    merged loss (004 Fig. 4), distance ratios and triplet angles (§6.1) and, with
    ``sharpness_probes > 0``, sharpness (§6.2) -- BatchNorm re-estimated on the alignment
    subset -- logged as :class:`~lmc.tasks.MergeTask` logs them. Validation (if the data
    module has a validation split) logs each search's current merge, ``val/loss_n{n}``.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: 2 or more ``.ckpt`` files or run folders of that architecture.
        methods: one merge method that trains and the methods to compare with it.
        method_options: per method, its keyword options (e.g. ``{stemm: {mixing: uniform}}``),
            checked against the method's signature before any work.
        num_models: the numbers of models n to merge (each the first n checkpoints); default
            all of them.
        optimizer: builds the optimizer from the searches' parameters (default Adam at the
            method's learning rate: 1e-3 for STE-MM and STE, 004 App. B.2; 0.1 for Sinkhorn).
        reference: index of the fixed model (STE-MM's theta_n, STE's model A, Sinkhorn's
            target, ``wm_ref``'s target).
        evaluation: as in :class:`~lmc.tasks.MergeTask`.
        wm_method: weight-matching variant of every method that weight-matches (STE-MM's
            search: ``accelerated``, warm-started from the previous permutation and LAP duals,
            004 §4.2, or ``plain``).
        save_merged: also write every merged model as ``merged_{method}_n{n}.ckpt``.
        seed: seed of the searches (``seed + n``), the matching's group order and the
            sharpness probes.
        spec: the permutation spec source: ``auto``, ``builtin`` or ``package.module:function``
            (:mod:`lmc.permutation.source`); the searches are built with the task, so a spec
            derived from data is refused with a message (use a function).
    """

    moved_keys: ClassVar[dict[str, str]] = moved_into("evaluation", MergeEvaluationOptions)
    #: how many of ``methods`` train (the study pre-check reads it)
    trained_methods: ClassVar[int] = 1
    _states: list[dict[str, Tensor]]  # held by the bank, not a submodule

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        methods: list[str],
        method_options: dict[str, dict[str, Any]] | None = None,
        num_models: list[int] | None = None,
        optimizer: OptimizerCallable | None = None,
        reference: int = 0,
        evaluation: MergeEvaluationOptions | None = None,
        wm_method: Method = "accelerated",
        save_merged: bool = False,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net", "optimizer"])
        source = SpecSource(spec, net)
        self.spec = source.require(type(self).__name__)
        states = self.read_merge_args(
            net, checkpoints, methods, method_options, num_models, reference, evaluation,
            wm_method, seed, source,
        )  # fmt: skip
        object.__setattr__(self, "_states", states)  # the models are the bank's buffers
        self.method = next(m for m in methods if MERGE_METHODS.entry(m).trains)
        self.others = [m for m in methods if m != self.method]
        self.bank = ModelBank(states[: self.num_models[-1]])
        inputs = MergeInputs(
            [self.bank.state(i) for i in range(len(self.bank))],
            self.spec,
            net=net,
            reference=reference,
            wm_method=wm_method,
            bank=self.bank,
        )
        options = self.method_options.get(self.method)
        searches = {}
        for n in self.num_models:
            search = build_search(replace(inputs.first(n), seed=seed + n), self.method, options)
            if not isinstance(search, MergeSearch):
                raise TypeError(
                    f"merge method {self.method!r} is registered as trained but returned "
                    f"{type(search).__name__}, not a lmc.merging.MergeSearch"
                )
            searches[f"n{n}"] = search
        self.searches = nn.ModuleDict(searches)
        self.optimizer = optimizer
        self.save_merged = save_merged
        self.sweep: MergeSweep | None = None
        self._epoch_start = 0.0
        self._total_steps = 1  # the run's optimizer steps (the searches' schedules), at fit start
        self._timers_at_epoch_start: dict[str, float] = {}

    def _searches(self) -> list[tuple[str, MergeSearch]]:
        return [(name, s) for name, s in self.searches.items() if isinstance(s, MergeSearch)]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = self.searches.parameters()
        if self.optimizer is None:
            lr = type(self._searches()[0][1]).lr
            return adam(lr)(params)
        return self.optimizer(params)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        progress = Progress(self.global_step, self._total_steps)
        losses = []
        for name, search in self._searches():
            loss = search.step_loss(x, y, self.loss_name, progress)
            self.log(f"train/loss_{name}", loss.detach(), on_step=True, on_epoch=True)
            for key, logged in search.step_logs().items():
                self.log(f"train/{key}_{name}", logged, on_step=True, on_epoch=False)
            losses.append(loss)
        value = losses[0]
        for loss in losses[1:]:
            value = value + loss
        self.log("train/loss", value.detach(), prog_bar=True)
        return value

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        for name, search in self._searches():
            out = search.output(x)
            if out is None:
                continue
            self.log(f"val/loss_{name}", batch_loss(out, y, self.loss_name) / y.shape[0])
            if self.loss_name == "cross_entropy":
                self.log(f"val/acc_{name}", (out.argmax(1) == y).float().mean())

    def _timers(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for _, search in self._searches():
            for key, value in search.timers().items():
                total[key] = total.get(key, 0.0) + value
        return total

    def on_train_start(self) -> None:
        # once: Lightning recomputes estimated_stepping_batches on every read
        self._total_steps = max(int(self.trainer.estimated_stepping_batches), 1)

    def on_train_epoch_start(self) -> None:
        self._epoch_start = time.perf_counter()
        self._timers_at_epoch_start = self._timers()

    def on_train_epoch_end(self) -> None:
        self.log("train/epoch_seconds", time.perf_counter() - self._epoch_start)
        for key, value in self._timers().items():
            self.log(f"train/{key}", value - self._timers_at_epoch_start.get(key, 0.0))

    def on_train_end(self) -> None:
        merges: dict[str, dict[int, Merged]] = {
            self.method: {s.n: s.result() for _, s in self._searches()}
        }
        inputs = self.reporter.inputs(
            self,
            self._net,
            self._states,
            self.spec,
            reference=self.reference,
            seed=self.seed,
            wm_method=self.wm_method,
        )
        for m in self.others:
            merges[m] = merge_sweep(inputs, m, self.num_models, self.method_options.get(m))
        extra = {
            "checkpoints": self.checkpoints,
            "wm_method": self.wm_method,
            "timers": {name: s.timers() for name, s in self._searches()},
        }
        self.sweep, out = self.reporter.run(self, self._net, self._states, self.spec, merges, extra)
        if self.save_merged:
            self.reporter.save(self, self._net, merges, out)
