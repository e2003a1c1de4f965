"""Shape operations for :func:`~lmc.permutation.derive_spec`: how a channel space moves through
broadcasting, ``torch.cat`` (concatenated spaces), indexing, ``split``/``unbind``, ``repeat``,
reductions and matrix products (attention's ``q @ k.T`` and ``attn @ v``); views and axis
permutations are in :mod:`lmc.permutation.derive_views`, the spaces themselves in
:mod:`lmc.permutation.derive_spaces`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from lmc.permutation.derive_core import DeriverCore
from lmc.permutation.derive_spaces import (
    Feature,
    ParamCat,
    ParamT,
    ParamUse,
    Several,
    Spaces,
    node_arg,
    node_shape,
)

_arg, _shape = node_arg, node_shape


class ShapeRules(DeriverCore):
    """Mixin of the deriver: the rules of the shape-only operations."""

    def _broadcast(self, node: fx.Node, operands: Sequence[Any]) -> Feature | None:
        """Elementwise op with broadcasting: the operands' permuted axes are merged."""
        out = _shape(node)
        nd = len(out) if out is not None else 0
        feats = [
            (a, v) for a in operands if isinstance(v := self.val.get(a), Feature) and a is not None
        ]
        live = []
        for a, v in feats:
            shp = _shape(a) or ()
            if self._fixed(v.space):
                continue
            if shp and shp[v.axis] == 1 and out and out[v.axis + nd - len(shp)] > 1:
                self.sp.fix(v.space)  # one unit broadcast over the features (FocalNet's gate)
                continue
            live.append((a, v))
        if not live:
            if feats:
                return Feature(Spaces.FIXED, feats[0][1].axis)
            self._generic(node)
            return None
        axes = {v.axis + nd - len(_shape(a) or out or ()) for a, v in live}
        if len(axes) > 1:
            raise self.err("operands carry permuted features on different axes")
        axis = axes.pop()
        space = live[0][1].space
        for a in operands:
            if not isinstance(a, fx.Node):
                continue
            v = self.val.get(a)
            shp = _shape(a) or ()
            pos = axis - (nd - len(shp))
            if isinstance(v, Feature) and not self._fixed(v.space):
                self.sp.union(space, v.space)
            elif isinstance(v, ParamUse):
                pa = pos - v.offset
                if 0 <= pa < v.ndim and shp[pos] > 1:
                    ax: list[int | None] = [None] * v.ndim
                    ax[pa] = space
                    self._param("", v.key, tuple(ax))
            elif 0 <= pos < len(shp) and shp[pos] > 1:
                self.sp.fix(space)  # a per-feature constant that is not a parameter
        return Feature(space, axis)

    def _cat(self, node: fx.Node) -> Feature | ParamCat | None:
        if not isinstance(_arg(node, 0, "tensors"), (list, tuple)):  # a list made in the graph
            self._generic(node)
            return None
        tensors = list(_arg(node, 0, "tensors"))
        dim = _arg(node, 1, "dim", 0)
        vals = [self.val.get(t) for t in tensors]
        feats = [v for v in vals if isinstance(v, Feature) and not self._fixed(v.space)]
        shapes = [_shape(t) for t in tensors]
        sizes = [s[0] for s in shapes if s is not None and len(s) == 1]
        if any(isinstance(v, ParamUse) for v in vals) and all(
            isinstance(v, ParamUse) or v is None for v in vals
        ) and len(sizes) == len(shapes):  # fmt: skip
            return ParamCat(tuple(
                (v.key if isinstance(v, ParamUse) else None, n, self._uniform(t))
                for t, v, n in zip(tensors, vals, sizes)
            ))  # fmt: skip
        if not feats:
            return self._broadcast(node, tensors)
        nd = len(_shape(node) or ())
        dim %= nd
        if any(v.axis != dim for v in feats):
            return self._broadcast(node, tensors)  # along another axis: like an elementwise op
        parts = []
        for t, v in zip(tensors, vals):
            n = (_shape(t) or (0,) * nd)[dim]
            if isinstance(v, Feature) and v.axis == dim:
                parts.append(self._sized(v.space, n))
            else:
                parts.append(self.sp.fixed_leaf(n))
        return Feature(self.sp.cat(parts, node.name), dim)

    def _index(self, node: fx.Node, v: Feature) -> Feature | None:
        """``x[...]`` with ints, slices, ``None``, ``...`` and one index tensor (a table's rows
        gathered: the relative position bias an MLP computed): a slice of the permuted axis is
        a block of its space; one unit of it (an int) or units gathered by a tensor are only
        exact unpermuted (fixed)."""
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        shp = _shape(node.args[0]) or ()
        tensors = [i for i in idx if isinstance(i, fx.Node)]
        if len(tensors) > 1 or any(
            not (i is None or i is Ellipsis or isinstance(i, (int, slice, fx.Node))) for i in idx
        ):
            raise self.err(
                "indexing a feature tensor with lists or several tensors is not supported"
            )
        used = sum(i is not None and i is not Ellipsis for i in idx)
        items: list[Any] = []
        for i in idx:
            items.extend([slice(None)] * (len(shp) - used) if i is Ellipsis else [i])
        ax_in = ax_out = 0
        for i in items:
            if i is None:
                ax_out += 1
                continue
            if isinstance(i, fx.Node):  # one index tensor: its axes in place of this one
                if ax_in == v.axis:  # units gathered (a table's rows): they keep their order
                    self.sp.fix(v.space)
                    return Feature(Spaces.FIXED, ax_out)
                ax_out += len(_shape(i) or (0,))
                ax_in += 1
                continue
            if ax_in == v.axis:
                if isinstance(i, int):
                    self.sp.fix(v.space)
                    return None
                if any(isinstance(b, fx.Node) for b in (i.start, i.stop, i.step)):
                    raise self.err(
                        "slicing the permuted axis with computed bounds is not supported"
                    )
                n = shp[ax_in]
                start, stop, step = i.indices(n)
                if step != 1 or stop <= start:
                    self.sp.fix(v.space)
                    return Feature(Spaces.FIXED, ax_out)
                sizes = [m for m in (start, stop - start, n - stop) if m]
                parts = self.sp.split(v.space, sizes)
                return Feature(parts[1 if start else 0], ax_out)
            ax_out += isinstance(i, slice)
            ax_in += 1
        return Feature(v.space, ax_out + v.axis - ax_in)

    def _split(self, node: fx.Node, dim: int) -> Several | None:
        """``chunk``/``split``: pieces along the permuted axis are blocks of its space."""
        v = self.val.get(node.args[0])
        meta = node.meta.get("tensor_meta")
        if not isinstance(v, Feature) or not isinstance(meta, (tuple, list)):
            self._generic(node)
            return None
        shapes = [tuple(m.shape) for m in meta]
        dim %= len(shapes[0])
        if dim != v.axis or self._fixed(v.space):
            return Several(tuple(v for _ in shapes))
        parts = self.sp.split(v.space, [s[dim] for s in shapes])
        return Several(tuple(Feature(p, dim) for p in parts))

    def _reduce(self, node: fx.Node, at: int = 1) -> Feature:
        """A reduction (mean, sum, max, a norm) over ``dim`` (argument ``at``, ``keepdim``
        the next): over other axes (the batch too: CrossViT's mean of stacked heads) the
        features keep their permutation; over the features' axis, or all axes, the result is
        the same whatever their order (GRN's mean of the channels' norms)."""
        v = self._in(node)
        dims = _arg(node, at, "dim")
        nd = len(_shape(node.args[0]) or (0,) * 4)
        dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
        if not dims:  # over every axis: a permutation-invariant number
            return Feature(self.sp.FIXED, 0)
        keep = _arg(node, at + 1, "keepdim", False)
        if any(d % nd == v.axis for d in dims):
            return Feature(self.sp.FIXED, v.axis)
        return Feature(v.space, v.axis if keep else v.axis - sum(d % nd < v.axis for d in dims))

    def _repeat(self, node: fx.Node, src: Any) -> Feature | ParamUse | None:
        """``repeat`` of the axes that carry no permutation (``None``: not such a repeat)."""
        if not isinstance(src, (Feature, ParamUse)):
            return None
        sizes: Sequence[Any] = node.args[1:]
        sizes = sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else sizes
        shape = _shape(node.args[0]) or sizes
        extra = len(sizes) - len(shape)  # new leading axes
        if extra < 0:
            return None
        if isinstance(src, ParamUse):  # only its axes of size 1 repeated (a broadcast)
            if all(sizes[extra + k] == 1 for k, n in enumerate(shape) if n > 1):
                return ParamUse(src.key, src.ndim, src.offset + extra)
            return None
        if self._fixed(src.space) or sizes[extra + src.axis] == 1:  # its axis not repeated
            return Feature(src.space, src.axis + extra)
        return None

    def _unbind(self, node: fx.Node, dim: int) -> Several | None:
        """``unbind``: one tensor per index of ``dim`` (attention's ``q, k, v = qkv.unbind(0)``)
        each with the features' axis (shifted down past ``dim``); unbinding the features' own
        axis singles out units, which then keep their order."""
        v = self.val.get(node.args[0])
        meta = node.meta.get("tensor_meta")
        shape = _shape(node.args[0])
        if not isinstance(v, Feature) or not isinstance(meta, (tuple, list)) or shape is None:
            self._generic(node)
            return None
        dim %= len(shape)
        if dim == v.axis:
            self.sp.fix(v.space)
            return Several(tuple(Feature(Spaces.FIXED, 0) for _ in meta))
        axis = v.axis - (1 if dim < v.axis else 0)
        return Several(tuple(Feature(v.space, axis) for _ in meta))

    def _matmul(self, node: fx.Node) -> Feature | None:
        """``a @ b`` (``matmul``/``bmm``), see :meth:`_product`."""
        a, b = node.args[0], node.args[1]
        sa, sb, out = _shape(a), _shape(b), _shape(node)
        if sa is None or sb is None or out is None or len(sa) < 2 or len(sb) < 2:
            self._generic(node)
            return None
        return self._product(self.val.get(a), sa, self.val.get(b), sb, len(out))

    def _sdpa(self, node: fx.Node) -> Feature | None:
        """``F.scaled_dot_product_attention(q, k, v, attn_mask)``: ``softmax(q @ k.T * scale
        + mask) @ v`` by :meth:`_product` twice (the softmax moves no permutation)."""
        q, k, v = (_arg(node, i, n) for i, n in enumerate(("query", "key", "value")))
        sq, sk, sv, out = _shape(q), _shape(k), _shape(v), _shape(node)
        if (
            sq is None
            or sk is None
            or sv is None
            or out is None
            or min(len(sq), len(sk), len(sv)) < 2
        ):
            self._generic(node)
            return None
        vk = self.val.get(k)
        if isinstance(vk, Feature) and vk.axis >= len(sk) - 2:  # k.transpose(-2, -1)
            vk = Feature(vk.space, 2 * len(sk) - 3 - vk.axis)
        sk_t = (*sk[:-2], sk[-1], sk[-2])
        scores = self._product(self.val.get(q), sq, vk, sk_t, len(out))
        mask = self.val.get(_arg(node, 3, "attn_mask"))
        if isinstance(mask, Feature) and not self._fixed(mask.space):
            if self._fixed(scores.space) or mask.axis != scores.axis:
                self.sp.fix(mask.space)
            else:
                self.sp.union(mask.space, scores.space)
        elif isinstance(mask, ParamUse) and not self._fixed(scores.space):
            self.sp.fix(scores.space)  # a per-unit bias that is not permuted with them
        s_scores = (*out[:-1], sk[-2])
        return self._product(scores, s_scores, self.val.get(v), sv, len(out))

    def _product(self, va: Any, sa: tuple, vb: Any, sb: tuple, no: int) -> Feature:
        """A matrix product: ``a``'s last axis is summed against ``b``'s second-to-last, the
        leading axes broadcast. A permuted axis summed over must carry the same permutation on
        both sides (``q @ k.T`` over the head dimension: the result is the same whatever it
        is), or be summed against a parameter's axis, which is then permuted with it
        (SwiftFormer's ``q @ w_g``); a permuted axis that is not summed over keeps its
        permutation in the result (``attn @ v``). A result would carry two permuted axes only
        when both operands keep theirs on different axes: then ``b``'s is fixed."""

        def place(v: Any, nd: int, summed: int) -> tuple[int | None, int | None]:
            """(space summed over or None, output axis of a kept permuted axis or None)."""
            if not isinstance(v, Feature) or self._fixed(v.space):
                return None, None
            if v.axis == summed:
                return v.space, None
            return None, v.axis + no - nd  # rows, columns and batch axes: right-aligned

        sum_a, keep_a = place(va, len(sa), len(sa) - 1)
        sum_b, keep_b = place(vb, len(sb), len(sb) - 2)
        if sum_a is not None and sum_b is not None:
            self.sp.union(sum_a, sum_b)
        else:
            for summed, other, pos in ((sum_a, vb, len(sb) - 2), (sum_b, va, len(sa) - 1)):
                if summed is None:
                    continue
                if isinstance(other, ParamUse) and 0 <= pos - other.offset < other.ndim:
                    axes: list[int | None] = [None] * other.ndim
                    axes[pos - other.offset] = summed
                    self._param("", other.key, tuple(axes))
                elif isinstance(other, ParamT) and pos in (0, 1):  # its axes swapped
                    self._param("", other.key, (summed, None) if pos == 1 else (None, summed))
                else:  # summed against a tensor that does not move with it
                    self.sp.fix(summed)
        if keep_a is not None and keep_b is not None:
            if keep_a == keep_b:  # the same batch axis (attention heads)
                self.sp.union(va.space, vb.space)
            else:
                self.sp.fix(vb.space)
                keep_b = None
        # a batch axis pairs the operands' entries one to one (as a broadcast does): a
        # permuted one against the other operand's unpermuted entries (not size 1) cannot move
        for keep, v, shape_other, live_other in (
            (keep_a, va, sb, keep_b),
            (keep_b, vb, sa, keep_a),
        ):
            if keep is None or keep >= no - 2 or live_other == keep:
                continue
            pos = keep - (no - len(shape_other))
            if 0 <= pos < len(shape_other) and shape_other[pos] > 1:
                self.sp.fix(v.space)
        if keep_a is not None and not self._fixed(va.space):
            return Feature(va.space, keep_a)
        if keep_b is not None and not self._fixed(vb.space):
            return Feature(vb.space, keep_b)
        return Feature(Spaces.FIXED, no - 1)

    def _along(self, node: fx.Node, dims: Any) -> Feature | None:
        """An operation along ``dims`` that keeps the shape's rank (``roll``,
        ``repeat_interleave``): the features pass through unless it acts on their axis (or on
        all axes: ``dims`` None)."""
        v = self.val.get(node.args[0])
        if not isinstance(v, Feature):
            self._generic(node)
            return None
        if self._fixed(v.space):
            return v
        nd = len(_shape(node.args[0]) or ())
        dims = (dims,) if isinstance(dims, int) else dims
        if dims is None or not nd or any(d % nd == v.axis for d in dims):
            what = getattr(node.target, "__name__", node.target)
            raise self.err(f"{what} along the permuted axis {v.axis} mixes the features")
        return v

    def _uniform(self, t: Any) -> bool:
        """Whether ``t`` is a constant tensor of the module whose entries are all equal (any
        permutation leaves it as it is: EVA's zero key bias)."""
        if not isinstance(t, fx.Node) or t.op != "get_attr":
            return False
        try:
            value = self.gm.get_buffer(str(t.target))
        except AttributeError:
            return False
        return bool(value.numel() == 0 or (value == value.flatten()[0]).all())

    def _expand(self, node: fx.Node, v: Feature) -> Feature | None:
        """``expand``: new leading axes and size-1 axes broadcast; the features' axis keeps its
        size (a size-1 feature axis broadcast would repeat one unit: fixed)."""
        s_in, s_out = _shape(node.args[0]), _shape(node)
        if s_in is None or s_out is None:
            self._generic(node)
            return None
        axis = v.axis + len(s_out) - len(s_in)
        if self._fixed(v.space) or s_out[axis] == s_in[v.axis]:
            return Feature(v.space, axis)
        self.sp.fix(v.space)
        return Feature(Spaces.FIXED, axis)

    def _stack(self, node: fx.Node) -> Feature | None:
        """``torch.stack``: a new axis at ``dim``; the tensors' features merge (each index of
        the new axis holds one of them, so they must share one permutation)."""
        tensors = _arg(node, 0, "tensors")
        out = _shape(node)
        if out is None or not isinstance(tensors, (list, tuple)):
            self._generic(node)
            return None
        dim = _arg(node, 1, "dim", 0) % len(out)
        merged = self._broadcast(node, tensors)  # same shapes: an elementwise merge
        if not isinstance(merged, Feature):
            return merged
        axis = merged.axis - (len(out) - len(_shape(tensors[0]) or ()))  # as in the inputs
        return Feature(merged.space, axis + (1 if dim <= axis else 0))
