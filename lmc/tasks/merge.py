"""``lmc validate`` task for merging n checkpoints with the baselines of 004 §3/§5 (SPEC C4), and
the loading/evaluation glue it shares with the STE-MM task (:mod:`lmc.tasks.ste`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.evaluation import has_batchnorm, reset_bn
from lmc.interpolation.states import weighted_average
from lmc.io import atomic_write, load_endpoints, load_state
from lmc.merging import (
    MERGE_METHODS,
    Baseline,
    MergeSweep,
    align_states,
    baseline_sweep,
    check_models,
    evaluate_sweep,
    parameter_keys,
)
from lmc.permutation import Permutation, PermutationSpec
from lmc.permutation.weight_matching import Method
from lmc.tasks.base import (
    EvaluationTask,
    SpecSource,
    Split,
    default_loss,
    eval_and_align_batches,
    save_task_hparams,
    split_batches,
)
from lmc.tasks.merge_report import log_merge


def load_models(
    net: nn.Module,
    checkpoints: Sequence[str],
    num_models: Sequence[int] | None,
    reference: int,
    spec: SpecSource,
) -> tuple[list[str], list[dict[str, Tensor]], list[int]]:
    """Read the checkpoints (files or run folders, safely; the same model twice and non-finite
    weights refused), check them against ``net`` (and against the permutation spec when it is
    known without data) and validate the sweep.

    Returns the checkpoint files, the state dicts and the sorted numbers of models to merge.

    Raises:
        ValueError: fewer than 2 checkpoints, an n outside ``[2, len(checkpoints)]``, a
            reference outside the smallest merge, or checkpoints of another architecture.
    """
    if len(checkpoints) < 2:
        raise ValueError(
            f"merging needs at least 2 checkpoints, got {len(checkpoints)}: set "
            "model.init_args.checkpoints to a list of .ckpt paths of one architecture"
        )
    ns = sorted(set(num_models)) if num_models else [len(checkpoints)]
    bad = [n for n in ns if not 2 <= n <= len(checkpoints)]
    if bad:
        raise ValueError(
            f"num_models {bad} must lie in [2, {len(checkpoints)}] (the number of checkpoints); "
            "each n merges the first n checkpoints"
        )
    if not 0 <= reference < ns[0]:
        raise ValueError(
            f"reference={reference} must index one of the first {ns[0]} checkpoints (the "
            "smallest merge of the sweep)"
        )
    files, states = load_endpoints(checkpoints, None, "model.init_args.checkpoints")
    check_models(net, states, spec.known, names=files)
    return files, states, ns


class MergeReporter:
    """Evaluation settings shared by the merge tasks (see :class:`MergeTask` for the args)."""

    def __init__(
        self,
        splits: list[Split] | None,
        max_batches: int | None,
        pairwise: bool,
        sharpness_probes: int,
        sharpness_batches: int,
        seed: int,
    ) -> None:
        if sharpness_probes < 0 or sharpness_batches < 1:
            raise ValueError(
                f"need sharpness_probes >= 0 and sharpness_batches >= 1, got "
                f"{sharpness_probes} and {sharpness_batches}"
            )
        self.splits = list(splits) if splits else ["train", "test"]
        self.max_batches, self.pairwise, self.seed = max_batches, pairwise, seed
        self.sharpness_probes, self.sharpness_batches = sharpness_probes, sharpness_batches

    def run(
        self,
        module: L.LightningModule,
        net: nn.Module,
        states: Sequence[Mapping[str, Tensor]],
        spec: PermutationSpec,
        perms: Mapping[str, Mapping[int, Sequence[Permutation]]],
        extra: dict[str, Any] | None = None,
    ) -> tuple[MergeSweep, Path]:
        """Evaluate every method at every n on the data module's splits and log it all."""
        trainer = module.trainer
        dm = trainer.datamodule
        device = module.device
        splits, align = eval_and_align_batches(dm, self.splits, self.max_batches, device)
        net = copy.deepcopy(net).to(device)
        sweep = evaluate_sweep(
            net,
            [{k: v.to(device) for k, v in s.items()} for s in states],
            spec,
            perms,
            splits,
            loss=default_loss(dm),
            align_batches=align,
            pairwise=self.pairwise,
            sharpness_batches=align[: self.sharpness_batches],
            sharpness_probes=self.sharpness_probes,
            seed=self.seed,
        )
        out = log_merge(trainer, sweep, extra, split=self.splits[-1])
        if trainer.is_global_zero:
            # on the CPU, so that the file loads on any machine without a map_location
            table = {
                m: {n: [{g: t.cpu() for g, t in pi.items()} for pi in p] for n, p in by_n.items()}
                for m, by_n in perms.items()
            }
            atomic_write(out / "permutations.pt", lambda f: torch.save(table, f))
        split = self.splits[-1]
        lines = [
            f"{ev.method:>10} n={ev.n:<3} {split} acc {ev.metrics[f'{split}/acc']:.4f} "
            f"(originals {ev.metrics[f'{split}/originals_acc']:.4f}), loss gap "
            f"{ev.metrics[f'{split}/loss_gap']:+.4f}"
            for ev in sweep.evaluations
        ]
        rank_zero_info("\nMerged models:\n" + "\n".join(lines) + f"\nFigure and summary: {out}\n")
        return sweep, out

    def merged_state(
        self,
        module: L.LightningModule,
        net: nn.Module,
        states: Sequence[Mapping[str, Tensor]],
        spec: PermutationSpec,
        perms: Sequence[Permutation],
    ) -> dict[str, Tensor]:
        """``1/n sum_i pi_i(theta_i)``, BatchNorm statistics re-estimated on the alignment
        subset (as evaluated)."""
        model = copy.deepcopy(net).to(module.device)
        aligned = align_states(
            [{k: v.to(module.device) for k, v in s.items()} for s in states], spec, perms
        )
        load_state(model, weighted_average(aligned))
        if has_batchnorm(model):
            dm = module.trainer.datamodule
            reset_bn(model, split_batches(dm, ["train"], self.max_batches, module.device)["train"])
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}


