"""Evaluation of a multi-model merge (004 §5, §6; SPEC C4): the merged model 1/n sum_i pi_i(theta_i)
against the mean of the originals, the average pairwise merged loss (Fig. 4), the geometry of
the permuted models (§6.1) and the sharpness tr(H ⊙ θθᵀ) of the merge vs the originals (§6.2).

BatchNorm networks get their running statistics re-estimated on the alignment subset of the
training data (``reset_bn``) for every merged model they are evaluated at (004 App. B.1); the
originals keep their own statistics. Networks without BatchNorm are evaluated as they are.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch
from torch import Tensor, nn

from lmc.evaluation import LossName, batch_loss, evaluate, has_batchnorm, reset_bn
from lmc.interpolation.states import weighted_average
from lmc.io import load_state
from lmc.merging.baselines import parameter_keys
from lmc.merging.contract import Merged
from lmc.merging.geometry import describe, distance_ratios, pairwise_distances, triplet_angles
from lmc.metrics import hutchinson_trace
from lmc.permutation import PermutationSpec, apply_permutation

StateDict = Mapping[str, Tensor]
Batches = Sequence[Any]


@dataclass
class OriginalStats:
    """Per-model metrics of the unmerged models: ``metrics[i]["test/loss"]`` and sharpness,
    and (where kept) every model's outputs per split and batch, for the ensemble."""

    metrics: list[dict[str, float]]
    sharpness: list[float] = field(default_factory=list)
    outputs: list[dict[str, list[Tensor]]] = field(default_factory=list)
    #: the label sets of a disjoint-task split, each also scored on its own (``task{j}_acc``)
    tasks: list[list[int]] = field(default_factory=list)

    def prefix(self, n: int) -> OriginalStats:
        """The statistics of the first ``n`` models."""
        return OriginalStats(self.metrics[:n], self.sharpness[:n], self.outputs[:n], self.tasks)

    def mean(self, key: str) -> float:
        return sum(m[key] for m in self.metrics) / len(self.metrics)

    def ensemble(self, splits: Mapping[str, Batches], loss: LossName) -> dict[str, float]:
        """``{split}/ensemble_loss`` and ``{split}/ensemble_acc`` of the models' output
        ensemble (their outputs averaged: the ceiling a merge into one model aims at)."""
        if not self.outputs:
            return {}
        scores = _scores(self.outputs, splits, loss, self.tasks)
        return {k.replace("/", "/ensemble_"): v for k, v in scores.items()}


def _outputs(model: nn.Module, splits: Mapping[str, Batches]) -> dict[str, list[Tensor]]:
    """The model's outputs (eval mode) on every split's batches."""
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        return {s: [model(b[0].to(device)) for b in batches] for s, batches in splits.items()}


def _scores(
    outputs: Sequence[Mapping[str, list[Tensor]]],
    splits: Mapping[str, Batches],
    loss: LossName,
    tasks: Sequence[Sequence[int]] = (),
) -> dict[str, float]:
    """``{split}/loss`` and ``{split}/acc`` of the mean of the models' ``outputs`` on every
    split's batches (one model: its own scores, as :func:`lmc.evaluation.evaluate`), and per
    task ``j`` of ``tasks`` ``{split}/task{j}_acc``: on the examples of its labels, the
    prediction among its labels only (the task's own head, ZipIt!'s per-task accuracy)."""
    out: dict[str, float] = {}
    for split, batches in splits.items():
        total, correct, n = 0.0, 0, 0
        right, seen = [0] * len(tasks), [0] * len(tasks)
        for b, batch in enumerate(batches):
            mean = torch.stack([o[split][b] for o in outputs]).mean(0)
            y = batch[1].to(mean.device)
            total += float(batch_loss(mean, y, loss))
            correct += int((mean.argmax(1) == y).sum()) if loss == "cross_entropy" else 0
            n += y.shape[0]
            for j, labels in enumerate(tasks):
                ids = torch.as_tensor(labels, device=y.device)
                mask = torch.isin(y, ids)
                pred = ids[mean[mask][:, ids].argmax(1)]
                right[j] += int((pred == y[mask]).sum())
                seen[j] += int(mask.sum())
        if n == 0:
            raise ValueError(f"cannot evaluate on an empty {split!r} split")
        out[f"{split}/loss"] = total / n
        out[f"{split}/acc"] = correct / n if loss == "cross_entropy" else math.nan
        for j in range(len(tasks)):
            out[f"{split}/task{j}_acc"] = right[j] / seen[j] if seen[j] else math.nan
    return out


