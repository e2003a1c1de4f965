"""PQ-index sparsity of weights (003 Def. 7, after Diao et al., 2023).

For a non-zero vector w ∈ R^d and 0 < p < q,

    PQ_{p,q}(w) = 1 − d^{1/q − 1/p} · ‖w‖_p / ‖w‖_q ∈ [0, 1 − d^{1/q − 1/p}],

0 for a constant vector (least sparse) and 1 − d^{1/q − 1/p} for a one-hot vector (most
sparse). 003 §5 evaluates a weight matrix two ways: the flattened matrix, and the vector of
per-neuron (row) norms. Zero entries and zero rows are counted in d, so neurons pruned or
collapsed to zero raise the index. Defaults p = 1, q = 2.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lmc.metrics.layers import effective_weight, weight_layers


def pq_index(w: Tensor, p: float = 1.0, q: float = 2.0) -> float:
    """PQ index of ``w`` flattened (003 Def. 7); ``nan`` for the all-zero vector.

    Args:
        w: any tensor; all d = ``w.numel()`` entries count, zeros included.
        p: the smaller (quasi-)norm order, 0 < p < q.
        q: the larger norm order.
    """
    if not 0 < p < q:
        raise ValueError(f"the PQ index needs 0 < p < q, got p={p}, q={q}")
    x = w.detach().reshape(-1).double().abs()
    d = x.numel()
    if d == 0:
        raise ValueError("the PQ index of an empty tensor is undefined")
    scale = x.max()
    if scale == 0:
        return float("nan")
    x = x / scale  # norms are homogeneous: rescaling avoids under/overflow of |w|^p
    norm_p = x.pow(p).sum().pow(1.0 / p)
    norm_q = x.pow(q).sum().pow(1.0 / q)
    return float(1.0 - d ** (1.0 / q - 1.0 / p) * norm_p / norm_q)


def neuron_norms(weight: Tensor, order: float = 2.0) -> Tensor:
    """Per-neuron ``order``-norms: one entry per output row/channel, zero rows included."""
    if weight.ndim < 1:
        raise ValueError("weight must have an output dimension")
    return torch.linalg.vector_norm(weight.detach().reshape(weight.shape[0], -1), ord=order, dim=1)


def layer_pq_indices(
    model: nn.Module,
    p: float = 1.0,
    q: float = 2.0,
    layers: Iterable[str] | None = None,
    norm_order: float = 2.0,
) -> dict[str, tuple[float, float]]:
    """(flattened, per-neuron-norm) PQ index of every Linear/Conv weight of ``model`` (003 §5)."""
    out = {}
    for name, m in weight_layers(model, layers).items():
        w = effective_weight(m)
        out[name] = (pq_index(w, p, q), pq_index(neuron_norms(w, norm_order), p, q))
    return out
