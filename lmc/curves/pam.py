"""Proximal Alternating Minimization over (curve, permutation) (002 §3, App. E, eq. 34).

PAM alternates

* a permutation subproblem: with the curve offsets fixed, minimise the curve objective over
  block doubly-stochastic relaxations ``D`` of the permutation of ``theta_2`` by projected SGD
  (:func:`soft_permute` makes ``D theta_2`` differentiable in ``D``; after every step each block
  goes back to the Birkhoff polytope with
  :func:`~lmc.curves.birkhoff.project_doubly_stochastic`), then round ``D`` to a permutation
  (:func:`round_pam`, App. E.4: the previous permutation, the Hungarian projection and
  permutations sampled from greedy BvN decompositions are scored and the best one kept);
* a curve subproblem: ordinary curve training with the second endpoint ``P theta_2`` and the
  control point ``(theta_1 + P theta_2) / 2 + offset`` (App. E.1, see :class:`~lmc.curves.Curve`).

:class:`~lmc.tasks.PAMTask` runs the scheme under ``lmc fit``; these functions are the pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lmc.curves.birkhoff import (
    birkhoff_decomposition,
    permutation_matrix,
    round_to_permutation,
    sample_permutations,
)
from lmc.permutation import PermutationSpec
from lmc.permutation.spec import Permutation

StateDict = Mapping[str, Tensor]


def permutation_matrices(perm: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Group -> permutation matrix ``P[i, perm[i]] = 1`` (float32)."""
    return {g: permutation_matrix(p) for g, p in perm.items()}


def soft_permute(
    state: StateDict, spec: PermutationSpec, mats: Mapping[str, Tensor], keys: Sequence[str]
) -> dict[str, Tensor]:
    """``D theta``: every axis of every entry in ``keys`` multiplied by its group's matrix.

    New unit ``i`` of a group is ``sum_j D[i, j]`` old unit ``j``; for permutation matrices this
    equals :func:`~lmc.permutation.apply_permutation`. Differentiable in ``mats``.
    """
    out: dict[str, Tensor] = {}
    for key in keys:
        t = state[key]
        for axis, group in enumerate(spec.axes[key]):
            if group is not None:
                d = mats[group].to(t)
                t = torch.tensordot(d, t, dims=([1], [axis])).movedim(0, axis)
        out[key] = t
    return out


def _key(perm: Mapping[str, Tensor]) -> tuple[bytes, ...]:
    return tuple(perm[g].cpu().numpy().tobytes() for g in sorted(perm))


def pam_candidates(
    mats: Mapping[str, Tensor],
    previous: Permutation,
    num_samples: int = 32,
    max_terms: int = 10,
    generator: torch.Generator | None = None,
) -> list[Permutation]:
    """The candidate set ``S`` of 002 App. E.4, duplicates removed, in this order: the previous
    permutation ``P^k``, the Hungarian projection ``P_Pi(D)`` of every block, and ``num_samples``
    block permutations whose blocks are drawn independently from each block's greedy BvN
    decomposition truncated to ``max_terms`` terms."""
    hung = {g: round_to_permutation(d) for g, d in mats.items()}
    terms = {g: birkhoff_decomposition(d, max_terms) for g, d in mats.items()}
    out, seen = [], set()
    for cand in [dict(previous), hung]:
        if _key(cand) not in seen:
            seen.add(_key(cand))
            out.append(cand)
    draws = {
        g: sample_permutations(t, num_samples, generator) if t else [hung[g]] * num_samples
        for g, t in terms.items()
    }
    for k in range(num_samples):
        cand = {g: draws[g][k] for g in mats}
        if _key(cand) not in seen:
            seen.add(_key(cand))
            out.append(cand)
    return out


@dataclass
class PAMRounding:
    """Outcome of :func:`round_pam`: the chosen permutation, every candidate's objective and the
    chosen index (0: the previous permutation was kept, 1: the Hungarian projection won)."""

    perm: Permutation
    scores: list[float] = field(default_factory=list)
    chosen: int = 0


def round_pam(
    mats: Mapping[str, Tensor],
    previous: Permutation,
    objective: Callable[[Permutation], float],
    num_samples: int = 32,
    max_terms: int = 10,
    generator: torch.Generator | None = None,
) -> PAMRounding:
    """Round relaxed blocks ``D`` to the candidate permutation of least ``objective`` (002 eq. 51).

    The previous permutation is a candidate and wins ties, so the objective (as ``objective``
    measures it) never increases across a permutation step.
    """
    cands = pam_candidates(mats, previous, num_samples, max_terms, generator)
    scores = [float(objective(c)) for c in cands]
    best = min(range(len(cands)), key=lambda i: (scores[i], i))
    return PAMRounding(perm=cands[best], scores=scores, chosen=best)


def proximal_penalty(mats: Mapping[str, Tensor], previous: Mapping[str, Tensor]) -> Tensor:
    """``sum_l |D_l - P_l^k|_F^2`` (the proximal term of eq. 34 without its ``1 / (2 nu)``)."""
    terms = [(d - previous[g].to(d)).square().sum() for g, d in mats.items()]
    return torch.stack(terms).sum() if terms else torch.zeros(())
