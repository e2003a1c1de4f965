"""Geometry of permuted models (004 §6.1, App. C): pairwise L2 distances, their ratios to the
mean distance, and the angles of every triplet. Equal ratios (1) and 60-degree angles mean the
permuted models sit at the vertices of a regular simplex.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations

import torch
from torch import Tensor

StateDict = Mapping[str, Tensor]


def pairwise_distances(states: Sequence[StateDict], keys: Sequence[str] | None = None) -> Tensor:
    """``D[i, j] = ||theta_i - theta_j||`` (float64, n x n) over ``keys`` (default: every
    floating-point entry). Differences are taken entry by entry, so no n x P matrix is built
    and near-equal models give exact zeros."""
    n = len(states)
    if keys is None:
        keys = [k for k, t in states[0].items() if t.is_floating_point()]
    sq = torch.zeros(n, n, dtype=torch.float64)
    for i, j in combinations(range(n), 2):
        total = 0.0
        for k in keys:
            d = states[i][k].detach() - states[j][k].detach()
            total += float(torch.dot(d.reshape(-1).double(), d.reshape(-1).double()))
        sq[i, j] = sq[j, i] = total
    return sq.sqrt()


def distance_ratios(distances: Tensor) -> list[float]:
    """``||theta_i - theta_j|| / mean_{k<l} ||theta_k - theta_l||`` for every pair i < j (004
    §6.1, Fig. 6 and 9). Empty for fewer than 2 models; ``nan`` when all models coincide."""
    n = distances.shape[0]
    pairs = [float(distances[i, j]) for i, j in combinations(range(n), 2)]
    if not pairs:
        return []
    mean = sum(pairs) / len(pairs)
    return [p / mean if mean > 0 else float("nan") for p in pairs]


def triplet_angles(distances: Tensor) -> list[float]:
    """The three interior angles (degrees) of the triangle of every triplet of models (004
    §6.1, Fig. 7 and 10), from the law of cosines on ``distances``; a degenerate triangle (two
    coinciding models) gives ``nan`` angles."""
    n = distances.shape[0]
    out = []
    for i, j, k in combinations(range(n), 3):
        for a, b, c in ((i, j, k), (j, i, k), (k, i, j)):  # angle at a between b and c
            ab, ac, bc = float(distances[a, b]), float(distances[a, c]), float(distances[b, c])
            if ab <= 0 or ac <= 0:
                out.append(float("nan"))
                continue
            cos = (ab * ab + ac * ac - bc * bc) / (2 * ab * ac)
            out.append(math.degrees(math.acos(max(-1.0, min(1.0, cos)))))
    return out


def describe(values: Sequence[float]) -> dict[str, float]:
    """Mean, std, min and max of the finite values (``nan`` when there are none)."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        nan = float("nan")
        return {"mean": nan, "std": nan, "min": nan, "max": nan}
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return {"mean": mean, "std": math.sqrt(var), "min": min(vals), "max": max(vals)}
