"""Evaluation along a curve: loss and accuracy per t, BatchNorm per t, min / mean / arc-length
mean (002 Table 1 and App. B), optionally under PGD attack (002 §5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lmc.curves.attack import PGD, adversarial_batches
from lmc.curves.curve import Curve
from lmc.evaluation import LossName, evaluate, has_batchnorm, reset_bn

BNMode = Literal["recompute", "interpolate"]
BNData = Literal["clean", "adversarial"]
Batches = Sequence[Any]


def t_grid(n: int = 61) -> list[float]:
    """``n`` evenly spaced curve parameters from 0 to 1 inclusive (61 by default)."""
    if n < 2:
        raise ValueError(f"a t grid needs at least 2 points, got {n}")
    return np.linspace(0.0, 1.0, n).tolist()


def arc_length_weights(segment_lengths: Sequence[float]) -> list[float]:
    """Trapezoidal weights of the grid points for ``int f ds / int ds``.

    Point ``k`` gets half of each adjacent chord length, normalised to sum to 1. A curve of zero
    length (identical endpoints) falls back to uniform weights.
    """
    lengths = np.asarray(segment_lengths, dtype=float)
    w = np.zeros(len(lengths) + 1)
    w[:-1] += lengths / 2
    w[1:] += lengths / 2
    total = w.sum()
    return (w / total).tolist() if total > 0 else [1.0 / len(w)] * len(w)


def summarize(
    ts: Sequence[float], metrics: Mapping[str, Sequence[float]], weights: Sequence[float]
) -> dict[str, float]:
    """Per metric: ``_min``, ``_max``, ``_mean`` (trapezoid over t), ``_arc_mean`` (weighted by
    arc length, eq. 1 of 002, the number 002 Table 1 reports), ``_start`` and ``_end``."""
    t = np.asarray(ts, dtype=float)
    w = np.asarray(weights, dtype=float)
    # numpy >= 2 names it trapezoid, numpy 1.x only trapz (not in numpy 2's stubs)
    trapz = getattr(np, "trapezoid", None) or vars(np)["trapz"]
    out: dict[str, float] = {}
    for key, values in metrics.items():
        v = np.asarray(values, dtype=float)
        if np.isnan(v).all():
            continue
        out[f"{key}_min"] = float(np.nanmin(v))
        out[f"{key}_max"] = float(np.nanmax(v))
        out[f"{key}_mean"] = float(trapz(v, t) / (t[-1] - t[0])) if len(t) > 1 else float(v[0])
        out[f"{key}_arc_mean"] = float(np.dot(w, v))
        out[f"{key}_start"] = float(v[0])
        out[f"{key}_end"] = float(v[-1])
    return out


@dataclass
class CurveEvaluation:
    """Per-t metrics (``"test/loss"`` -> values), arc-length weights and their summary."""

    ts: list[float]
    metrics: dict[str, list[float]] = field(default_factory=dict)
    weights: list[float] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)


def prepare_point_(
    net: nn.Module,
    curve: Curve,
    t: float,
    bn_batches: Batches | None = None,
    bn_mode: BNMode = "recompute",
) -> nn.Module:
    """Load ``w(t)`` into ``net`` and make its BatchNorm statistics fit for evaluation.

    ``recompute`` re-estimates them exactly on ``bn_batches`` (002 App. B: a pass over train
    data with frozen weights); ``interpolate`` uses ``(1 - t)`` and ``t`` times the endpoints'
    own statistics (cheap; exact only at the endpoints). Returns ``net`` in eval mode.
    """
    if bn_mode not in ("recompute", "interpolate"):
        raise ValueError(f"bn_mode must be 'recompute' or 'interpolate', got {bn_mode!r}")
    curve.load_point_(net, t, buffers="interpolate" if bn_mode == "interpolate" else "keep")
    if bn_mode == "recompute" and has_batchnorm(net):
        if not bn_batches:
            raise ValueError(
                "bn_mode='recompute' needs bn_batches (a train subset) for a network with "
                "BatchNorm; pass them or use bn_mode='interpolate'"
            )
        reset_bn(net, bn_batches)
    return net.eval()


def robust_evaluate(
    net: nn.Module,
    batches: Batches,
    attack: PGD,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    loss: LossName = "cross_entropy",
) -> tuple[float, float]:
    """Loss and accuracy of ``net`` (eval mode) on PGD adversarial versions of ``batches``."""
    net.eval()
    adv = adversarial_batches(net, batches, attack, mean, std)
    r = evaluate(net, adv, loss)
    return r.loss, r.acc


def evaluate_curve(
    net: nn.Module,
    curve: Curve,
    ts: Sequence[float],
    splits: Mapping[str, Batches],
    bn_batches: Batches | None = None,
    bn_mode: BNMode = "recompute",
    loss: LossName = "cross_entropy",
    attack: PGD | None = None,
    robust_splits: Sequence[str] | None = None,
    bn_data: BNData = "clean",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    on_point: Callable[[], None] | None = None,
) -> CurveEvaluation:
    """Loss and accuracy of ``w(t)`` at every ``t`` on every split (002 Fig. 3, Table 1).

    ``on_point`` (optional) is called after every ``t`` is evaluated (progress reporting).

    ``net`` is reused for every point (its parameters and buffers are overwritten in place).
    With ``attack``, the splits in ``robust_splits`` (default: all) are also evaluated on PGD
    examples crafted against each point (``split/robust_loss``, ``split/robust_acc``); for those,
    BatchNorm is re-estimated on clean ``bn_batches`` or, with ``bn_data="adversarial"``, on
    their adversarial versions (crafted against the clean-statistics point).

    Args:
        net: a network of the curve's architecture (a scratch copy: it is overwritten).
        curve: the curve.
        ts: curve parameters, e.g. :func:`t_grid`.
        splits: split name -> batches of ``(x, y)`` (cache them with ``cache_batches``).
        bn_batches: train subset for BatchNorm re-estimation.
        bn_mode: ``recompute`` (default) or ``interpolate``, see :func:`prepare_point_`.
        loss: loss name of :func:`~lmc.evaluation.evaluate`.
        attack, robust_splits, bn_data, mean, std: robust evaluation (``mean``/``std``: data
            normalisation for a pixel-space attack).
    """
    if bn_data not in ("clean", "adversarial"):
        raise ValueError(f"bn_data must be 'clean' or 'adversarial', got {bn_data!r}")
    ts = [float(t) for t in ts]
    res = CurveEvaluation(ts=ts)
    robust = list(splits) if robust_splits is None else list(robust_splits)
    for t in ts:
        prepare_point_(net, curve, t, bn_batches, bn_mode)
        for split, batches in splits.items():
            r = evaluate(net, batches, loss)
            res.metrics.setdefault(f"{split}/loss", []).append(r.loss)
            res.metrics.setdefault(f"{split}/acc", []).append(r.acc)
        if attack is not None:
            if bn_data == "adversarial" and has_batchnorm(net) and bn_batches:
                reset_bn(net, adversarial_batches(net.eval(), bn_batches, attack, mean, std))
            for split in robust:
                rl, ra = robust_evaluate(net, splits[split], attack, mean, std, loss)
                res.metrics.setdefault(f"{split}/robust_loss", []).append(rl)
                res.metrics.setdefault(f"{split}/robust_acc", []).append(ra)
        if on_point is not None:
            on_point()
    res.weights = arc_length_weights(curve.segment_lengths(ts))
    res.summary = summarize(ts, res.metrics, res.weights)
    return res


@torch.no_grad()
def curve_objective(
    net: nn.Module,
    curve: Curve,
    batches: Batches,
    ts: Sequence[float],
    end: Tensor | None = None,
    loss_fn: Any = nn.functional.cross_entropy,
) -> float:
    """Monte-Carlo estimate of the curve-finding objective ``E_t L(w(t))`` (002 eq. 1/5).

    Mean training loss over every ``t`` in ``ts`` and every batch, with the network in train
    mode (BatchNorm on batch statistics, as during curve training) and ``end`` optionally
    replacing the second endpoint; ``net``'s buffers are restored afterwards. Fixed ``ts`` and ``batches`` make estimates comparable
    (common random numbers), e.g. before and after PAM or between candidate permutations.
    """
    from lmc.curves.curve import forward_at

    was = net.training
    saved = {k: b.clone() for k, b in net.named_buffers()}
    net.train()
    total, n = 0.0, 0
    try:
        for t in ts:
            params = curve.point(t, end=end)
            for x, y, *_ in batches:
                total += float(loss_fn(forward_at(net, params, x), y)) * x.shape[0]
                n += x.shape[0]
    finally:
        net.train(was)
        bufs = dict(net.named_buffers())
        for k, b in saved.items():
            bufs[k].copy_(b)
    if n == 0:
        raise ValueError("curve_objective got no batches")
    return total / n
