"""A whole interpolation study: match, interpolate, repair, evaluate, summarise (000 §4, 004 §5).

Pure orchestration over the other functions of this package and :mod:`lmc.permutation`, so a
notebook can run the same study as ``lmc validate`` without a Trainer.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lmc.evaluation import LossName, evaluate, evaluate_many, has_batchnorm, reset_bn
from lmc.interpolation.barrier import BarrierDefinition, alpha_grid, barrier, check_definition
from lmc.interpolation.repair import (
    average_stats,
    channel_stats,
    interpolate_stats,
    repair,
    repair_points,
)
from lmc.interpolation.states import check_compatible, load_lerp_, weighted_average
from lmc.io import load_state
from lmc.permutation.spec import PermutationSpec

Matcher = str  # a name registered in lmc.permutation.MATCHERS
Repair = Literal["none", "reset_bn", "repair"]
StateDict = Mapping[str, Tensor]
Batches = Sequence[Any]
# the Barrier fields a study summarises as barrier_<field>_<variant>
BARRIER_SUMMARY_KEYS = (
    "loss",
    "acc",
    "loss_normalized",
    "loss_chord",
    "loss_abs_chord",
    "loss_normalized_chord",
    "loss_normalized_abs_chord",
)


@dataclass
class PathResult:
    """Per-alpha metrics of one path on every split, with and without repair."""

    alphas: list[float]
    metrics: dict[str, list[float]] = field(default_factory=dict)  # "test/loss" -> values
    barriers: dict[str, dict[str, float]] = field(default_factory=dict)  # "test" -> Barrier dict


@dataclass
class StudyResult:
    """Everything an interpolation study measured (see :func:`interpolation_study`)."""

    paths: dict[str, PathResult]
    merges: dict[str, dict[str, float]]
    matched_states: list[dict[str, Tensor]]
    timings: dict[str, float]
    summary: dict[str, float]
    # N > 2: the uniform merge of the matched states as evaluated (after the study's repair)
    matched_merge: dict[str, Tensor] | None = None


def match_states(
    net: nn.Module,
    states: Sequence[StateDict],
    matcher: Matcher,
    align_batches: Batches | None = None,
    seed: int = 0,
    spec: PermutationSpec | None = None,
) -> tuple[list[dict[str, Tensor]], dict[str, Any]]:
    """Permute models 1..N-1 onto model 0 (N=2) or onto each other by MergeMany (N>2) with the
    matcher registered as ``matcher`` (:data:`lmc.permutation.MATCHERS`).

    Returns the aligned states (model 0 unchanged) and matching diagnostics.
    """
    from lmc.permutation import match, spec_for

    dense = [dict(s) for s in states]
    if matcher == "none":
        return dense, {}
    spec = spec if spec is not None else spec_for(net)
    result = match(matcher, net, dense, spec, batches=align_batches, seed=seed)
    return result.apply(dense, spec), result.info


def _evaluate_point(
    model: nn.Module,
    splits: Mapping[str, Batches],
    loss: LossName,
    prefix: str,
    out: dict[str, list[float]],
) -> None:
    for split, batches in splits.items():
        r = evaluate(model, batches, loss)
        out.setdefault(f"{split}/loss{prefix}", []).append(r.loss)
        out.setdefault(f"{split}/acc{prefix}", []).append(r.acc)


#: the stacked states of one vectorised evaluation stay under this many bytes (a path's points
#: are evaluated in chunks of as many as fit)
VECTORIZE_BYTES = 1 << 30


def _evaluate_path_vectorized(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    splits: Mapping[str, Batches],
    alphas: Sequence[float],
    loss: LossName,
    out: dict[str, list[float]],
    on_point: Callable[[], None] | None,
) -> None:
    """Every point of the path as one vectorised model per chunk of alphas (the points'
    states stacked; :func:`lmc.evaluation.evaluate_many`), in alpha order into ``out``."""
    device = next(model.parameters()).device
    names = {n for n, _ in model.named_parameters()}
    state = {k: v.to(device) for k, v in a.items()}
    other = {k: v.to(device) for k, v in b.items()}
    size = sum(v.numel() * v.element_size() for v in state.values())
    chunk = max(1, min(len(alphas), VECTORIZE_BYTES // max(size, 1)))
    for start in range(0, len(alphas), chunk):
        part = alphas[start : start + chunk]
        stacked = {
            k: torch.stack(
                [torch.lerp(v, other[k], al) if v.is_floating_point() else v for al in part]
            )
            for k, v in state.items()
        }
        params = {k: v for k, v in stacked.items() if k in names}
        buffers = {k: v for k, v in stacked.items() if k not in names}
        for split, batches in splits.items():
            for r in evaluate_many(model, params, buffers, batches, loss):
                out.setdefault(f"{split}/loss", []).append(r.loss)
                out.setdefault(f"{split}/acc", []).append(r.acc)
        if on_point is not None:
            for _ in part:
                on_point()


def _evaluate_path_points(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    splits: Mapping[str, Batches],
    alphas: Sequence[float],
    loss: LossName,
    repair_mode: Repair,
    align_batches: Batches | None,
    on_point: Callable[[], None] | None,
    out: dict[str, list[float]],
) -> float:
    """The path's points one by one in ``model`` (repaired when asked) into ``out``; returns
    the seconds spent repairing."""
    repair_seconds = 0.0
    stats_a = stats_b = None
    if repair_mode == "repair":
        assert align_batches is not None  # a repair needs the alignment batches
        points = repair_points(model)
        load_state(model, a)
        stats_a = channel_stats(model, align_batches, points)
        load_state(model, b)
        stats_b = channel_stats(model, align_batches, points)
    for alpha in alphas:
        load_lerp_(model, a, b, alpha)
        if repair_mode != "none":
            assert align_batches is not None  # a repair needs the alignment batches
            _evaluate_point(model, splits, loss, "_raw", out)
            start = time.perf_counter()
            if repair_mode == "reset_bn":
                reset_bn(model, align_batches)
            else:
                assert stats_a is not None and stats_b is not None  # set above for "repair"
                repair(model, interpolate_stats(stats_a, stats_b, alpha), align_batches)
            repair_seconds += time.perf_counter() - start
        _evaluate_point(model, splits, loss, "", out)
        if on_point is not None:
            on_point()
    return repair_seconds


def interpolate_path(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    splits: Mapping[str, Batches],
    alphas: Sequence[float],
    loss: LossName = "cross_entropy",
    repair_mode: Repair = "none",
    align_batches: Batches | None = None,
    on_point: Callable[[], None] | None = None,
    barrier_definition: BarrierDefinition = "chord",
    vectorize: bool | None = None,
) -> tuple[PathResult, float]:
    """Evaluate ``(1 - alpha) a + alpha b`` at every alpha on every split (``on_point``, if
    given, is called after each alpha: progress reporting).

    With a repair mode, each point is evaluated as is (``split/loss_raw``) and after repair
    (``split/loss``); without, ``split/loss`` is the plain interpolation. ``model`` is reused
    for every point (its state is overwritten in place). Returns the path and the seconds spent
    repairing. Its barriers are in ``barrier_definition`` (``chord`` or ``abs_chord``,
    :mod:`lmc.interpolation.barrier`; both loss barriers are kept).

    ``vectorize``: evaluate the path's points together, as one vectorised model per chunk (the
    same numbers up to the order of floating-point sums; no repair). ``None`` (default): on a
    GPU without repair, where one small model per point leaves the device idle; on the CPU the
    points run one by one, as before.
    """
    check_definition(barrier_definition)
    res = PathResult(alphas=list(alphas))
    if vectorize and repair_mode != "none":
        raise ValueError(
            f"vectorize=True evaluates the points as they are, but repair={repair_mode!r} "
            "changes each one first: use vectorize=None (or False) with a repair"
        )
    if vectorize is None:
        vectorize = repair_mode == "none" and next(model.parameters()).is_cuda
    if vectorize:
        _evaluate_path_vectorized(model, a, b, splits, alphas, loss, res.metrics, on_point)
        repair_seconds = 0.0
    else:
        repair_seconds = _evaluate_path_points(
            model, a, b, splits, alphas, loss, repair_mode, align_batches, on_point, res.metrics
        )
    for split in splits:
        for suffix in ("", "_raw") if repair_mode != "none" else ("",):
            accs = res.metrics[f"{split}/acc{suffix}"] if loss == "cross_entropy" else None
            losses = res.metrics[f"{split}/loss{suffix}"]
            b_ = barrier(res.alphas, losses, accs, barrier_definition)
            res.barriers[f"{split}{suffix}"] = b_.as_dict()
    return res, repair_seconds


def _repair_merged(
    model: nn.Module,
    states: Sequence[StateDict],
    merged: StateDict,
    repair_mode: Repair,
    align_batches: Batches | None,
) -> None:
    load_state(model, merged)
    if repair_mode == "reset_bn":
        assert align_batches is not None  # a repair needs the alignment batches
        reset_bn(model, align_batches)
    elif repair_mode == "repair":
        assert align_batches is not None  # a repair needs the alignment batches
        points = repair_points(model)
        stats = []
        for s in states:
            load_state(model, s)
            stats.append(channel_stats(model, align_batches, points))
        load_state(model, merged)
        repair(model, average_stats(stats), align_batches)


def interpolation_study(
    net: nn.Module,
    states: Sequence[StateDict],
    splits: Mapping[str, Batches],
    matcher: Matcher = "weight",
    repair_mode: Repair = "none",
    align_batches: Batches | None = None,
    num_alphas: int = 25,
    loss: LossName = "cross_entropy",
    seed: int = 0,
    names: Sequence[str] | None = None,
    spec: PermutationSpec | None = None,
    on_path: Callable[[str, PathResult], None] | None = None,
    on_point: Callable[[], None] | None = None,
    barrier_definition: BarrierDefinition = "chord",
    vectorize: bool | None = None,
) -> StudyResult:
    """Barriers between models before and after matching, and their merges.

    For two models: the naive path and (unless ``matcher="none"``) the matched path, each over
    ``num_alphas`` points on every split. For N > 2: every pair, the uniform merge of the
    originals and of the aligned models (MergeMany for weight matching), each compared with the
    mean of the endpoints. Summary keys: ``barrier_loss_{naive,matched}``,
    ``barrier_acc_{naive,matched}``, ``barrier_loss_normalized_*`` on the last split given
    (put ``test`` last), averaged over pairs when N > 2, in ``barrier_definition`` (``chord``:
    the largest rise above the chord; ``abs_chord``: the largest distance from it, 000 Def.
    2.1); ``barrier_loss_{chord,abs_chord}_*`` and ``barrier_loss_normalized_{chord,abs_chord}_*``
    keep both definitions. ``spec`` is the permutation spec (default: the built-in network's,
    :func:`~lmc.permutation.spec_for`). ``vectorize``: each path's points as one vectorised
    model (:func:`interpolate_path`; default on a GPU without repair).
    """
    check_definition(barrier_definition, "barrier_definition")
    if len(states) < 2:
        raise ValueError(f"an interpolation study needs at least 2 models, got {len(states)}")
    if repair_mode != "none" and align_batches is None:
        raise ValueError(f"repair={repair_mode!r} needs the alignment subset")
    if repair_mode == "reset_bn" and not has_batchnorm(net):
        raise ValueError("repair='reset_bn' but the network has no BatchNorm; use repair='repair'")
    check_compatible(states, names)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    aligned, _ = match_states(net, states, matcher, align_batches, seed, spec)
    timings["matching_seconds"] = time.perf_counter() - start

    model = copy.deepcopy(net)
    paths: dict[str, PathResult] = {}
    alphas = alpha_grid(num_alphas)
    variants = {"naive": states} if matcher == "none" else {"naive": states, "matched": aligned}
    timings["repair_seconds"] = 0.0
    start = time.perf_counter()
    for i, j in combinations(range(len(states)), 2):
        for variant, group in variants.items():
            name = variant if len(states) == 2 else f"{variant}_{i}_{j}"
            paths[name], rs = interpolate_path(
                model,
                group[i],
                group[j],
                splits,
                alphas,
                loss,
                repair_mode,
                align_batches,
                on_point,
                barrier_definition,
                vectorize,
            )
            timings["repair_seconds"] += rs
            if on_path is not None:
                on_path(name, paths[name])
    timings["interpolation_seconds"] = time.perf_counter() - start - timings["repair_seconds"]

    merges: dict[str, dict[str, float]] = {}
    matched_merge = None
    if len(states) > 2:
        for variant, group in variants.items():
            _repair_merged(model, group, weighted_average(group), repair_mode, align_batches)
            if variant == "matched":
                matched_merge = {k: v.detach().clone() for k, v in model.state_dict().items()}
            merges[variant] = {}
            for split, batches in splits.items():
                r = evaluate(model, batches, loss)
                merges[variant][f"{split}/loss"] = r.loss
                merges[variant][f"{split}/acc"] = r.acc
        merges["endpoints_mean"] = {}
        for split, batches in splits.items():
            endpoint = []
            for s in states:
                load_state(model, s)
                endpoint.append(evaluate(model, batches, loss))
            merges["endpoints_mean"][f"{split}/loss"] = sum(r.loss for r in endpoint) / len(
                endpoint
            )
            merges["endpoints_mean"][f"{split}/acc"] = sum(r.acc for r in endpoint) / len(endpoint)

    last = list(splits)[-1]
    summary: dict[str, float] = {}
    for variant in variants:
        names_ = [p for p in paths if p == variant or p.startswith(f"{variant}_")]
        for key in BARRIER_SUMMARY_KEYS:
            vals = [paths[p].barriers[last][key] for p in names_]
            summary[f"barrier_{key}_{variant}"] = float(sum(vals) / len(vals))
        for stat in ("loss", "acc"):
            ends = [paths[p].metrics[f"{last}/{stat}"] for p in names_]
            summary[f"endpoint_{stat}_mean"] = float(
                sum(e[0] + e[-1] for e in ends) / (2 * len(ends))
            )
    for variant, merge in merges.items():
        for k, v in merge.items():
            summary[f"merge_{variant}_{k.replace('/', '_')}"] = v
    summary.update(timings)
    return StudyResult(paths, merges, aligned, timings, summary, matched_merge)
