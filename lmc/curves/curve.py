"""Parametric curves between two networks over a state dict (002 §2.1, eq. 7, Alg. 2).

A :class:`Curve` holds the two endpoint models as flat vectors (fixed buffers) and the control
points as trainable offsets; a point ``w(t)`` is a dict of parameter tensors that
:func:`forward_at` feeds to *any* network through :func:`torch.func.functional_call`, so no
twin "curve" class per architecture is needed.

Parameterisation. With ``line(t) = (1 - t) theta_1 + t theta_2`` and interior basis functions
``c_i`` (see :mod:`lmc.curves.basis`)::

    w(t) = line(t) + sum_{i=1}^{n-1} c_i(t) offset_i,    control point i = line(i / n) + offset_i

By linear precision of both bases this *is* the Bezier curve (or polygonal chain) through the
control points; offsets of zero are the straight line (Garipov's linear init, Alg. 2), and after
alignment the aligned line. For the quadratic curve this is exactly PAM's reparameterisation
``theta_c = (theta_1 + P theta_2) / 2 + offset`` (002 App. E.1, eq. 35): when the second
endpoint is replaced (alignment, a new permutation) the control point moves with it. For fixed
endpoints it is an affine change of variables, so gradients, any optimizer without weight decay
and the L2 penalty on ``w(t)`` behave exactly as with free control points.

Only parameters lie on the curve. Floating-point buffers (BatchNorm running statistics) are kept
per endpoint; :meth:`Curve.load_point_` either interpolates them linearly (``buffers=
"interpolate"``: at ``t = 0, 1`` the endpoints' own statistics, so the endpoints are reproduced
exactly) or leaves them for :func:`~lmc.interpolation.reset_bn` to recompute on data (the
evaluation default, 002 App. B). At ``t = 0`` and ``t = 1`` ``w(t)`` equals the endpoint's
parameters bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmc.curves.basis import CurveKind, basis, interior_basis

StateDict = Mapping[str, Tensor]
BufferMode = Literal["interpolate", "keep"]


def _flatten(state: StateDict, names: Sequence[str], what: str) -> Tensor:
    missing = [n for n in names if n not in state]
    if missing:
        raise KeyError(
            f"{what} lacks entries {missing[:5]}; both endpoints must be full state dicts of the "
            "same architecture as the network"
        )
    if not names:  # on the state's device, like the other buffers
        return torch.zeros(0, device=next(iter(state.values())).device if state else None)
    return torch.cat([state[n].detach().reshape(-1).float() for n in names])


class Curve(nn.Module):
    """A Bezier curve (any order) or polygonal chain between two models' parameters.

    Build it with :meth:`from_module`. ``offsets`` (shape ``(order - 1, N)``) is the only
    trainable tensor; endpoints are buffers, so they travel with ``.to()`` and checkpoints.

    Args:
        names: parameter names on the curve, in order (e.g. ``net.named_parameters()``).
        shapes: their shapes.
        buffer_names: floating-point buffer names (BatchNorm running mean/var).
        buffer_shapes: their shapes.
        start: full state dict of the first endpoint (``t = 0``).
        end: full state dict of the second endpoint (``t = 1``).
        order: number of segments/degree; 2 is the quadratic Bezier curve of 002 eq. 7.
        kind: ``bezier`` or ``polychain``.
    """

    start: Tensor
    end: Tensor
    start_buffers: Tensor
    end_buffers: Tensor

    def __init__(
        self,
        names: Sequence[str],
        shapes: Sequence[torch.Size],
        buffer_names: Sequence[str],
        buffer_shapes: Sequence[torch.Size],
        start: StateDict,
        end: StateDict,
        order: int = 2,
        kind: CurveKind = "bezier",
    ) -> None:
        super().__init__()
        basis(0.0, order, kind)  # validates order and kind
        self.order, self.kind = order, kind
        self.names, self.shapes = list(names), [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.buffer_names = list(buffer_names)
        self.buffer_shapes = [torch.Size(s) for s in buffer_shapes]
        self.register_buffer("start", _flatten(start, self.names, "start state"))
        self.register_buffer("end", _flatten(end, self.names, "end state"))
        self.register_buffer("start_buffers", _flatten(start, self.buffer_names, "start state"))
        self.register_buffer("end_buffers", _flatten(end, self.buffer_names, "end state"))
        self.offsets = nn.Parameter(
            torch.zeros(order - 1, self.start.numel(), device=self.start.device)
        )

    @classmethod
    def from_module(
        cls,
        net: nn.Module,
        start: StateDict,
        end: StateDict,
        order: int = 2,
        kind: CurveKind = "bezier",
    ) -> Curve:
        """A curve over every parameter of ``net`` between two of its state dicts (linear init)."""
        params = list(net.named_parameters())
        bufs = [(n, b) for n, b in net.named_buffers() if b.is_floating_point()]
        return cls(
            [n for n, _ in params],
            [p.shape for _, p in params],
            [n for n, _ in bufs],
            [b.shape for _, b in bufs],
            start,
            end,
            order,
            kind,
        )

    @property
    def num_params(self) -> int:
        """Number of parameters of one point on the curve."""
        return self.start.numel()

    # points ------------------------------------------------------------------------------
    def point_flat(
        self, t: float, end: Tensor | None = None, offsets: Tensor | None = None
    ) -> Tensor:
        """``w(t)`` as one flat vector; differentiable in ``offsets`` (and in ``end`` if given).

        Args:
            t: curve parameter in [0, 1].
            end: replaces the second endpoint (e.g. a soft-permuted ``D theta_2`` in PAM).
            offsets: replaces the trainable offsets (e.g. detached).
        """
        t = float(t)
        end = self.end if end is None else end
        offsets = self.offsets if offsets is None else offsets
        c = interior_basis(t, self.order, self.kind)
        w = self.start * (1.0 - t) + end * t
        for i, ci in enumerate(c.tolist()):
            if ci != 0.0:
                w = w + ci * offsets[i]
        return w

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Name -> tensor views of a flat parameter vector."""
        return {n: p.view(s) for n, s, p in zip(self.names, self.shapes, flat.split(self.numels))}

    def flatten(self, state: StateDict) -> Tensor:
        """The curve's parameters of a state dict as one flat vector (on the curve's device)."""
        return _flatten(state, self.names, "state").to(self.start)

    def point(self, t: float, **kwargs: Any) -> dict[str, Tensor]:
        """``w(t)`` as a parameter dict for :func:`forward_at` (see :meth:`point_flat`)."""
        return self.unflatten(self.point_flat(t, **kwargs))

    def buffers_at(self, t: float) -> dict[str, Tensor]:
        """Endpoint buffers interpolated linearly: ``(1 - t) b_1 + t b_2`` (exact at 0 and 1)."""
        flat = self.start_buffers * (1.0 - t) + self.end_buffers * float(t)
        return {
            n: p.view(s)
            for n, s, p in zip(
                self.buffer_names,
                self.buffer_shapes,
                flat.split([s.numel() for s in self.buffer_shapes]),
            )
        }

    def state_at(self, t: float, template: StateDict) -> dict[str, Tensor]:
        """A full state dict of the model at ``t`` (parameters on the curve, float buffers
        interpolated, other entries from ``template``), e.g. to save it as a checkpoint."""
        with torch.no_grad():
            out = {k: v.detach().clone() for k, v in template.items()}
            out.update({k: v.clone() for k, v in self.point(t).items()})
            out.update({k: v.clone() for k, v in self.buffers_at(t).items()})
        return out

    @torch.no_grad()
    def load_point_(self, net: nn.Module, t: float, buffers: BufferMode = "keep") -> nn.Module:
        """Write ``w(t)`` into ``net``'s parameters in place (no copy of the network).

        ``buffers="interpolate"`` also writes the linearly interpolated endpoint buffers; with
        ``"keep"`` they are left as they are (recompute them with ``reset_bn``).
        """
        params = dict(net.named_parameters())
        for name, value in self.point(t).items():
            params[name].copy_(value)
        if buffers == "interpolate":
            bufs = dict(net.named_buffers())
            for name, value in self.buffers_at(t).items():
                bufs[name].copy_(value)
        elif buffers != "keep":
            raise ValueError(f"buffers must be 'interpolate' or 'keep', got {buffers!r}")
        return net

    # endpoints and control points -------------------------------------------------------
    def endpoint(self, which: int) -> dict[str, Tensor]:
        """Parameters of endpoint 0 (``theta_1``) or 1 (``theta_2``)."""
        return self.unflatten(self.start if which == 0 else self.end)

    @torch.no_grad()
    def set_end_(self, state: StateDict) -> None:
        """Replace the second endpoint (parameters and buffers), e.g. by its aligned copy.

        Offsets are kept, so control points move with the endpoint (002 App. E.1).
        """
        self.end.copy_(self.flatten(state))
        if self.buffer_names:
            self.end_buffers.copy_(_flatten(state, self.buffer_names, "state").to(self.end))

    def control_points(self) -> list[Tensor]:
        """The ``order - 1`` control points as flat vectors: ``line(i / n) + offset_i``."""
        n = self.order
        return [
            self.start * (1 - i / n) + self.end * (i / n) + self.offsets[i - 1].detach()
            for i in range(1, n)
        ]

    @torch.no_grad()
    def set_control_points_(self, points: Sequence[Tensor | StateDict]) -> None:
        """Set the control points (flat vectors or state dicts), e.g. to a saved curve's."""
        if len(points) != self.order - 1:
            raise ValueError(f"an order-{self.order} curve has {self.order - 1} control points")
        n = self.order
        for i, p in enumerate(points, start=1):
            flat = p.to(self.start) if isinstance(p, Tensor) else self.flatten(p)
            self.offsets[i - 1].copy_(flat - (self.start * (1 - i / n) + self.end * (i / n)))

    @torch.no_grad()
    def segment_lengths(self, ts: Sequence[float]) -> list[float]:
        """Euclidean lengths ``|w(t_{k+1}) - w(t_k)|`` of the chords between grid points."""
        out, prev = [], None
        for t in ts:
            cur = self.point_flat(t)
            if prev is not None:
                out.append(float((cur - prev).double().norm()))
            prev = cur
        return out


def forward_at(net: nn.Module, params: Mapping[str, Tensor], *args: Any) -> Any:
    """``net(*args)`` with its parameters replaced by ``params`` (its own buffers are used).

    In train mode BatchNorm normalises with batch statistics and updates ``net``'s running
    statistics in place, as in ordinary training (002 Alg. 2).
    """
    return functional_call(net, dict(params), args, strict=False)


def bezier_state(
    points: Sequence[StateDict], t: float, kind: CurveKind = "bezier"
) -> dict[str, Tensor]:
    """``sum_i c_i(t) points_i`` over floating-point entries of full state dicts (control
    points given explicitly, endpoints first and last); other entries come from ``points[0]``.

    The direct form of 002 eq. 7 for any order; :class:`Curve` computes the same points.
    """
    if len(points) < 2:
        raise ValueError("a curve needs at least its two endpoints")
    c = basis(t, len(points) - 1, kind).tolist()
    out: dict[str, Tensor] = {}
    for key, v in points[0].items():
        if not v.is_floating_point():
            out[key] = v.clone()
            continue
        acc = v * c[0]
        for ci, p in zip(c[1:], points[1:]):
            acc = acc + ci * p[key]
        out[key] = acc
    return out
