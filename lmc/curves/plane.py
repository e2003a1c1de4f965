"""Loss and accuracy over the plane through three models (002 Fig. 3, 5, 7; Garipov et al.).

The plane through ``origin``, ``a`` and ``b`` (parameters only) gets the orthonormal basis of
Gram-Schmidt: ``u = (a - origin) / |a - origin|``, ``v`` the normalised part of ``b - origin``
orthogonal to ``u``. Every grid point ``origin + x u + y v`` is loaded into the network, its
BatchNorm statistics are re-estimated on a train subset, and it is evaluated on every split.
For 002 Fig. 3 the three models are ``theta_1``, ``theta_2`` and the aligned ``P theta_2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lmc.evaluation import LossName, evaluate, has_batchnorm, reset_bn

StateDict = Mapping[str, Tensor]


@dataclass
class PlaneResult:
    """Grid axes, per-split metrics on the grid (``metrics["test/loss"][iy][ix]``), the plane
    coordinates of the named models and of any extra points (e.g. a curve)."""

    xs: list[float]
    ys: list[float]
    metrics: dict[str, list[list[float]]] = field(default_factory=dict)
    points: dict[str, tuple[float, float]] = field(default_factory=dict)
    paths: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def _flat(state: StateDict, names: Sequence[str]) -> Tensor:
    return torch.cat([state[n].detach().reshape(-1).double() for n in names])


def plane_grid(
    net: nn.Module,
    origin: StateDict,
    a: StateDict,
    b: StateDict,
    splits: Mapping[str, Sequence[Any]],
    bn_batches: Sequence[Any] | None = None,
    grid: int = 11,
    margin: float = 0.2,
    loss: LossName = "cross_entropy",
    names: tuple[str, str, str] = ("theta_1", "theta_2", "P theta_2"),
    paths: Mapping[str, Sequence[StateDict | Tensor]] | None = None,
) -> PlaneResult:
    """Evaluate a ``grid x grid`` lattice over the plane through ``origin``, ``a`` and ``b``.

    The lattice spans the three models' (and ``paths``') coordinates plus ``margin`` of that
    range on every side. ``net`` is overwritten point by point (no copies).

    Args:
        net: a network of the models' architecture (scratch copy).
        origin, a, b: state dicts (only parameters are used; the plane lives in weight space).
        splits: split name -> ``(x, y)`` batches.
        bn_batches: train subset for BatchNorm re-estimation at every grid point.
        grid: points per axis.
        margin: relative padding of the lattice around the models.
        loss: evaluation loss.
        names: labels of ``origin``, ``a`` and ``b`` in :attr:`PlaneResult.points`.
        paths: optional named sequences of points (state dicts or flat parameter vectors in
            ``net.named_parameters()`` order, e.g. points of a learned curve) to project.

    Raises:
        ValueError: the three models are collinear (no plane), or BatchNorm without
            ``bn_batches``.
    """
    if grid < 2:
        raise ValueError(f"grid must be >= 2 points per axis, got {grid}")
    pnames = [n for n, _ in net.named_parameters()]
    device = next(net.parameters()).device
    o = _flat(origin, pnames).to(device)
    da, db = _flat(a, pnames).to(device) - o, _flat(b, pnames).to(device) - o
    na = da.norm()
    if na == 0:
        raise ValueError(f"{names[0]} and {names[1]} are identical: they span no plane")
    u = da / na
    v = db - (db @ u) * u
    nv = v.norm()
    if nv <= 1e-5 * float(db.norm()):
        raise ValueError(f"{names[0]}, {names[1]} and {names[2]} are collinear: no plane")
    v = v / nv

    def coords(flat: Tensor) -> tuple[float, float]:
        d = flat.double() - o
        return float(d @ u), float(d @ v)

    result = PlaneResult(xs=[], ys=[])
    result.points = {names[0]: (0.0, 0.0), names[1]: coords(o + da), names[2]: coords(o + db)}
    for label, pts in (paths or {}).items():
        result.paths[label] = [
            coords((p.detach() if isinstance(p, Tensor) else _flat(p, pnames)).to(device))
            for p in pts
        ]
    allx = [p[0] for p in result.points.values()] + [p[0] for q in result.paths.values() for p in q]
    ally = [p[1] for p in result.points.values()] + [p[1] for q in result.paths.values() for p in q]
    (x0, x1), (y0, y1) = (min(allx), max(allx)), (min(ally), max(ally))
    mx, my = margin * (x1 - x0), margin * (y1 - y0)
    result.xs = np.linspace(x0 - mx, x1 + mx, grid).tolist()
    result.ys = np.linspace(y0 - my, y1 + my, grid).tolist()
    if has_batchnorm(net) and not bn_batches:
        raise ValueError("the network has BatchNorm: pass bn_batches to re-estimate statistics")

    params = dict(net.named_parameters())
    shapes = [params[n].shape for n in pnames]
    sizes = [s.numel() for s in shapes]
    for split in splits:
        for stat in ("loss", "acc"):
            result.metrics[f"{split}/{stat}"] = [[float("nan")] * grid for _ in range(grid)]
    for iy, y in enumerate(result.ys):
        for ix, x in enumerate(result.xs):
            flat = o + x * u + y * v
            with torch.no_grad():
                for n, s, p in zip(pnames, shapes, flat.split(sizes)):
                    params[n].copy_(p.view(s))
            if has_batchnorm(net):
                assert bn_batches is not None  # checked above
                reset_bn(net, bn_batches)
            for split, batches in splits.items():
                r = evaluate(net, batches, loss)
                result.metrics[f"{split}/loss"][iy][ix] = r.loss
                result.metrics[f"{split}/acc"][iy][ix] = r.acc
    return result