@dataclass
class MergeEvaluation:
    """Everything measured for one method and one number of models.

    ``metrics`` keys: ``{split}/loss``, ``{split}/acc`` of the merge, ``{split}/originals_loss``,
    ``{split}/originals_acc`` (means over the n originals), ``{split}/loss_gap`` and
    ``{split}/acc_gap`` (merge minus mean of originals, 004 Fig. 3b), the originals' output
    ensemble ``{split}/ensemble_loss`` and ``{split}/ensemble_acc``, on pairwise splits
    ``{split}/pairwise_loss``, ``{split}/pairwise_acc`` and ``{split}/pairwise_loss_gap`` (004
    Fig. 4), ``distance_ratio_{mean,std,min,max}``, ``angle_{mean,std,min,max}`` (§6.1) and,
    when measured, ``sharpness`` and ``originals_sharpness`` (§6.2).
    """

    method: str
    n: int
    metrics: dict[str, float]
    distance_ratios: list[float]
    angles: list[float]


def _sharpness(model: nn.Module, batches: Batches, loss: LossName, probes: int, seed: int) -> float:
    def loss_fn(out: Tensor, y: Tensor) -> Tensor:
        return batch_loss(out, y, loss) / y.shape[0]

    # callers may run under inference mode (e.g. a validation loop): the Hessian-vector
    # products need autograd and batches that are not inference tensors
    with torch.inference_mode(False), torch.enable_grad():
        data = [(x.clone(), y.clone()) for x, y in batches]
        return hutchinson_trace(model, loss_fn, data, num_probes=probes, seed=seed).mean


def _eval_splits(
    model: nn.Module, splits: Mapping[str, Batches], loss: LossName
) -> dict[str, float]:
    out = {}
    for split, batches in splits.items():
        r = evaluate(model, batches, loss)
        out[f"{split}/loss"], out[f"{split}/acc"] = r.loss, r.acc
    return out


def evaluate_originals(
    net: nn.Module,
    states: Sequence[StateDict],
    splits: Mapping[str, Batches],
    *,
    loss: LossName = "cross_entropy",
    sharpness_batches: Batches | None = None,
    sharpness_probes: int = 0,
    seed: int = 0,
    tasks: Sequence[Sequence[int]] | None = None,
) -> OriginalStats:
    """Loss/accuracy of every original model on every split (and per task of ``tasks``, the
    label sets of a disjoint-task split), and its sharpness if asked; its outputs are kept for
    the ensemble (:meth:`OriginalStats.ensemble`)."""
    model = copy.deepcopy(net)
    stats = OriginalStats([], tasks=[list(t) for t in tasks or ()])
    for state in states:
        load_state(model, state)
        outputs = _outputs(model, splits)
        stats.outputs.append(outputs)
        stats.metrics.append(_scores([outputs], splits, loss, stats.tasks))
        if sharpness_probes > 0 and sharpness_batches:
            stats.sharpness.append(
                _sharpness(model, sharpness_batches, loss, sharpness_probes, seed)
            )
    return stats


def _load_merge(
    model: nn.Module, states: Sequence[StateDict], align_batches: Batches | None
) -> nn.Module:
    load_state(model, weighted_average(states))
    if has_batchnorm(model):
        if align_batches is None:
            raise ValueError("a BatchNorm network's merge needs the alignment subset for reset_bn")
        reset_bn(model, align_batches)
    return model


