"""Views for :func:`~lmc.permutation.derive_spec`: how a channel space moves through
``flatten``/``view``/``reshape`` (the features kept on an axis, merged with their neighbours
into blocks, split into factors, or folded into the batch axis with fixed factors) and
``permute``/``transpose`` (the feature axis moves; a 2-D parameter transposed for a matrix
product); the rest of the shape operations are in :mod:`lmc.permutation.derive_shapes`."""

from __future__ import annotations

import math
from typing import Any

from torch import fx

from lmc.permutation.derive_core import DeriverCore
from lmc.permutation.derive_spaces import (
    Feature,
    NotExpressible,
    ParamT,
    ParamUse,
    Spaces,
    node_arg,
    node_shape,
)

_arg, _shape = node_arg, node_shape


class ViewRules(DeriverCore):
    """Mixin of the deriver: the rules of views and axis permutations."""

    def _flatten(self, node: fx.Node, start: int, end: int) -> Feature | None:
        v = self.val.get(node.args[0])
        s_in = _shape(node.args[0])
        if not isinstance(v, Feature) or s_in is None:
            self._generic(node)
            return None
        nd = len(s_in)
        start, end = start % nd, end % nd
        if not start <= v.axis <= end:
            return Feature(v.space, v.axis if v.axis < start else v.axis - (end - start))
        if self._fixed(v.space):  # nothing permuted: nothing to carry into the merged axis
            return Feature(Spaces.FIXED, start)
        before = math.prod(s_in[start : v.axis])
        after = math.prod(s_in[v.axis + 1 : end + 1])
        space = self._sized(v.space, s_in[v.axis])
        parts = [self.sp.fixed_leaf(before), space, self.sp.fixed_leaf(after)]
        return Feature(self.sp.kron(parts, node.name), start)

    def _view(self, node: fx.Node) -> Feature | ParamUse | None:
        v = self.val.get(node.args[0])
        s_in, s_out = _shape(node.args[0]), _shape(node)
        if isinstance(v, ParamUse) and s_in is not None and s_out is not None:
            return self._param_view(node, v, s_in, s_out)
        if not isinstance(v, Feature) or s_in is None or s_out is None:
            self._generic(node)
            return None
        if self._fixed(v.space):
            return Feature(Spaces.FIXED, min(v.axis, len(s_out) - 1))
        lead = math.prod(s_in[: v.axis])
        size = s_in[v.axis]
        pre = [math.prod(s_out[:k]) for k in range(len(s_out) + 1)]
        for k in range(len(s_out)):  # the axis kept (other axes merged or split around it)
            if pre[k] == lead and s_out[k] == size:
                return Feature(v.space, k)
        for k in range(len(s_out)):  # merged with neighbours into one output axis
            if pre[k] <= lead and lead * size * math.prod(s_in[v.axis + 1 :]) >= pre[k + 1]:
                if lead % pre[k] == 0 and pre[k + 1] % (lead * size) == 0:
                    before, after = lead // pre[k], pre[k + 1] // (lead * size)
                    parts = [self.sp.fixed_leaf(before), v.space, self.sp.fixed_leaf(after)]
                    return Feature(self.sp.kron(parts, node.name), k)
        for k0 in range(len(s_out)):  # split into several output axes
            ends = [k for k in range(k0 + 1, len(s_out)) if pre[k + 1] == lead * size]
            if pre[k0] == lead and ends:
                return self._split_axis(node, v, list(s_out[k0 : ends[0] + 1]), k0)
        for k0 in range(len(s_out) - 1):  # its leading factor merged into the axis before
            merged = pre[k0 + 1]  # e.g. (B, heads x dim, ...) -> (B x heads, dim, ...): BoTNet
            if pre[k0] < lead < merged and lead % pre[k0] == 0 and merged % lead == 0:
                heads = merged // lead
                if size % heads == 0 and s_out[k0 + 1] == size // heads:
                    leaf = self.sp.new(size // heads, node.name)
                    parts = [self.sp.fixed_leaf(heads), leaf]  # the heads stay in order
                    self.sp.union(v.space, self.sp.kron(parts, node.name))
                    return Feature(leaf, k0 + 1)
        one = self._one_factor(v.space)  # fixed (x) g (x) fixed: g kept whole in one output axis
        if one is not None:
            before_g, n, g = one
            lead_g = lead * before_g
            for k in range(len(s_out)):
                if lead_g % pre[k] == 0 and pre[k + 1] % (lead_g * n) == 0:  # MobileViT's unfold
                    before, after = lead_g // pre[k], pre[k + 1] // (lead_g * n)
                    parts = [self.sp.fixed_leaf(before), g, self.sp.fixed_leaf(after)]
                    return Feature(self.sp.kron(parts, node.name), k)
        raise self.err(
            f"reshape from {s_in} to {s_out} mixes the permuted axis {v.axis} with others; only "
            "views that keep it, merge it with its neighbours or split it are supported"
        )

    def _one_factor(self, space: int) -> tuple[int, int, int] | None:
        """``(units before it, size, space)`` of the one permuted factor of a space whose other
        factors are fixed (e.g. ``fixed (x) channels (x) fixed`` after a merge into the batch
        axis), else ``None``."""
        try:
            layout = self.sp.layout(space)
        except NotExpressible:
            return None
        if len(layout) != 1 or sum(g is not None for g, _ in layout[0]) != 1:
            return None
        before = 1
        for g, n in layout[0]:
            if g is not None:
                return before, n, g
            before *= n
        return None

    def _split_axis(self, node: fx.Node, v: Feature, factors: list[int], first: int) -> Feature:
        """A view splitting the permuted axis into ``factors`` (row-major): one factor carries
        the permutation, the others are fixed, i.e. the space is restricted to
        ``fixed (x) leaf (x) fixed``; a space that cannot be (e.g. different permutations on
        the blocks a channel shuffle interleaves) is fixed. The factor is the one matching a
        group already in the space's layout (a flatten undone), else the largest."""
        t = max(range(len(factors)), key=lambda i: factors[i])
        try:
            layout = self.sp.layout(v.space)
        except NotExpressible:
            layout = []
        if len(layout) == 1:
            pos = 1
            for g, n in layout[0]:
                for i in range(len(factors)):
                    if g is not None and math.prod(factors[:i]) == pos and factors[i] == n:
                        t = i
                pos *= n
        root = self.sp.find(v.space)
        leaf = self.sp.new(
            factors[t], self.sp.name[root] if self.sp.kind[root] is None else node.name
        )
        parts = [
            self.sp.fixed_leaf(math.prod(factors[:t])),
            leaf,
            self.sp.fixed_leaf(math.prod(factors[t + 1 :])),
        ]
        self.sp.union(v.space, self.sp.kron(parts, node.name))
        return Feature(leaf, first + t)

    def _permute(self, node: fx.Node, dims: Any) -> Feature | None:
        v = self.val.get(node.args[0])
        if not isinstance(v, Feature):
            self._generic(node)
            return None
        nd = len(_shape(node) or dims)
        dims = [d % nd for d in dims]
        return Feature(v.space, dims.index(v.axis))

    def _transpose(self, node: fx.Node) -> Feature | ParamT | None:
        v = self.val.get(node.args[0])
        nd = len(_shape(node) or ())
        if isinstance(v, ParamUse) and v.ndim == nd == 2 and v.offset == 0:
            return ParamT(v.key)  # a matrix transposed for a product
        if not isinstance(v, Feature):
            self._generic(node)
            return None
        a, b = _arg(node, 1, "dim0") % nd, _arg(node, 2, "dim1") % nd
        return Feature(v.space, b if v.axis == a else a if v.axis == b else v.axis)

    # -- functions ---------------------------------------------------------------------------
    def _param_view(
        self, node: fx.Node, v: ParamUse, s_in: tuple[int, ...], s_out: tuple[int, ...]
    ) -> ParamUse:
        """A parameter reshaped by inserting or dropping axes of size 1 (layer scale
        ``gamma.reshape(1, -1, 1, 1)``, ``view(C, 1, 1)``): its axes of size > 1 keep their
        order, so it is the parameter placed at a new offset."""
        big_in = [k for k, n in enumerate(s_in) if n > 1]
        big_out = [k for k, n in enumerate(s_out) if n > 1]
        if [s_in[k] for k in big_in] != [s_out[k] for k in big_out]:
            raise self.err(
                f"parameter {v.key!r} is reshaped from {s_in} to {s_out}, which regroups its "
                "axes; derive_spec follows only reshapes that add or drop axes of size 1: write "
                "a PermutationSpec by hand"
            )
        offsets = {k_out - (k_in - v.offset) for k_in, k_out in zip(big_in, big_out)}
        if len(offsets) > 1:  # cannot happen for one-axis parameters (layer scale, biases)
            raise self.err(f"parameter {v.key!r}: reshape from {s_in} to {s_out} moves its axes")
        return ParamUse(v.key, v.ndim, offsets.pop() if offsets else 0)