class MergeTask(EvaluationTask):
    """Merge the first n checkpoints for every n in ``num_models`` with the baselines and
    report the merge metrics (004 §3, §5, §6). Run with ``lmc validate``: no training.

    Methods: ``naive`` (plain average, no permutation), ``wm_ref`` (each model weight-matched
    to the reference checkpoint, 004 §3.1) and ``mergemany`` (Ainsworth et al. 2023, App. A.10).
    Matching uses the parameters; BatchNorm statistics follow the permutation and are reset on
    the alignment subset for every merged model evaluated.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: 2 or more ``.ckpt`` files or run folders (their final checkpoint) of that
            architecture.
        num_models: the numbers of models n to merge (each the first n checkpoints); default
            all of them.
        methods: baselines to run.
        reference: index of the reference checkpoint of ``wm_ref``.
        splits: evaluated splits (``train`` = the alignment subset); the last one is reported
            and used for the pairwise merges.
        max_batches: cap on cached batches per split (quick looks).
        pairwise: also evaluate the midpoint of every pair of permuted models (004 Fig. 4).
        sharpness_probes: Hutchinson probes of tr(H ⊙ θθᵀ) (004 §6.2); 0 turns it off.
        sharpness_batches: alignment batches defining the sharpness loss.
        wm_method: weight-matching variant of the baselines (same optimum up to ties).
        seed: seed of the matching's group order and of the sharpness probes.
        spec: the permutation spec source: ``auto``, ``builtin``, ``derive`` or
            ``package.module:function`` (:mod:`lmc.permutation.source`).
    """

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        num_models: list[int] | None = None,
        methods: list[Baseline] | None = None,
        reference: int = 0,
        splits: list[Split] | None = None,
        max_batches: int | None = None,
        pairwise: bool = True,
        sharpness_probes: int = 0,
        sharpness_batches: int = 1,
        wm_method: Method = "accelerated",
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net"])
        for m in methods or []:
            MERGE_METHODS.check(m, "model.init_args.methods")
        self.spec_source = SpecSource(spec, net)
        files, self.states, self.num_models = load_models(
            net, checkpoints, num_models, reference, self.spec_source
        )
        object.__setattr__(self, "_net", net)
        self.checkpoints = files
        self.methods = list(methods) if methods else ["naive", "wm_ref", "mergemany"]
        self.reference, self.wm_method, self.seed = reference, wm_method, seed
        self.reporter = MergeReporter(
            splits, max_batches, pairwise, sharpness_probes, sharpness_batches, seed
        )
        self.sweep: MergeSweep | None = None

    def evaluate(self) -> None:
        # the validation loop runs under inference mode; the sharpness estimate needs
        # autograd, so the report builds its models and batches outside of it
        with torch.inference_mode(False):
            self._merge()

    def _merge(self) -> None:
        dm = self.trainer.datamodule
        self.spec = check_models(
            self._net, self.states, self.spec_source.resolve(dm, self.device), self.checkpoints
        )
        keys = parameter_keys(self._net)
        perms = {
            m: baseline_sweep(
                self.states,
                self.spec,
                m,
                self.num_models,
                reference=self.reference,
                keys=keys,
                method=self.wm_method,
                seed=self.seed,
            )
            for m in self.methods
        }
        self.sweep, _ = self.reporter.run(
            self, self._net, self.states, self.spec, perms, {"checkpoints": self.checkpoints}
        )