def evaluate_merge(
    net: nn.Module,
    aligned: Sequence[StateDict] | None,
    splits: Mapping[str, Batches],
    originals: OriginalStats,
    *,
    merged: StateDict | None = None,
    heads: int = 0,
    ensemble: Mapping[str, float] | None = None,
    method: str = "merge",
    loss: LossName = "cross_entropy",
    align_batches: Batches | None = None,
    pairwise: bool = True,
    pairwise_splits: Sequence[str] | None = None,
    sharpness_batches: Batches | None = None,
    sharpness_probes: int = 0,
    seed: int = 0,
) -> MergeEvaluation:
    """Evaluate the merge of the permuted models ``aligned`` (``[pi_i(theta_i)]``), or a merged
    state of a method that does not permute (``aligned=None``: no pairwise merges, no geometry).

    Args:
        net: the architecture (copied; not modified).
        aligned: the n permuted models' full state dicts, or ``None``.
        merged: the merged state (default the average of ``aligned``); its widths may differ
            from ``net``'s.
        heads: ``merged`` is the state of a :class:`~lmc.models.MultiHead` of this many members.
        ensemble: the originals' output-ensemble scores (default computed here; a sweep
            computes them once per n for all its methods).
        splits: split name -> cached ``(x, y)`` batches (``train`` = the alignment subset).
        originals: :func:`evaluate_originals` of the same n models (use ``.prefix(n)``).
        method: label stored in the result.
        loss: evaluation loss.
        align_batches: train data for ``reset_bn`` (BatchNorm networks only).
        pairwise: evaluate every pair's midpoint (n(n-1)/2 evaluations) on ``pairwise_splits``
            (default: the last split).
        sharpness_batches: fixed batches for the Hutchinson estimate; ``sharpness_probes`` > 0
            turns it on (same probes and seed as for the originals).
        seed: seed of the sharpness probes.
    """
    if aligned is None and merged is None:
        raise ValueError("give the permuted models (aligned) or the merged state (merged)")
    n = len(aligned) if aligned is not None else len(originals.metrics)
    if len(originals.metrics) != n:
        raise ValueError(f"got {n} aligned models but statistics of {len(originals.metrics)}")
    metrics: dict[str, float] = {}
    if merged is None:
        assert aligned is not None  # checked above: one of the two is given
        model = _load_merge(copy.deepcopy(net), aligned, align_batches)
    else:
        shell = Merged(dict(merged), heads=heads).model(net)
        model = _load_merge(shell, [merged], align_batches)
    for key, value in _scores([_outputs(model, splits)], splits, loss, originals.tasks).items():
        split, stat = key.split("/")
        metrics[key] = value
        base = originals.mean(key)
        metrics[f"{split}/originals_{stat}"] = base
        metrics[f"{split}/{stat}_gap"] = value - base
    metrics.update(originals.ensemble(splits, loss) if ensemble is None else ensemble)
    if sharpness_probes > 0 and sharpness_batches:
        metrics["sharpness"] = _sharpness(model, sharpness_batches, loss, sharpness_probes, seed)
        if originals.sharpness:
            metrics["originals_sharpness"] = sum(originals.sharpness) / len(originals.sharpness)
    if aligned is None:
        return MergeEvaluation(method, n, metrics, [], [])
    if pairwise:
        names = list(pairwise_splits) if pairwise_splits else [list(splits)[-1]]
        sums: dict[str, float] = {}
        pairs = list(combinations(range(n), 2))
        for i, j in pairs:
            _load_merge(model, [aligned[i], aligned[j]], align_batches)
            for key, value in _eval_splits(model, {s: splits[s] for s in names}, loss).items():
                sums[key] = sums.get(key, 0.0) + value
        for key, total in sums.items():
            split, stat = key.split("/")
            metrics[f"{split}/pairwise_{stat}"] = total / len(pairs)
            if stat == "loss":
                metrics[f"{split}/pairwise_loss_gap"] = total / len(pairs) - originals.mean(key)
    dist = pairwise_distances(aligned, parameter_keys(net))
    ratios, angles = distance_ratios(dist), triplet_angles(dist)
    for name, values in (("distance_ratio", ratios), ("angle", angles)):
        for stat, v in describe(values).items():
            metrics[f"{name}_{stat}"] = v
    metrics["distance_mean"] = float(dist.sum() / max(n * (n - 1), 1))
    return MergeEvaluation(method, n, metrics, ratios, angles)


