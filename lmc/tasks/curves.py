"""``lmc fit`` / ``lmc validate`` task for mode-connecting curves (002 §2.1, Alg. 2; SPEC C6).

Thin glue around :mod:`lmc.curves`: read the two endpoint checkpoints, optionally align the
second to the first (002 Alg. 1), train the control points with one ``t ~ U(0, 1)`` per batch,
and evaluate the curve on a t grid with BatchNorm re-estimated per t.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.curves.attack import data_normalization, pgd_attack
from lmc.curves.curve import Curve, forward_at
from lmc.curves.evaluate import CurveEvaluation, evaluate_curve, prepare_point_, t_grid
from lmc.curves.options import (
    AlignmentOptions,
    BatchNormOptions,
    CurveEvaluationOptions,
    CurveOptions,
    PlaneOptions,
    RobustOptions,
)
from lmc.curves.plane import PlaneResult, plane_grid
from lmc.interpolation.states import check_compatible
from lmc.io import load_endpoints
from lmc.optim import default_optimizer
from lmc.options import as_options
from lmc.permutation import apply_permutation, match
from lmc.permutation.spec import PermutationSpec
from lmc.tasks.base import (
    LMCTask,
    SpecSource,
    datamodule_of,
    default_loss,
    point_progress,
    save_task_hparams,
    split_batches,
)
from lmc.tasks.curve_report import log_curve


class CurveTask(LMCTask):
    """A Bezier curve (or polygonal chain) between two checkpoints, trained with ``lmc fit``.

    Endpoints are fixed; the control points start on the straight line (on the aligned line with
    ``alignment: {method: correlation}``) and are trained with the configured optimizer, one
    ``t ~ U(0, 1)`` per batch and the L2 penalty ``curve.weight_decay / 2 * |w(t)|^2`` on the
    point (Garipov et al.'s recipe; set the optimizer's own weight decay to 0). Every validation
    epoch of ``fit`` logs ``val/loss_mid`` and ``val/acc_mid`` of the midpoint (BatchNorm
    re-estimated). When training ends (``evaluation.at_fit_end``) or under ``lmc validate`` (the
    untrained curve is the linear path), the curve is evaluated on ``evaluation.num_ts`` points
    with BatchNorm re-estimated at every t; per-t metrics, min / mean / arc-length mean, W&B
    plots and table, ``curve.png``, ``plane.png`` and ``summary.json`` go to the run directory.

    A checkpoint holds the whole curve (``curve.start``, ``curve.end`` - the aligned second
    endpoint -, ``curve.offsets``); ``net.*`` is only the scratch network. Extract a model on the
    curve with ``task.curve.state_at(t, template_state)``.

    Args:
        net: architecture of the checkpoints (class_path/init_args); used as a scratch network.
        checkpoints: the two endpoint ``.ckpt`` files.
        curve: kind, order and L2 penalty of the curve (:class:`~lmc.curves.CurveOptions`).
        alignment: matching of the second endpoint to the first before training
            (:class:`~lmc.curves.AlignmentOptions`; ``None``: no alignment).
        optimizer: optimizer of the control points.
        lr_scheduler: optional LR scheduler; ``scheduler_interval`` ``epoch`` or ``step``.
        scheduler_interval: when ``lr_scheduler`` steps.
        evaluation: the t grid and evaluated splits (:class:`~lmc.curves.CurveEvaluationOptions`).
        batchnorm: BatchNorm statistics per t (:class:`~lmc.curves.BatchNormOptions`).
        plane: the loss plane evaluated after the curve (:class:`~lmc.curves.PlaneOptions`).
        robust: PGD for robust curves (:class:`~lmc.curves.RobustOptions`; 002 §5).
        spec: where the permutation spec comes from: ``auto`` (a built-in network's hand-written
            spec, else derived with ``torch.fx`` from the data), ``builtin``, ``derive`` or
            ``package.module:function`` (:mod:`lmc.permutation.source`).
    """

    aligned: Tensor  # buffer: whether theta_2 is aligned to theta_1 (kept in the checkpoint)

    # Flat keys before the options were grouped (old key -> new key under model.init_args);
    # lmc.engine.moved names the new key when a config still uses an old one.
    moved_keys: ClassVar[dict[str, str]] = {
        "order": "curve.order",
        "curve": "curve.kind",
        "weight_decay": "curve.weight_decay",
        "alignment": "alignment.method",
        "align_batches": "alignment.batches",
        "num_ts": "evaluation.num_ts",
        "splits": "evaluation.splits",
        "max_eval_batches": "evaluation.max_batches",
        "evaluate_at_fit_end": "evaluation.at_fit_end",
        "robust_splits": "evaluation.robust_splits",
        "bn_mode": "batchnorm.mode",
        "bn_batches": "batchnorm.batches",
        "bn_data": "batchnorm.data",
        "plane": "plane.kind",
        "plane_size": "plane.size",
        "plane_margin": "plane.margin",
        "attack": "robust.attack",
        "adversarial_training": "robust.adversarial_training",
        "pixel_space": "robust.pixel_space",
    }

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        curve: CurveOptions | None = None,
        alignment: AlignmentOptions | None = None,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        evaluation: CurveEvaluationOptions | None = None,
        batchnorm: BatchNormOptions | None = None,
        plane: PlaneOptions | None = None,
        robust: RobustOptions | None = None,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ignore=["net", "optimizer", "lr_scheduler"])
        if len(checkpoints) != 2:
            raise ValueError(
                f"{type(self).__name__} connects exactly 2 checkpoints, got {len(checkpoints)}: "
                "set model.init_args.checkpoints to [first.ckpt, second.ckpt]"
            )
        self.curve_opts = as_options(CurveOptions, curve)
        self.align_opts = as_options(AlignmentOptions, alignment, AlignmentOptions("none"))
        self.eval_opts = as_options(CurveEvaluationOptions, evaluation)
        self.bn_opts = as_options(BatchNormOptions, batchnorm)
        self.plane_opts = as_options(PlaneOptions, plane)
        self.robust_opts = as_options(RobustOptions, robust)
        self.net = net.requires_grad_(False)
        self.spec = SpecSource(spec, net)
        self.checkpoints, self.states = load_endpoints(
            checkpoints, 2, "model.init_args.checkpoints"
        )
        check_compatible(
            [net.state_dict(), *self.states], ["model.init_args.net", *self.checkpoints]
        )
        c = self.curve_opts
        self.curve = Curve.from_module(net, self.states[0], self.states[1], c.order, c.kind)
        self.register_buffer("aligned", torch.tensor(self.align_opts.method == "none"))
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.scheduler_interval = scheduler_interval
        self.attack = self.robust_opts.attack
        self.align_info: dict[str, float] = {}
        self.result: CurveEvaluation | None = None
        self.report_line: str | None = None  # printed last by `lmc validate`
        self.plane_result: PlaneResult | None = None
        self._bn_cache: list | None = None

    # data helpers --------------------------------------------------------------------------
    @property
    def _dm(self) -> Any:
        return datamodule_of(self.trainer)

    def _train_subset(self, max_batches: int | None) -> list:
        return split_batches(self._dm, ["train"], max_batches, self.device)["train"]

    def _normalization(self) -> tuple[Any, Any]:
        return data_normalization(self._dm) if self.robust_opts.pixel_space else (None, None)

    def _spec(self) -> PermutationSpec:
        """The permutation spec (``spec``), derived from the data module's inputs if needed."""
        dm = datamodule_of(self._trainer) if self._trainer is not None else None
        return self.spec.resolve(dm, self.device)

    # alignment ---------------------------------------------------------------------------
    def _matcher_perm(
        self, batches: list, method: str
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        """The registered matcher ``method``'s permutation of ``theta_2`` to ``theta_1`` on
        ``batches`` (002 Alg. 1: ``correlation``) and its diagnostics."""
        with torch.inference_mode(False):
            result = match(method, self.net, self.states, self._spec(), batches=batches)
        return result.perms[1], result.info

    def _ensure_aligned(self) -> None:
        """Align ``theta_2`` to ``theta_1`` once with the alignment matcher (kept in the
        checkpoint)."""
        if bool(self.aligned):
            return
        method = self.align_opts.method
        with torch.inference_mode(False):
            batches = self._train_subset(self.align_opts.batches)
        perm, info = self._matcher_perm(batches, method)
        self.align_perm = perm
        self.curve.set_end_(apply_permutation(self.states[1], self._spec(), perm))
        self.aligned.fill_(True)
        self.align_info = {}
        if "similarity_before" in info:  # a correlation-type matcher: the matched correlation
            self.align_info = {
                "align_corr_before": info["similarity_before"],
                "align_corr_after": info["similarity_after"],
            }
            rank_zero_info(
                f"{method} alignment: mean matched correlation "
                f"{self.align_info['align_corr_before']:.3f} -> "
                f"{self.align_info['align_corr_after']:.3f}"
            )

    def on_fit_start(self) -> None:
        self._ensure_aligned()

    def on_validation_start(self) -> None:
        if self.trainer.state.fn != TrainerFn.FITTING:
            self._ensure_aligned()

    # training ----------------------------------------------------------------------------
    def curve_loss(
        self, x: Tensor, y: Tensor, t: float, **point_kw: Any
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-entropy at ``w(t)`` (on PGD examples when adversarially training) and the L2
        penalty; returns ``(loss, penalty, logits)``."""
        flat = self.curve.point_flat(t, **point_kw)
        params = self.curve.unflatten(flat)
        if self.attack is not None and self.robust_opts.adversarial_training:
            fixed = {k: v.detach() for k, v in params.items()}
            x = pgd_attack(
                lambda z: forward_at(self.net, fixed, z), x, y, self.attack, *self._normalization()
            )
        out = forward_at(self.net, params, x)
        loss = nn.functional.cross_entropy(out, y)
        wd = self.curve_opts.weight_decay
        penalty = 0.5 * wd * flat.square().sum() if wd else flat.new_zeros(())
        return loss, penalty, out

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        x, y = batch[0], batch[1]
        t = float(torch.rand(()))
        loss, penalty, out = self.curve_loss(x, y, t)
        self._log_train(loss, penalty, out, y)
        return loss + penalty

    def _log_train(self, loss: Tensor, penalty: Tensor, out: Tensor, y: Tensor) -> None:
        acc = (out.detach().argmax(1) == y).float().mean()
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", acc, on_step=False, on_epoch=True)
        self.log("train/objective", (loss + penalty).detach(), on_step=False, on_epoch=True)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.curve.parameters())
        if self.lr_scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": self.lr_scheduler(optimizer),
                "interval": self.scheduler_interval,
            },
        }

    # validation: midpoint during fit, the whole curve under `lmc validate` -----------------
    def _fitting(self) -> bool:
        return self.trainer.state.fn == TrainerFn.FITTING

    def on_validation_epoch_start(self) -> None:
        if self._fitting():
            if self._bn_cache is None:
                self._bn_cache = self._train_subset(self.bn_opts.batches)
            prepare_point_(self.net, self.curve, 0.5, self._bn_cache, self.bn_opts.mode)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self._fitting():
            return
        x, y = batch[0], batch[1]
        out = self.net(x)
        self.log("val/loss_mid", nn.functional.cross_entropy(out, y), prog_bar=True)
        self.log("val/acc_mid", (out.argmax(1) == y).float().mean(), prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        if self._fitting() or self.trainer.sanity_checking:
            return
        self.evaluate_and_report()

    def on_train_end(self) -> None:
        if self.eval_opts.at_fit_end:
            self.evaluate_and_report()

    def summary_extra(self) -> dict[str, Any]:
        """Extra entries for ``summary.json`` (alignment statistics; PAM adds its own)."""
        return dict(self.align_info)

    def evaluate_and_report(self) -> None:
        """Evaluate the curve (and the plane) and log everything."""
        with torch.inference_mode(False):
            self._evaluate_and_report()

    def _evaluate_and_report(self) -> None:
        dm, ev = self._dm, self.eval_opts
        splits = split_batches(dm, ev.splits, ev.max_batches, self.device)
        bn = self._train_subset(self.bn_opts.batches)
        mean, std = self._normalization()
        with point_progress(self.trainer, ev.num_ts, "curve points") as step:
            self.result = evaluate_curve(
                self.net,
                self.curve,
                t_grid(ev.num_ts),
                splits,
                bn,
                self.bn_opts.mode,
                default_loss(dm),
                self.attack,
                [s for s in ev.robust_splits if s in splits],
                self.bn_opts.data,
                mean,
                std,
                on_point=step,
            )
        if self.plane_opts.kind != "none":
            self.plane_result = self._plane(splits, bn)
        out = log_curve(self.trainer, self.result, self.plane_result, self.summary_extra())
        s = self.result.summary
        last = ev.splits[-1]
        self.report_line = (
            f"\nCurve ({last}): acc min {s.get(f'{last}/acc_min', float('nan')):.4f}, "
            f"mean {s.get(f'{last}/acc_mean', float('nan')):.4f}, arc-length mean "
            f"{s.get(f'{last}/acc_arc_mean', float('nan')):.4f}; loss max "
            f"{s.get(f'{last}/loss_max', float('nan')):.4f}. Figures and summary: {out}\n"
        )
        if self._fitting():
            rank_zero_info(self.report_line)  # under `lmc validate` the CLI prints it last

    def _plane(self, splits: dict, bn: list) -> PlaneResult:
        curve, opts = self.curve, self.plane_opts
        start, end = curve.endpoint(0), curve.endpoint(1)
        names = ("theta_1", "theta_2", "P theta_2")
        if opts.kind == "curve":
            points = curve.control_points()
            a, b = end, curve.unflatten(points[len(points) // 2])
            names = ("theta_1", "theta_2", "control")
        elif self.align_opts.method == "none":  # the plane of 002 Fig. 3 needs P theta_2
            perm, _ = self._matcher_perm(bn, "correlation")
            a, b = end, apply_permutation(self.states[1], self._spec(), perm)
        else:
            a, b = self.states[1], end
        last = self.eval_opts.splits[-1]
        return plane_grid(
            copy.deepcopy(self.net),
            start,
            a,
            b,
            {last: splits[last]},
            bn,
            opts.size,
            opts.margin,
            default_loss(self._dm),
            names,
            {"curve": [curve.point_flat(t).detach() for t in t_grid(21)]},
        )
