"""``lmc fit`` / ``lmc validate`` task for mode-connecting curves (002 §2.1, Alg. 2; SPEC C6).

Thin glue around :mod:`lmc.curves`: read the two endpoint checkpoints, optionally align the
second to the first (002 Alg. 1), train the control points with one ``t ~ U(0, 1)`` per batch,
and evaluate the curve on a t grid with BatchNorm re-estimated per t.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.curves.attack import PGD, as_pgd, data_normalization, pgd_attack
from lmc.curves.basis import CurveKind
from lmc.curves.curve import Curve, forward_at
from lmc.curves.evaluate import (
    BNData,
    BNMode,
    CurveEvaluation,
    evaluate_curve,
    prepare_point_,
    t_grid,
)
from lmc.curves.plane import PlaneResult, plane_grid
from lmc.interpolation.states import check_compatible
from lmc.io import load_checkpoint, model_state_dict
from lmc.optim import default_optimizer
from lmc.tasks.base import Split, default_loss, save_task_hparams, split_batches
from lmc.tasks.curve_report import log_curve

Alignment = Literal["none", "correlation"]
Plane = Literal["none", "alignment", "curve"]


class CurveTask(L.LightningModule):
    """A Bezier curve (or polygonal chain) between two checkpoints, trained with ``lmc fit``.

    Endpoints are fixed; the control points start on the straight line (on the aligned line with
    ``alignment: correlation``) and are trained with the configured optimizer, one ``t ~ U(0, 1)``
    per batch and the L2 penalty ``weight_decay / 2 * |w(t)|^2`` on the point (Garipov et al.'s
    recipe; set the optimizer's own weight decay to 0). Every validation epoch of ``fit`` logs
    ``val/loss_mid`` and ``val/acc_mid`` of the midpoint (BatchNorm re-estimated). When training
    ends (``evaluate_at_fit_end``) or under ``lmc validate`` (the untrained curve is the linear
    path), the curve is evaluated on ``num_ts`` points with BatchNorm re-estimated at every t;
    per-t metrics, min / mean / arc-length mean, W&B plots and table, ``curve.png``,
    ``plane.png`` and ``summary.json`` go to the run directory.

    A checkpoint holds the whole curve (``curve.start``, ``curve.end`` - the aligned second
    endpoint -, ``curve.offsets``); ``net.*`` is only the scratch network. Extract a model on the
    curve with ``task.curve.state_at(t, template_state)``.

    Args:
        net: architecture of the checkpoints (class_path/init_args); used as a scratch network.
        checkpoints: the two endpoint ``.ckpt`` files.
        order: curve order (2: quadratic Bezier, 002 eq. 7; 1: the straight line).
        curve: ``bezier`` or ``polychain``.
        alignment: ``none`` or ``correlation`` (002 Alg. 1 / App. D on the alignment subset).
        optimizer: optimizer of the control points.
        lr_scheduler: optional LR scheduler; ``scheduler_interval`` ``epoch`` or ``step``.
        weight_decay: coefficient of the L2 penalty on ``w(t)``.
        num_ts: points of the evaluation grid (61 by default).
        splits: evaluated splits; ``train`` is the alignment subset of train.
        bn_mode: ``recompute`` BatchNorm statistics per t on the train subset (002 App. B) or
            ``interpolate`` the endpoints' statistics.
        bn_batches: batches of the alignment subset used for BatchNorm (``None``: all).
        max_eval_batches: cap on cached batches per evaluated split.
        align_batches: batches of the alignment subset used for alignment (``None``: all).
        evaluate_at_fit_end: evaluate the curve when ``fit`` ends.
        plane: also evaluate the plane through ``theta_1, theta_2, P theta_2`` (``alignment``,
            002 Fig. 3) or through ``theta_1, theta_2`` and the control point (``curve``).
        plane_size: grid points per plane axis.
        plane_margin: relative padding around the models on the plane.
        attack: PGD settings for robust curves (002 §5); ``None`` trains and evaluates clean.
        adversarial_training: with ``attack``, train the curve on PGD examples at each ``w(t)``.
        robust_splits: splits also evaluated under attack (default ``[test]``).
        bn_data: BatchNorm statistics for robust evaluation from ``clean`` or ``adversarial``
            train-subset batches.
        pixel_space: attack in [0, 1] pixel space using the data module's mean/std.
        seed: seed of alignment-free randomness (PAM sampling).
    """

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        order: int = 2,
        curve: CurveKind = "bezier",
        alignment: Alignment = "none",
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        weight_decay: float = 0.0,
        num_ts: int = 61,
        splits: list[Split] | None = None,
        bn_mode: BNMode = "recompute",
        bn_batches: int | None = None,
        max_eval_batches: int | None = None,
        align_batches: int | None = None,
        evaluate_at_fit_end: bool = True,
        plane: Plane = "none",
        plane_size: int = 11,
        plane_margin: float = 0.2,
        attack: PGD | None = None,
        adversarial_training: bool = True,
        robust_splits: list[Split] | None = None,
        bn_data: BNData = "clean",
        pixel_space: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        save_task_hparams(self, ignore=["net", "optimizer", "lr_scheduler"])
        if len(checkpoints) != 2:
            raise ValueError(
                f"{type(self).__name__} connects exactly 2 checkpoints, got {len(checkpoints)}: "
                "set model.init_args.checkpoints to [first.ckpt, second.ckpt]"
            )
        if alignment not in ("none", "correlation"):
            raise ValueError(f"alignment must be 'none' or 'correlation', got {alignment!r}")
        self.net = net.requires_grad_(False)
        self.checkpoints = list(checkpoints)
        self.states = [model_state_dict(load_checkpoint(p)) for p in self.checkpoints]
        check_compatible(
            [net.state_dict(), *self.states], ["model.init_args.net", *self.checkpoints]
        )
        self.curve = Curve.from_module(net, self.states[0], self.states[1], order, curve)
        self.register_buffer("aligned", torch.tensor(alignment == "none"))
        self.alignment = alignment
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.scheduler_interval = scheduler_interval
        self.weight_decay, self.num_ts = weight_decay, num_ts
        self.splits = list(splits) if splits else ["train", "test"]
        self.bn_mode, self.bn_batches = bn_mode, bn_batches
        self.max_eval_batches, self.align_batches = max_eval_batches, align_batches
        self.evaluate_at_fit_end = evaluate_at_fit_end
        self.plane, self.plane_size, self.plane_margin = plane, plane_size, plane_margin
        self.attack = as_pgd(attack)
        self.adversarial_training = adversarial_training
        self.robust_splits = list(robust_splits) if robust_splits else ["test"]
        self.bn_data, self.pixel_space, self.seed = bn_data, pixel_space, seed
        self.align_info: dict[str, float] = {}
        self.evaluation: CurveEvaluation | None = None
        self.plane_result: PlaneResult | None = None
        self._bn_cache: list | None = None

    # data helpers --------------------------------------------------------------------------
    @property
    def _dm(self) -> Any:
        return self.trainer.datamodule

    def _train_subset(self, max_batches: int | None) -> list:
        return split_batches(self._dm, ["train"], max_batches, self.device)["train"]

    def _normalization(self) -> tuple[Any, Any]:
        return data_normalization(self._dm) if self.pixel_space else (None, None)

    def _spec(self) -> Any:
        from lmc.permutation import spec_for

        return spec_for(self.net)

    # alignment ---------------------------------------------------------------------------
    def _ensure_aligned(self) -> None:
        """Correlation-align ``theta_2`` to ``theta_1`` once (kept in the checkpoint)."""
        if bool(self.aligned):
            return
        from lmc.permutation import apply_permutation, correlation_alignment

        spec = self._spec()
        model_a, model_b = copy.deepcopy(self.net), copy.deepcopy(self.net)
        model_a.load_state_dict(self.states[0])
        model_b.load_state_dict(self.states[1])
        with torch.inference_mode(False):
            result = correlation_alignment(
                model_a, model_b, self._train_subset(self.align_batches), spec
            )
        self.align_perm = result.perm
        self.curve.set_end_(apply_permutation(self.states[1], spec, result.perm))
        self.aligned.fill_(True)
        n = len(result.similarity)
        self.align_info = {
            "align_corr_before": sum(result.similarity_before.values()) / n,
            "align_corr_after": sum(result.similarity.values()) / n,
        }
        rank_zero_info(
            f"correlation alignment: mean matched correlation {self.align_info['align_corr_before']:.3f}"
            f" -> {self.align_info['align_corr_after']:.3f}"
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
        if self.attack is not None and self.adversarial_training:
            fixed = {k: v.detach() for k, v in params.items()}
            x = pgd_attack(
                lambda z: forward_at(self.net, fixed, z), x, y, self.attack, *self._normalization()
            )
        out = forward_at(self.net, params, x)
        loss = nn.functional.cross_entropy(out, y)
        penalty = (
            0.5 * self.weight_decay * flat.square().sum()
            if self.weight_decay
            else flat.new_zeros(())
        )
        return loss, penalty, out

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
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
                self._bn_cache = self._train_subset(self.bn_batches)
            prepare_point_(self.net, self.curve, 0.5, self._bn_cache, self.bn_mode)

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
        if self.evaluate_at_fit_end:
            self.evaluate_and_report()

    def summary_extra(self) -> dict[str, Any]:
        """Extra entries for ``summary.json`` (alignment statistics; PAM adds its own)."""
        return dict(self.align_info)

    def evaluate_and_report(self) -> None:
        """Evaluate the curve (and the plane) and log everything."""
        with torch.inference_mode(False):
            self._evaluate_and_report()

    def _evaluate_and_report(self) -> None:
        dm = self._dm
        splits = split_batches(dm, self.splits, self.max_eval_batches, self.device)
        bn = self._train_subset(self.bn_batches)
        mean, std = self._normalization()
        scratch = self.net
        self.evaluation = evaluate_curve(
            scratch,
            self.curve,
            t_grid(self.num_ts),
            splits,
            bn,
            self.bn_mode,
            default_loss(dm),
            self.attack,
            [s for s in self.robust_splits if s in splits],
            self.bn_data,
            mean,
            std,
        )
        if self.plane != "none":
            self.plane_result = self._plane(splits, bn)
        out = log_curve(self.trainer, self.evaluation, self.plane_result, self.summary_extra())
        s = self.evaluation.summary
        last = self.splits[-1]
        rank_zero_info(
            f"\nCurve ({last}): acc min {s.get(f'{last}/acc_min', float('nan')):.4f}, "
            f"mean {s.get(f'{last}/acc_mean', float('nan')):.4f}, arc-length mean "
            f"{s.get(f'{last}/acc_arc_mean', float('nan')):.4f}; loss max "
            f"{s.get(f'{last}/loss_max', float('nan')):.4f}. Figures and summary: {out}\n"
        )

    def _plane(self, splits: dict, bn: list) -> PlaneResult:
        curve = self.curve
        start, end = curve.endpoint(0), curve.endpoint(1)
        if self.plane == "curve":
            points = curve.control_points()
            a, b = end, curve.unflatten(points[len(points) // 2])
            names = ("theta_1", "theta_2", "control")
        elif self.alignment == "none":  # the plane of 002 Fig. 3 needs P theta_2: align now
            from lmc.permutation import apply_permutation, correlation_alignment

            spec = self._spec()
            model_a, model_b = copy.deepcopy(self.net), copy.deepcopy(self.net)
            model_a.load_state_dict(self.states[0])
            model_b.load_state_dict(self.states[1])
            perm = correlation_alignment(model_a, model_b, bn, spec).perm
            a, b = end, apply_permutation(self.states[1], spec, perm)
            names = ("theta_1", "theta_2", "P theta_2")
        else:
            a, b = self.states[1], end
            names = ("theta_1", "theta_2", "P theta_2")
        last = self.splits[-1]
        return plane_grid(
            copy.deepcopy(self.net),
            start,
            a,
            b,
            {last: splits[last]},
            bn,
            self.plane_size,
            self.plane_margin,
            default_loss(self._dm),
            names,
            {"curve": [curve.point_flat(t).detach() for t in t_grid(21)]},
        )