@dataclass
class MergeSweep:
    """Evaluations of every method at every n, and the originals' own metrics."""

    evaluations: list[MergeEvaluation]
    originals: OriginalStats

    def summary(self) -> dict[str, float]:
        """Flat ``{method}/n{n}/{metric}`` -> value, plus ``originals/model{i}/{metric}``."""
        out: dict[str, float] = {}
        for ev in self.evaluations:
            for key, value in ev.metrics.items():
                out[f"{ev.method}/n{ev.n}/{key}"] = value
        for i, m in enumerate(self.originals.metrics):
            for key, value in m.items():
                out[f"originals/model{i}/{key}"] = value
        for i, v in enumerate(self.originals.sharpness):
            out[f"originals/model{i}/sharpness"] = v
        return out


def evaluate_sweep(
    net: nn.Module,
    states: Sequence[StateDict],
    spec: PermutationSpec,
    merges: Mapping[str, Mapping[int, Merged]],
    splits: Mapping[str, Batches],
    *,
    loss: LossName = "cross_entropy",
    align_batches: Batches | None = None,
    pairwise: bool = True,
    pairwise_splits: Sequence[str] | None = None,
    sharpness_batches: Batches | None = None,
    sharpness_probes: int = 0,
    seed: int = 0,
    tasks: Sequence[Sequence[int]] | None = None,
) -> MergeSweep:
    """:func:`evaluate_merge` for every method and every n (merging the first n of ``states``).

    Args:
        merges: method -> n -> its :class:`~lmc.merging.Merged` of the first n models (e.g.
            :func:`~lmc.merging.merge_sweep`'s); a merge with permutations is evaluated with
            its pairwise merges and geometry, one without on its merged state alone.
        tasks: the label sets of a disjoint-task split: every model is also scored per task
            (``{split}/task{j}_acc``, with its originals' mean, gap and ensemble).
        Others: as in :func:`evaluate_merge`; the originals are evaluated once.
    """
    sizes = [n for by_n in merges.values() for n in by_n]
    if not sizes:
        raise ValueError("nothing to evaluate: no method has a merge")
    top = max(sizes)
    originals = evaluate_originals(
        net,
        states[:top],
        splits,
        loss=loss,
        sharpness_batches=sharpness_batches,
        sharpness_probes=sharpness_probes,
        seed=seed,
        tasks=tasks,
    )
    prefixes = {n: originals.prefix(n) for n in set(sizes)}
    ensembles = {n: stats.ensemble(splits, loss) for n, stats in prefixes.items()}
    evaluations = []
    for method, by_n in merges.items():
        for n in sorted(by_n):
            result = by_n[n]
            aligned = None
            if result.perms is not None:
                aligned = [apply_permutation(s, spec, p) for s, p in zip(states[:n], result.perms)]
            evaluations.append(
                evaluate_merge(
                    net,
                    aligned,
                    splits,
                    prefixes[n],
                    merged=None if aligned is not None else result.state,
                    heads=result.heads,
                    ensemble=ensembles[n],
                    method=method,
                    loss=loss,
                    align_batches=align_batches,
                    pairwise=pairwise,
                    pairwise_splits=pairwise_splits,
                    sharpness_batches=sharpness_batches,
                    sharpness_probes=sharpness_probes,
                    seed=seed,
                )
            )
    return MergeSweep(evaluations, originals)
