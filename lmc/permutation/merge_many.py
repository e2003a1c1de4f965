"""MergeMany: weight matching of N models to a common reference (Ainsworth et al. 2023, App. A.10;
the baseline of 004 §5).

Each model in turn (random order) is weight-matched to the mean of the others' permuted
weights; rounds repeat until the total squared distance of the permuted models to their mean
stops falling. Each model's matching state (permutation and LAP duals) is carried from round to
round, so with ``method="accelerated"`` later rounds warm-start (004 §4.2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from lmc.permutation.apply import apply_permutation
from lmc.permutation.spec import Permutation, PermutationSpec, StateDict, check_same_architecture
from lmc.permutation.weight_matching import (
    MatchingState,
    Method,
    PassedMatchingOptions,
    _resolve_spec,
    as_state_dict,
    weight_matching,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass
class MergeManyResult:
    """Outcome of :func:`merge_many`.

    Attributes:
        perms: one permutation per model; ``apply_permutation(states[i], spec, perms[i])``.
        merged: the mean of the permuted models (non-float entries from the first model).
        history: total squared distance ``sum_i ||pi_i(theta_i) - mean||^2`` initially and
            after every round.
        rounds: number of rounds run.
        seconds: wall time.
    """

    perms: list[Permutation]
    merged: dict[str, Tensor]
    history: list[float]
    rounds: int
    seconds: float


def _mean(states: Sequence[StateDict], keys: list[str]) -> dict[str, Tensor]:
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in keys}


def _distance(states: Sequence[StateDict], mean: StateDict, keys: list[str]) -> float:
    return sum(
        float(((s[k] - mean[k]) ** 2).sum(dtype=torch.float64)) for s in states for k in keys
    )


def merge_many(
    models: Sequence[StateDict | nn.Module],
    spec: PermutationSpec | None = None,
    *,
    method: Method = "accelerated",
    max_rounds: int = 100,
    tol: float = 1e-9,
    seed: int = 0,
    **wm_kwargs: Unpack[PassedMatchingOptions],
) -> MergeManyResult:
    """Align ``N >= 2`` models to each other and average them.

    Args:
        models: state dicts or modules of one architecture.
        spec: permutation spec; built-in if omitted and modules are given.
        method: weight-matching method for each inner call.
        max_rounds: upper bound on rounds.
        tol: stop when a round lowers the total distance by less than ``tol`` times it.
        seed: seed of the model order and of the inner weight matching.
        **wm_kwargs: passed to :func:`~lmc.permutation.weight_matching` (e.g. ``solver``).

    Raises:
        SpecError: the models differ in architecture or contain NaN/inf.
    """
    t0 = time.perf_counter()
    if len(models) < 2:
        raise ValueError(f"merge_many needs at least two models, got {len(models)}")
    spec = _resolve_spec(spec, *models)
    states = [as_state_dict(m) for m in models]
    for i, s in enumerate(states[1:], start=1):
        check_same_architecture(states[0], s, ("model 0", f"model {i}"))
    sizes = spec.sizes(states[0])
    keys = [k for k, t in states[0].items() if t.dtype.is_floating_point]
    n = len(states)
    device = states[0][keys[0]].device if keys else None  # weight_matching's device
    perms: list[Permutation] = [
        {g: torch.arange(m, device=device) for g, m in sizes.items()} for _ in range(n)
    ]
    wm_state: list[MatchingState | None] = [None] * n
    permuted = [dict(s) for s in states]
    mean = _mean(permuted, keys)
    history = [_distance(permuted, mean, keys)]
    rng = np.random.default_rng(seed)
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        for i in rng.permutation(n):
            others = [permuted[j] for j in range(n) if j != i]
            target = _mean(others, keys)
            res = weight_matching(
                target,
                {k: states[i][k] for k in keys},
                spec.restrict(keys),
                method=method,
                init=wm_state[i] if wm_state[i] is not None else perms[i],
                seed=int(rng.integers(2**31)),
                **wm_kwargs,
            )
            wm_state[i], perms[i] = res.state, res.perm
            permuted[i] = apply_permutation(states[i], spec, perms[i], check=False)
        mean = _mean(permuted, keys)
        history.append(_distance(permuted, mean, keys))
        if history[-2] - history[-1] <= tol * history[-2]:
            break
    merged = {k: (mean[k] if k in mean else states[0][k]) for k in states[0]}
    return MergeManyResult(perms, merged, history, rounds, time.perf_counter() - t0)
