"""Doubly-stochastic matrices for PAM's permutation subproblem (002 App. E.2, E.4).

* :func:`project_doubly_stochastic`: alternating projections onto the non-negative matrices and
  the affine set of matrices with unit row and column sums (E.2), or Sinkhorn scaling;
* :func:`round_to_permutation`: the Hungarian projection ``argmax_P trace(P^T D)`` (eq. 52);
* :func:`birkhoff_decomposition`: the greedy BvN heuristic of E.4 (eq. 54), each term the
  max-trace perfect matching on the support of the residual;
* :func:`sample_permutations`: permutations drawn with the (truncated, renormalised) BvN
  coefficients as probabilities.

Permutations are int64 index vectors ``perm`` with matrix ``P[i, perm[i]] = 1``, as in
:mod:`lmc.permutation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

Projection = Literal["alternating", "sinkhorn"]


def permutation_matrix(perm: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``P`` with ``P[i, perm[i]] = 1``."""
    n = perm.numel()
    out = torch.zeros(n, n, dtype=dtype, device=perm.device)
    out[torch.arange(n, device=perm.device), perm.long()] = 1
    return out


def _affine_projection(x: Tensor) -> Tensor:
    """Euclidean projection onto ``{X : X 1 = 1, X^T 1 = 1}``."""
    n = x.shape[0]
    r = x.sum(1) - 1
    c = x.sum(0) - 1
    s = r.sum()
    return x - r[:, None] / n - c[None, :] / n + s / n**2


def project_doubly_stochastic(
    x: Tensor, iters: int = 20, method: Projection = "alternating", eps: float = 1e-12
) -> Tensor:
    """Map a square matrix (back) onto the doubly-stochastic matrices (Birkhoff polytope).

    ``alternating`` (002 App. E.2): ``iters`` rounds of projecting onto the affine set of unit
    row/column sums, then onto the non-negative orthant. The iterates converge to a point of the
    intersection; after any round the matrix is non-negative and its sums approach 1.
    ``sinkhorn``: clamp to non-negative, then ``iters`` rounds of row and column scaling.
    """
    if x.ndim != 2 or x.shape[0] != x.shape[1]:
        raise ValueError(f"expected a square matrix, got shape {tuple(x.shape)}")
    y = x.detach().clone()
    if method == "alternating":
        for _ in range(iters):
            y = _affine_projection(y).clamp_min(0.0)
        return y
    if method == "sinkhorn":
        y = y.clamp_min(0.0) + eps
        for _ in range(iters):
            y = y / y.sum(1, keepdim=True)
            y = y / y.sum(0, keepdim=True)
        return y
    raise ValueError(f"method must be 'alternating' or 'sinkhorn', got {method!r}")


def round_to_permutation(d: Tensor) -> Tensor:
    """The permutation nearest to ``d``: ``argmax_P trace(P^T d)`` by the Hungarian method
    (002 eq. 52). A permutation matrix is returned unchanged."""
    cost = -d.detach().double().cpu().numpy()
    _, cols = linear_sum_assignment(cost)
    return torch.as_tensor(cols, dtype=torch.long)


def birkhoff_decomposition(
    d: Tensor, max_terms: int = 10, tol: float = 1e-6
) -> list[tuple[float, Tensor]]:
    """Greedy Birkhoff-von Neumann decomposition ``d ~ sum_k alpha_k P_k`` (002 App. E.4).

    Term ``k`` is the perfect matching of maximum trace on the support (entries > ``tol``) of
    the residual ``D^(k)`` (eq. 54), solved with the Hungarian method; ``alpha_k`` is its
    smallest matched entry and ``D^(k+1) = D^(k) - alpha_k P_k``. Stops after ``max_terms``
    terms, when the residual has no perfect matching on its support, or when it vanishes. The
    first term is :func:`round_to_permutation` of ``d``.

    Returns:
        ``(alpha_k, perm_k)`` pairs in the order found (coefficients need not sum to 1 when
        truncated or when ``d`` is only approximately doubly stochastic).
    """
    r = d.detach().double().cpu().numpy().copy()
    n = r.shape[0]
    out: list[tuple[float, Tensor]] = []
    for _ in range(max_terms):
        support = r > tol
        cost = np.where(support, -r, n + 1.0)  # any off-support entry loses to every matching
        rows, cols = linear_sum_assignment(cost)
        if not support[rows, cols].all():
            break
        alpha = float(r[rows, cols].min())
        out.append((alpha, torch.as_tensor(cols, dtype=torch.long)))
        r[rows, cols] -= alpha
        if r.max() <= tol:
            break
    return out


def sample_permutations(
    terms: Sequence[tuple[float, Tensor]],
    num: int,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """``num`` permutations drawn from the BvN terms with probabilities ``alpha_k / sum alpha``
    (002 App. E.4: the distribution Omega of one layer)."""
    if num <= 0:
        return []  # PAM with bvn_samples: 0 scores only the previous and Hungarian candidates
    if not terms:
        raise ValueError("no BvN terms to sample from")
    alphas = torch.tensor([a for a, _ in terms], dtype=torch.float64).clamp_min(0)
    if float(alphas.sum()) <= 0:
        alphas = torch.ones_like(alphas)
    idx = torch.multinomial(alphas, num, replacement=True, generator=generator)
    return [terms[int(i)][1] for i in idx]
