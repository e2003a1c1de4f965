"""``lmc fit`` tasks: STE-MM over n checkpoints (004 §4.1, Alg. 1) and STE for two (004 §2.3).

Thin glue around :class:`lmc.merging.STEMM`: the proxies are this module's parameters, the
optimizer comes from the config, every training step runs the warm-started weight matching of
each model to its proxy and the straight-through loss; when training ends the final matching
gives the permutations, which are evaluated with the baselines and logged (SPEC C6, C4).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from lmc.evaluation import batch_loss
from lmc.io import save_net_checkpoint
from lmc.merging import (
    MERGE_METHODS,
    STEMM,
    Baseline,
    Merged,
    MergeSweep,
    ModelBank,
    merge_sweep,
)
from lmc.optim import default_optimizer
from lmc.options import as_options
from lmc.tasks.base import LMCTask, SpecSource, save_task_hparams
from lmc.tasks.merge import MergeReporter, load_models
from lmc.tasks.options import MergeEvaluationOptions, STEOptions, moved_into


class STEMMTask(LMCTask):
    """STE-MM: permutations that put n models in one low-loss basin, trained with ``lmc fit``.

    For every n in ``num_models`` an independent STE-MM search merges the first n checkpoints
    (a sweep over n in one run): n - 1 proxies initialised at the reference checkpoint, each
    step a weight matching of every model to its proxy (``wm_method="accelerated"``: warm
    start from the previous permutation and LAP duals, 004 §4.2; ``"plain"``: from the
    previous permutation only), mixing weights lambda (``mixing``) and the straight-through
    loss of ``sum_i lambda_i pi_i(theta_i)``. All searches see the same batches and share one
    optimizer; with an element-wise optimizer such as Adam (004 App. B.2: lr 1e-3, 10 epochs,
    batch 256) they do not interact (gradient clipping by global norm would couple them).
    BatchNorm uses batch statistics during the search.

    When training ends: the final weight matching of every proxy (Alg. 1 line 12), the
    ``baselines`` at the same n, and for every method and n the merged model's loss/accuracy
    vs the originals, the average pairwise merged loss (004 Fig. 4), distance ratios and
    triplet angles (§6.1) and, with ``sharpness_probes > 0``, sharpness (§6.2) -- BatchNorm
    re-estimated on the alignment subset -- logged to every logger, W&B (table, plots,
    figure) and written as ``summary.json``, ``merge.png`` and ``permutations.pt`` to the run
    directory. Validation (if the data module has a validation split) logs the loss of each
    current merge with uniform weights, batch statistics and the latest permutations.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: 2 or more ``.ckpt`` files or run folders of that architecture.
        num_models: the numbers of models n to merge (each the first n checkpoints); default
            all of them.
        optimizer: builds the optimizer from the proxies (default Adam, lr 1e-3).
        search: ``wm_method`` (``accelerated`` or ``plain`` weight matching during the search),
            ``mixing`` (``dirichlet``, ``uniform`` or ``midpoint``) and ``keep_best``
            (:class:`~lmc.tasks.options.STEOptions`).
        reference: index of the fixed model (theta_n of Alg. 1; any one by Theorem D.1).
        baselines: registered merge methods evaluated alongside (``wm_ref``, ``mergemany``, ...).
        evaluation: as in :class:`~lmc.tasks.MergeTask`.
        save_merged: also write ``merged_n{n}.ckpt`` (the STE-MM merge of each n, BatchNorm
            reset) into the run directory.
        seed: seed of lambda, of the matching's group order and of the sharpness probes.
        spec: the permutation spec source: ``auto``, ``builtin`` or ``package.module:function``
            (:mod:`lmc.permutation.source`); the proxies are built with the task, so a spec
            derived from data is refused with a message (use a function).
    """

    #: the search's defaults (STE for two models: midpoint, keep best) and pairwise merges
    default_search: ClassVar[STEOptions] = STEOptions()
    default_pairwise: ClassVar[bool] = True
    moved_keys: ClassVar[dict[str, str]] = {
        **moved_into("search", STEOptions),
        **moved_into("evaluation", MergeEvaluationOptions),
    }

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        num_models: list[int] | None = None,
        optimizer: OptimizerCallable = default_optimizer,
        search: STEOptions | None = None,
        reference: int = 0,
        baselines: list[Baseline] | None = None,
        evaluation: MergeEvaluationOptions | None = None,
        save_merged: bool = False,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net", "optimizer"])
        for b in baselines or []:
            MERGE_METHODS.check(b, "model.init_args.baselines")
        opts = as_options(STEOptions, search, self.default_search)
        source = SpecSource(spec, net)
        self.spec = source.require(type(self).__name__)
        files, states, self.num_models = load_models(
            net, checkpoints, num_models, reference, source
        )
        object.__setattr__(self, "_net", net)  # a template, not trained or checkpointed
        object.__setattr__(self, "_states", states)
        self.checkpoints = files
        self.bank = ModelBank(states[: self.num_models[-1]])
        self.searches = nn.ModuleDict(
            {
                f"n{n}": STEMM(
                    net,
                    self.bank,
                    self.spec,
                    reference=reference,
                    method=opts.wm_method,
                    mixing=opts.mixing,
                    keep_best=opts.keep_best,
                    seed=seed + n,
                    names=self.checkpoints[:n],
                    num_models=n,
                )
                for n in self.num_models
            }
        )
        self.optimizer = optimizer
        self.baselines = list(baselines) if baselines is not None else ["wm_ref", "mergemany"]
        self.reference, self.wm_method, self.seed = reference, opts.wm_method, seed
        self.save_merged = save_merged
        default = MergeEvaluationOptions(pairwise=self.default_pairwise)
        self.reporter = MergeReporter(as_options(MergeEvaluationOptions, evaluation, default), seed)
        self.sweep: MergeSweep | None = None
        self._epoch_start = 0.0
        self._wm_at_epoch_start = 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer(self.searches.parameters())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        total: Tensor | float = 0.0
        for name, search in self.searches.items():
            loss = search.step_loss(x, y, self.loss_name)
            self.log(f"train/loss_{name}", loss.detach(), on_step=True, on_epoch=True)
            total = total + loss
        self.log("train/loss", total.detach(), prog_bar=True)  # type: ignore[union-attr]
        return total  # type: ignore[return-value]

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        for name, search in self.searches.items():
            out = search(x, [1.0 / search.n] * search.n, ste=False)
            self.log(f"val/loss_{name}", batch_loss(out, y, self.loss_name) / y.shape[0])
            if self.loss_name == "cross_entropy":
                self.log(f"val/acc_{name}", (out.argmax(1) == y).float().mean())

    def on_train_epoch_start(self) -> None:
        self._epoch_start = time.perf_counter()
        self._wm_at_epoch_start = self._wm_seconds()

    def on_train_epoch_end(self) -> None:
        self.log("train/epoch_seconds", time.perf_counter() - self._epoch_start)
        self.log("train/wm_seconds", self._wm_seconds() - self._wm_at_epoch_start)

    def _wm_seconds(self) -> float:
        return sum(s.wm_seconds for s in self.searches.values())

    def on_train_end(self) -> None:
        merges = {
            "stemm": {
                s.n: Merged.from_perms(self._states[: s.n], self.spec, s.finalize())
                for s in self.searches.values()
            }
        }
        inputs = self.reporter.inputs(
            self, self._net, self._states, self.spec, reference=self.reference, seed=self.seed
        )
        for b in self.baselines:
            merges[b] = merge_sweep(inputs, b, self.num_models)
        extra = {
            "checkpoints": self.checkpoints,
            "wm_method": self.wm_method,
            "wm_seconds": {f"n{s.n}": s.wm_seconds for s in self.searches.values()},
        }
        self.sweep, out = self.reporter.run(self, self._net, self._states, self.spec, merges, extra)
        if self.trainer.is_global_zero:
            self._save(out, merges["stemm"])

    def _save(self, out: Any, merges: dict[int, Merged]) -> None:
        if not self.save_merged:
            return
        for n, merged in merges.items():
            state = self.reporter.merged_state(self, self._net, merged)
            save_net_checkpoint(state, out / f"merged_n{n}.ckpt")


class STETask(STEMMTask):
    """STE for two models (Ainsworth et al. 2023; 004 §2.3), trained with ``lmc fit``.

    A proxy starts at model A (``checkpoints[0]``); every step model B is weight-matched to
    the proxy (warm-started) and the loss of the midpoint (``mixing="midpoint"``) or of a
    uniformly sampled alpha (``"dirichlet"``) of A and pi(B) trains the proxy through the
    straight-through estimator. The permutation of the lowest batch loss is kept
    (``keep_best``). At the end, B matched (``matched.ckpt`` with ``save_matched``) and the
    merge metrics of STE and the baselines are logged as for :class:`STEMMTask`.

    Args:
        net, optimizer, baselines, seed, spec: as in :class:`STEMMTask`.
        checkpoints: exactly two ``.ckpt`` paths, model A then model B.
        search: as in :class:`STEMMTask`, with ``mixing: midpoint`` and ``keep_best: true``
            (keep the permutation of the lowest batch loss) by default.
        evaluation: as in :class:`~lmc.tasks.MergeTask`, ``pairwise: false`` by default.
        save_matched: write pi(B) as ``matched.ckpt`` into the run directory.
    """

    default_search: ClassVar[STEOptions] = STEOptions(mixing="midpoint", keep_best=True)
    default_pairwise: ClassVar[bool] = False

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        optimizer: OptimizerCallable = default_optimizer,
        search: STEOptions | None = None,
        baselines: list[Baseline] | None = None,
        evaluation: MergeEvaluationOptions | None = None,
        save_matched: bool = True,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        if len(checkpoints) != 2:
            raise ValueError(
                f"STETask merges exactly 2 checkpoints (model A, model B), got "
                f"{len(checkpoints)}; use STEMMTask for more"
            )
        self.save_matched = save_matched
        super().__init__(
            net,
            checkpoints,
            num_models=[2],
            optimizer=optimizer,
            search=search,
            reference=0,
            baselines=list(baselines) if baselines is not None else ["wm_ref"],
            evaluation=evaluation,
            save_merged=False,
            seed=seed,
            spec=spec,
        )

    def _save(self, out: Any, merges: dict[int, Merged]) -> None:
        if self.save_matched:
            from lmc.permutation import apply_permutation

            perm = {g: p.cpu() for g, p in merges[2].perms[1].items()}  # type: ignore[index]
            matched = apply_permutation(self._states[1], self.spec, perm)
            save_net_checkpoint(matched, out / "matched.ckpt")
