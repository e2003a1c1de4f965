"""Curve bases: Bernstein polynomials (Bezier curves, 002 eq. 7) and hat functions (polygonal
chains, Garipov et al. 2018).

A curve of order ``n`` has ``n + 1`` points: the endpoints ``theta_0 = theta_1`` (the first
model) and ``theta_n`` (the second) and ``n - 1`` control points. A point on it is
``w(t) = sum_i c_i(t) theta_i`` with basis ``c_i``:

* ``bezier``: Bernstein polynomials ``B_{i,n}(t) = C(n, i) t^i (1 - t)^(n - i)``; order 2 is the
  quadratic Bezier curve ``(1 - t)^2 theta_1 + 2 t (1 - t) theta_c + t^2 theta_2`` of 002 eq. 7.
* ``polychain``: piecewise-linear hat functions with nodes ``i / n``; order 2 is the one-bend
  chain ``theta_1 -> theta_c -> theta_2`` (bend at ``t = 0.5``).

Both bases have *linear precision*: ``sum_i c_i(t) i / n = t``. Control points placed at
``line(i / n)`` therefore reproduce the straight line, which is why :class:`~lmc.curves.Curve`
stores control points as offsets from the line.
"""

from __future__ import annotations

from math import comb
from typing import Literal

import torch
from torch import Tensor

CurveKind = Literal["bezier", "polychain"]


def _check(kind: str, order: int) -> None:
    if kind not in ("bezier", "polychain"):
        raise ValueError(f"curve kind must be 'bezier' or 'polychain', got {kind!r}")
    if order < 1:
        raise ValueError(f"curve order must be >= 1 (1 is the straight line), got {order}")


def basis(t: float | Tensor, order: int = 2, kind: CurveKind = "bezier") -> Tensor:
    """The ``order + 1`` basis values ``c_0(t), ..., c_n(t)`` at ``t`` in [0, 1] (float64).

    At ``t = 0`` the result is exactly ``(1, 0, ..., 0)`` and at ``t = 1`` exactly
    ``(0, ..., 0, 1)``, so a curve passes through its endpoints bit for bit.
    """
    _check(kind, order)
    t = torch.as_tensor(t, dtype=torch.float64)
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"curve parameter t must lie in [0, 1], got {float(t)}")
    i = torch.arange(order + 1, dtype=torch.float64)
    if kind == "bezier":
        binom = torch.tensor([comb(order, k) for k in range(order + 1)], dtype=torch.float64)
        return binom * t**i * (1 - t) ** (order - i)
    return (1 - (order * t - i).abs()).clamp_min(0.0)


def interior_basis(t: float | Tensor, order: int = 2, kind: CurveKind = "bezier") -> Tensor:
    """The basis values of the ``order - 1`` control points (``c_1 .. c_{n-1}``)."""
    return basis(t, order, kind)[1:-1]


def basis_derivative(t: float | Tensor, order: int = 2, kind: CurveKind = "bezier") -> Tensor:
    """``d c_i / dt`` at ``t`` (the right derivative at the bends of a polygonal chain)."""
    _check(kind, order)
    t = torch.as_tensor(t, dtype=torch.float64)
    n = order
    if kind == "bezier":
        lower = basis(t, n - 1, "bezier") if n > 1 else torch.ones(1, dtype=torch.float64)
        zero = torch.zeros(1, dtype=torch.float64)
        padded = torch.cat([zero, lower, zero])
        return n * (padded[:-1] - padded[1:])
    seg = min(int(float(t) * n), n - 1)
    out = torch.zeros(n + 1, dtype=torch.float64)
    out[seg], out[seg + 1] = -n, n
    return out
