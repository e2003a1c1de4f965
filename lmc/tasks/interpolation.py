"""``lmc validate`` task: barriers between checkpoints, before and after matching (SPEC C4)."""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar, Literal

from torch import nn

from lmc.interpolation.barrier import BarrierDefinition, check_definition
from lmc.interpolation.states import check_compatible
from lmc.interpolation.study import (
    BARRIER_SUMMARY_KEYS,
    Matcher,
    StudyResult,
    interpolation_study,
)
from lmc.io import load_endpoints, load_state, save_net_checkpoint
from lmc.metrics.entropy import gaussian_layer_entropies
from lmc.options import as_options
from lmc.permutation.matchers import MATCHERS
from lmc.tasks.base import (
    EvaluationTask,
    SpecSource,
    datamodule_of,
    default_loss,
    eval_and_align_batches,
    point_progress,
    save_task_hparams,
)
from lmc.tasks.options import PathEvaluationOptions, moved_into
from lmc.tasks.report import log_study


class InterpolationTask(EvaluationTask):
    """Barriers along linear paths between 2+ checkpoints, naive and matched, with repair.

    Run with ``lmc validate``: it returns no optimizer. All checkpoints are read (safely) and
    checked against ``net`` when the task is built, before any work. At the end of validation it
    matches the models (``matcher``), evaluates every alpha on every split, optionally repairs
    each point (``reset_bn`` for BatchNorm nets, ``repair`` = REPAIR otherwise), logs per-alpha
    metrics, barriers, W&B plots and table, and writes ``interpolation.png`` and
    ``summary.json`` into the run directory. With ``mode: all_pairs`` (N > 2 checkpoints) every
    pair is interpolated and the uniform merges (naive and matched) are evaluated.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: ``.ckpt`` files or run folders written by ``lmc fit`` (a folder means its
            final checkpoint, ``checkpoints/last.ckpt``; see :func:`lmc.io.resolve_checkpoint`),
            each a different model with finite weights.
        mode: ``pair`` (exactly 2 checkpoints) or ``all_pairs`` (3 or more: every pair and the
            merges), so a glob that matched more runs than meant is refused, not studied.
        matcher: a name registered in :data:`lmc.permutation.MATCHERS`: ``none``, ``weight``
            (accelerated weight matching; MergeMany for N > 2), ``activation``
            (cross-covariance) or ``correlation`` (002 Alg. 1).
        barrier: the definition of ``barrier_loss_*``, ``barrier_loss_normalized_*`` and
            ``barrier_acc_*``: ``chord`` (the largest rise of the path above the chord between
            its endpoints: Entezari et al., git re-basin, 004) or ``abs_chord`` (the largest
            distance from the chord, above or below: 000 Def. 2.1). The summary keeps both
            loss barriers (``barrier_loss_chord_*``, ``barrier_loss_abs_chord_*`` and their
            ``_normalized_`` forms) whichever is chosen.
        evaluation: ``num_alphas`` (points of the alpha grid, both endpoints included),
            ``repair`` of every point (``none``, ``reset_bn`` or ``repair``), the ``splits``
            (``train`` = the alignment subset; the summary reports the last, ``test`` by
            default) and ``max_batches`` (:class:`~lmc.tasks.options.PathEvaluationOptions`).
        save_matched: write the matched second model (N = 2) or the matched merge (N > 2, after
            the ``repair`` the study evaluated it with) as ``matched.ckpt`` in the run directory
            (loadable by ``lmc.io.load_checkpoint``).
        log_artifact: also log ``matched.ckpt`` as a W&B model artifact (W&B logger only).
        seed: seed of the matching's random group order.
        spec: where the permutation spec comes from: ``auto`` (a built-in network's
            hand-written spec, else derived with ``torch.fx`` from the data), ``builtin``,
            ``derive`` or ``package.module:function`` (:mod:`lmc.permutation.source`).
        entropy: also report the endpoints' neuron-distribution entropy in the Gaussian closed
            form of 000 §4.1, A.1.1 (:func:`lmc.metrics.gaussian_layer_entropies`, mean over
            the checkpoints): ``entropy_first`` of the first weight layer and ``entropy_max``,
            the maximum over layers, the H of 000's fit L = e^{aH+b}.
        overlap: also report ``overlap_proportion``, the overlap of the two endpoints' neuron
            types in the teacher-student setting (003 Def. 4, eq. 6,
            :func:`lmc.metrics.overlap.solutions_overlap`): each first-layer neuron's type is the
            teacher neuron it is most aligned with. Needs ``mode: pair`` and a data module with
            a ``teacher_weight`` (:class:`lmc.data.TeacherStudentDataModule`).
    """

    moved_keys: ClassVar[dict[str, str]] = moved_into("evaluation", PathEvaluationOptions)

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        mode: Literal["pair", "all_pairs"] = "pair",
        matcher: Matcher = "weight",
        barrier: BarrierDefinition = "chord",
        evaluation: PathEvaluationOptions | None = None,
        save_matched: bool = False,
        log_artifact: bool = False,
        seed: int = 0,
        spec: str = "auto",
        entropy: bool = False,
        overlap: bool = False,
    ) -> None:
        super().__init__()
        save_task_hparams(self, ignore=["net"])
        MATCHERS.check(matcher, "model.init_args.matcher")
        opts = as_options(PathEvaluationOptions, evaluation)  # checks the alpha grid
        self.barrier = check_definition(barrier, "model.init_args.barrier")
        if mode == "all_pairs" and len(checkpoints) < 3:
            raise ValueError(
                f"mode: all_pairs compares 3 or more checkpoints, got {len(checkpoints)}; use "
                "mode: pair for two"
            )
        self.net = net
        where = "model.init_args.checkpoints"
        if mode == "pair":
            where += " (mode: pair; set mode: all_pairs to study 3 or more)"
        self.checkpoints, self.states = load_endpoints(
            checkpoints, 2 if mode == "pair" else None, where
        )
        check_compatible(
            [net.state_dict(), *self.states], ["model.init_args.net", *self.checkpoints]
        )
        self.matcher, self.repair, self.num_alphas = matcher, opts.repair, opts.num_alphas
        self.splits, self.max_batches = opts.splits, opts.max_batches
        self.save_matched, self.seed = save_matched, seed
        self.log_artifact = log_artifact
        self.spec = SpecSource(spec, net)
        self.entropy = entropy
        if overlap and mode != "pair":
            raise ValueError(
                "model.init_args.overlap compares the neuron types of two solutions: use mode: pair"
            )
        self.overlap = overlap
        self.result: StudyResult | None = None
        self.report_line: str | None = None  # printed last by `lmc validate`

    @classmethod
    def produces(cls, init_args: dict[str, Any]) -> set[str]:
        """The summary keys (and logged ``interp/`` keys) a run with ``init_args`` reports,
        known before it runs: a study checks its claims against them."""
        variants = (
            ["naive"] if init_args.get("matcher", "weight") == "none" else ["naive", "matched"]
        )
        keys = {f"barrier_{k}_{v}" for k in BARRIER_SUMMARY_KEYS for v in variants}
        keys |= {"endpoint_loss_mean", "endpoint_acc_mean"}
        if init_args.get("mode", "pair") == "all_pairs":
            splits = (init_args.get("evaluation") or {}).get("splits") or ["train", "test"]
            keys |= {
                f"merge_{v}_{split}_{m}"
                for v in [*variants, "endpoints_mean"]
                for split in splits
                for m in ("loss", "acc")
            }
        keys |= {f"interp/{k}" for k in keys if k.startswith(("barrier_", "merge_"))}
        keys |= {"matching_seconds", "repair_seconds", "interpolation_seconds"}
        if init_args.get("entropy"):
            keys |= {"entropy_first", "entropy_max"}
        if init_args.get("overlap"):
            keys.add("overlap_proportion")
        return keys

    def evaluate(self) -> None:
        dm = datamodule_of(self.trainer)
        overlap = self._overlap(dm) if self.overlap else None  # refuses a data module first
        splits, align = eval_and_align_batches(dm, self.splits, self.max_batches, self.device)
        n = len(self.states)
        paths = n * (n - 1) // 2 * (1 if self.matcher == "none" else 2)
        with point_progress(self.trainer, paths * self.num_alphas, "interpolation points") as step:
            result = self._study(dm, splits, align, step)
        if self.entropy:
            result.summary.update(self._entropies())
        if overlap is not None:
            result.summary["overlap_proportion"] = overlap
        out = log_study(self.trainer, result)
        s = result.summary
        matched = (
            ""
            if self.matcher == "none"
            else (f" -> {s['barrier_loss_matched']:.4g} matched ({self.matcher} matching)")
        )
        diverged = not math.isfinite(float(s.get("endpoint_loss_mean", 0.0)))
        note = (
            "\nnote: an endpoint's loss is not finite (a run that diverged?), so the barriers "
            "are not numbers; check the endpoints' training curves"
            if diverged
            else ""
        )
        self.report_line = (
            f"\nBarrier ({self.barrier}, {self.splits[-1]} split): loss {s['barrier_loss_naive']:.4g} naive"
            f"{matched}. Figure and summary: {out}{note}\n"
        )
        if self.save_matched and self.trainer.is_global_zero:
            self._save_matched(out)

    def _study(self, dm: Any, splits: dict, align: list, step: Any) -> StudyResult:
        self.result = result = interpolation_study(
            self.net,
            self.states,
            splits,
            matcher=self.matcher,
            repair_mode=self.repair,
            align_batches=align,
            num_alphas=self.num_alphas,
            loss=default_loss(dm),
            seed=self.seed,
            names=self.checkpoints,
            spec=self.spec.resolve(dm, self.device),
            on_point=step,
            barrier_definition=self.barrier,
        )
        for key, value in result.summary.items():
            if key.startswith(("barrier_", "merge_")):
                self.log(f"interp/{key}", float(value))
        return result

    def _entropies(self) -> dict[str, float]:
        """``entropy_first`` and ``entropy_max`` (Gaussian closed form), mean over the
        checkpoints."""
        model = copy.deepcopy(self.net)
        per_model = []
        for state in self.states:
            load_state(model, state)
            per_model.append(gaussian_layer_entropies(model))
        first = next(iter(per_model[0]))
        return {
            "entropy_first": sum(h[first] for h in per_model) / len(per_model),
            "entropy_max": sum(max(h.values()) for h in per_model) / len(per_model),
        }

    def _overlap(self, dm: Any) -> float:
        """003's overlap proportion of the endpoints' first-layer neuron types."""
        from lmc.metrics.layers import weight_layers
        from lmc.metrics.overlap import solutions_overlap

        teacher = getattr(dm, "teacher_weight", None)
        if teacher is None:
            raise ValueError(
                "model.init_args.overlap types neurons by the teacher's: the data module "
                f"{type(dm).__name__} has no teacher_weight (use lmc.data."
                "TeacherStudentDataModule, or overlap: false)"
            )
        first = next(iter(weight_layers(self.net))) + ".weight"
        a, b = (state[first].cpu() for state in self.states)
        return solutions_overlap(a, b, teacher.cpu())

    def _save_matched(self, out: Any) -> None:
        from lmc.interpolation.states import weighted_average

        result = self.result
        aligned = result.matched_states if result else []
        if len(aligned) == 2:
            state = aligned[1]
        elif result is not None and result.matched_merge is not None:
            state = result.matched_merge  # with BatchNorm reset / REPAIR when the study did it
        else:
            state = weighted_average(aligned)
        path = out / "matched.ckpt"
        save_net_checkpoint(state, path)
        if self.log_artifact:
            from lightning.pytorch.loggers import WandbLogger

            for logger in self.trainer.loggers:
                if isinstance(logger, WandbLogger):
                    import wandb

                    artifact = wandb.Artifact(f"matched-{logger.version}", type="model")
                    artifact.add_file(str(path))
                    logger.experiment.log_artifact(artifact)
