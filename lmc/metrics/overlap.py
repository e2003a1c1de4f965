"""Neuron types and the overlap of two teacher-student solutions (003 §3).

In the two-layer ReLU teacher-student setting with orthonormal teacher neurons w*_1..w*_m and
output weights fixed at 1, every global minimum of a student of width n >= m has neurons of the
form w_i = c_i w*_k with c_i >= 0 (003 Lemma 2): neuron i is of *type* k, and the coefficients
of each type sum to 1. The *type vector* z counts the neurons of each type (z_k >= 1). Two
minima with type vectors z, z' *overlap* in sum_k min(z_k, z'_k) neurons (003 Def. 4): those
pairs can be matched by a permutation at no barrier; the *overlap proportion* is that count over
n (003 eq. 6). Under 003's Assumption 3 a minimum is uniformly distributed on the manifold: its
free n - m neurons pick their type uniformly (z = 1 + Multinomial(n - m, 1/m)), and within a
type the coefficients are uniform on the simplex (normalised Exp(1) draws, 003 Lemma 8).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from lmc.models.init import free_neurons


def neuron_types(weight: Tensor, teacher: Tensor | None = None) -> Tensor:
    """Type of each student neuron: the teacher neuron it is most aligned with.

    Args:
        weight: student neurons as rows, shape (n, d).
        teacher: teacher neurons as rows, shape (m, d); ``None`` means e_1..e_d (then the type
            of a neuron is its largest coordinate).

    Returns:
        Long tensor of shape (n,) with values in [0, m).
    """
    if weight.dim() != 2:
        raise ValueError(
            f"student neurons must be a (width, input_dim) matrix, got {tuple(weight.shape)}"
        )
    w = weight.detach().double()
    if teacher is None:
        return w.argmax(dim=1)
    if teacher.dim() != 2 or teacher.shape[1] != w.shape[1]:
        raise ValueError(
            f"teacher neurons must be a (teacher_width, {w.shape[1]}) matrix to type students of "
            f"input dimension {w.shape[1]}, got {tuple(teacher.shape)}"
        )
    return (w @ teacher.detach().double().T).argmax(dim=1)


def type_vector(types: Tensor, num_types: int) -> Tensor:
    """Number of neurons of each type, shape (num_types,) (003's z)."""
    if types.numel() and (int(types.min()) < 0 or int(types.max()) >= num_types):
        raise ValueError(f"neuron types must lie in [0, {num_types}), got {types.tolist()}")
    return torch.bincount(types.long(), minlength=num_types)


def overlap_proportion(z: Tensor, z2: Tensor) -> float:
    """sum_k min(z_k, z2_k) / n of two type vectors of the same width n (003 Def. 4, eq. 6):
    1 when the two minima have the same type vector (linearly connected after a permutation)."""
    if z.shape != z2.shape:
        raise ValueError(f"type vectors of {z.numel()} and {z2.numel()} types cannot be compared")
    n, n2 = int(z.sum()), int(z2.sum())
    if n != n2 or n == 0:
        raise ValueError(
            f"the overlap compares two solutions of one width > 0, got widths {n} and {n2}"
        )
    return float(torch.minimum(z, z2).sum()) / n


def solutions_overlap(w: Tensor, w2: Tensor, teacher: Tensor | None = None) -> float:
    """Overlap proportion of two students' first layers (rows = neurons) against ``teacher``."""
    m = w.shape[1] if teacher is None else teacher.shape[0]
    return overlap_proportion(
        type_vector(neuron_types(w, teacher), m), type_vector(neuron_types(w2, teacher), m)
    )


def expected_overlap(width: int, num_types: int) -> float:
    """E[overlap proportion] of two independent uniform minima (003 Assumption 3), exactly: a sum
    over the multinomial type vectors (small widths only; use :func:`simulate_overlap` beyond)."""
    free = free_neurons(width, num_types)
    vectors = [c for c in itertools.product(range(free + 1), repeat=num_types) if sum(c) == free]
    if len(vectors) > 20_000:
        raise ValueError(f"{len(vectors)} type vectors are too many to enumerate; simulate instead")
    probs = [
        math.factorial(free) / math.prod(math.factorial(k) for k in c) / num_types**free
        for c in vectors
    ]
    total = 0.0
    for c, p in zip(vectors, probs):
        for c2, p2 in zip(vectors, probs):
            total += p * p2 * sum(min(a, b) + 1 for a, b in zip(c, c2))
    return total / width


def simulate_overlap(
    width: int, num_types: int, trials: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Monte-Carlo mean overlap proportion of two independent uniform minima and its standard
    error, over ``trials`` pairs (003 Fig. 1)."""
    free = free_neurons(width, num_types)
    if free == 0:
        return 1.0, 0.0
    g = torch.Generator().manual_seed(seed)
    probs = torch.full((num_types,), 1.0 / num_types)
    draws = torch.multinomial(probs.expand(2 * trials, -1), free, replacement=True, generator=g)
    z = 1 + torch.nn.functional.one_hot(draws, num_types).sum(1).reshape(2, trials, num_types)
    overlap = torch.minimum(z[0], z[1]).sum(-1).double() / width
    return float(overlap.mean()), float(overlap.std() / math.sqrt(trials))
