"""Attention for :func:`~lmc.permutation.derive_spec`: heads, query/key and value dimensions.

Multi-head attention with ``H`` heads of ``d`` dimensions computes, for every head ``h``,
``softmax(q_h k_h^T / sqrt(d) + b_h) v_h`` and concatenates the heads into the output
projection. Three permutations leave it unchanged (issue 19):

* the heads: the rows of the Q, K and V projections and the columns of the output projection
  move in blocks of ``d``, together with every per-head parameter (the head column of Swin's
  relative position bias table, the output rows of Swin V2's bias MLP, its logit scale);
* within a head, the query/key dimension: the rows of the Q and K projections and their
  biases (``q_h k_h^T`` sums over it; Swin V2's cosine attention normalises over it);
* within a head, the value dimension: the rows of the V projection and the columns of the
  output projection that read them.

A spec axis carries one group, so a projection's ``H d`` rows are a piece of shape ``H x d``
(row-major) with one permutation of the heads and one of the ``d`` dimensions *shared by all
heads*: the product of the three groups. The larger group in which every head has its own
within-head permutation would need a different group on each block of one axis plus a group
moving the blocks, which a :class:`~lmc.permutation.spec.PermutationSpec` cannot write; the
product keeps the permutation of heads, the one that aligns models whose heads learned the same
features in a different order. Both are exact. The residual stream (the projections' input
columns, the output projection's rows) is one permutation, merged with the stream by the
residual ``+`` like any Linear's.
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from lmc.permutation.derive_core import DeriverCore
from lmc.permutation.derive_spaces import Feature, ParamUse, Several, Spaces, node_arg, node_shape

_arg, _shape = node_arg, node_shape


class AttentionRules(DeriverCore):
    """Mixin of the deriver: ``nn.MultiheadAttention`` and torchvision's Swin functions."""

    def _heads(self, name: str, heads: int, dim: int, vdim: int) -> tuple[int, int, int]:
        """New spaces of the heads and their ``heads x d`` query/key and value rows."""
        h = self.sp.new(heads, f"{name}:heads")
        qk = self.sp.kron([h, self.sp.new(dim, f"{name}:qk")], f"{name}:q")
        v = self.sp.kron([h, self.sp.new(vdim, f"{name}:v")], f"{name}:v")
        return h, qk, v

    def _last_axis(self, arg: Any, what: str) -> int:
        v = self.val.get(arg) if isinstance(arg, fx.Node) else None
        if v is None:
            return Spaces.FIXED
        if not isinstance(v, Feature):
            raise self.err(f"{what} expects a feature tensor")
        nd = len(_shape(arg) or (v.axis + 1,))
        return self._on_axis(v, nd - 1, what)

    def _mha(self, node: fx.Node, target: str, mod: nn.MultiheadAttention) -> Several:
        """``nn.MultiheadAttention`` (batch first or not): heads, query/key and value spaces."""
        args = [_arg(node, i, n) for i, n in enumerate(("query", "key", "value"))]
        s_in = [self._last_axis(a, "MultiheadAttention") for a in args]
        if target in self.attn:  # shared module called again: same spaces
            *old_in, h, sq, sv, s_out = self.attn[target]
            for a, b in zip(old_in, s_in):
                self.sp.union(a, b)
        else:
            e = mod.embed_dim
            h, sq, sv = self._heads(target, mod.num_heads, mod.head_dim, mod.head_dim)
            s_out = self.sp.new(e, target)
            self.attn[target] = (*s_in, h, sq, sv, s_out)
            blocks = (
                ((0, e), sq, s_in[0]),
                ((e, 2 * e), sq, s_in[1]),
                ((2 * e, 3 * e), sv, s_in[2]),
            )
            if mod._qkv_same_embed_dim:
                for rows, s_row, s_col in blocks:
                    self._param(target, "in_proj_weight", (s_row, s_col), rows=rows)
            else:
                for name, (_, s_row, s_col) in zip(("q", "k", "v"), blocks):
                    self._param(target, f"{name}_proj_weight", (s_row, s_col))
            if mod.in_proj_bias is not None:
                for rows, s_row, _ in blocks:
                    self._param(target, "in_proj_bias", (s_row,), rows=rows)
            if mod.bias_k is not None:
                self._param(target, "bias_k", (None, None, sq))
                self._param(target, "bias_v", (None, None, sv))
            self._param(target, "out_proj.weight", (s_out, sv))
            if mod.out_proj.bias is not None:
                self._param(target, "out_proj.bias", (s_out,))
        nd = len(_shape(args[0]) or (0, 0, 0))
        out = Feature(s_out, nd - 1)
        weights = None
        if _arg(node, 4, "need_weights", True) and not _arg(node, 6, "average_attn_weights", True):
            weights = Feature(h, 1 if nd == 3 else 0)  # (N, H, L, S): one map per head
        return Several((out, weights))

    def _fused_qkv(self, node: fx.Node, target: str, mod: Any) -> Feature:
        """A fused-qkv attention module as timm writes it (:func:`is_fused_qkv_attention`):
        ``qkv`` rows stacked q, k, v (each ``heads x head_dim``), optional per-head-dimension
        norms of q and k, an optional norm of the heads' output, ``proj``."""
        s_in = self._last_axis(node.args[0], "attention")
        if target in self.attn:  # shared module called again: same spaces
            old_in, s_out = self.attn[target][0], self.attn[target][-1]
            self.sp.union(old_in, s_in)
        else:
            heads, dim = mod.num_heads, mod.head_dim
            h = self.sp.new(heads, f"{target}:heads")
            d_qk, d_v = self.sp.new(dim, f"{target}:qk"), self.sp.new(dim, f"{target}:v")
            sq = self.sp.kron([h, d_qk], f"{target}:q")
            sv = self.sp.kron([h, d_v], f"{target}:v")
            s_out = self.sp.new(mod.proj.out_features, target)
            self.attn[target] = (s_in, h, sq, sv, s_out)
            e = heads * dim
            for rows, s_row in (((0, e), sq), ((e, 2 * e), sq), ((2 * e, 3 * e), sv)):
                self._param(target, "qkv.weight", (s_row, s_in), rows=rows)
                if mod.qkv.bias is not None:
                    self._param(target, "qkv.bias", (s_row,), rows=rows)
            for name, space in (("q_norm", d_qk), ("k_norm", d_qk), ("norm", sv)):
                for key in getattr(mod, name).state_dict():
                    self._param(target, f"{name}.{key}", (space,))
            self._param(target, "proj.weight", (s_out, sv))
            if mod.proj.bias is not None:
                self._param(target, "proj.bias", (s_out,))
        nd = len(_shape(node.args[0]) or (0, 0, 0))
        return Feature(s_out, nd - 1)

    # -- torchvision Swin (functions wrapped by torch.fx, reading their module's weights) ----
    def _param_key(self, arg: Any, what: str) -> str | None:
        v = self.val.get(arg) if isinstance(arg, fx.Node) else None
        if v is None and arg is None:
            return None
        if not isinstance(v, ParamUse):
            raise self.err(f"{what} must be a parameter of the model")
        return v.key

    def _relative_position_bias(self, node: fx.Node) -> Feature | None:
        """``_get_relative_position_bias(table, index, window)``: ``(T, H)`` -> ``(1, H, N, N)``."""
        table = node.args[0]
        v = self.val.get(table)
        if isinstance(v, ParamUse):  # Swin V1: the table is a parameter, its columns the heads
            if v.key not in self.tables:
                self.tables[v.key] = self.sp.new((_shape(table) or (0, 0))[1], v.key)
                self._param("", v.key, (None, self.tables[v.key]))
            return Feature(self.tables[v.key], 1)
        if v is None:
            return None
        if not isinstance(v, Feature) or (v.axis != 1 and not self.sp.is_fixed(v.space)):
            raise self.err("the relative position bias table must carry the heads on axis 1")
        return Feature(v.space, 1)  # Swin V2: the bias MLP's output features are the heads

    def _window_attention(self, node: fx.Node) -> Feature:
        """torchvision's ``shifted_window_attention``: multi-head attention on ``(B, H, W, C)``
        windows with the raw ``qkv``/``proj`` weights, a relative position bias ``(1, H, N, N)``
        and (V2) a per-head logit scale ``(H, 1, 1)``."""
        x = node.args[0]
        s_in = self._last_axis(x, "shifted_window_attention")
        c = (_shape(x) or ())[-1]
        n_heads = int(_arg(node, 5, "num_heads"))
        qkv_w = self._param_key(_arg(node, 1, "qkv_weight"), "qkv_weight")
        proj_w = self._param_key(_arg(node, 2, "proj_weight"), "proj_weight")
        assert qkv_w is not None and proj_w is not None  # required arguments
        name = (qkv_w or "attn").rsplit(".", 2)[0]
        h, sq, sv = self._heads(name, n_heads, c // n_heads, c // n_heads)
        s_out = self.sp.new(c, name)
        blocks = (((0, c), sq), ((c, 2 * c), sq), ((2 * c, 3 * c), sv))
        for rows, s_row in blocks:
            self._param("", qkv_w, (s_row, s_in), rows=rows)
        qkv_b = self._param_key(_arg(node, 9, "qkv_bias"), "qkv_bias")
        if qkv_b is not None:
            for rows, s_row in blocks:
                self._param("", qkv_b, (s_row,), rows=rows)
        self._param("", proj_w, (s_out, sv))
        proj_b = self._param_key(_arg(node, 10, "proj_bias"), "proj_bias")
        if proj_b is not None:
            self._param("", proj_b, (s_out,))
        scale = self._param_key(_arg(node, 11, "logit_scale"), "logit_scale")
        if scale is not None:
            self._param("", scale, (h, None, None))
        bias = self.val.get(_arg(node, 3, "relative_position_bias"))
        if isinstance(bias, Feature) and bias.axis == 1:
            self.sp.union(h, bias.space)
            if not self.sp.is_fixed(h):  # named after the attention, not the bias table
                self.sp.name[self.sp.find(h)] = f"{name}:heads"
        else:  # a bias that is not per head (or unknown): the heads keep their order
            self.sp.fix(h)
        return Feature(s_out, len(_shape(x) or (0,) * 4) - 1)

    def _patch_merging_pad(self, node: fx.Node) -> Feature | None:
        """``_patch_merging_pad``: the four 2 x 2 neighbours concatenated along channels."""
        v = self.val.get(node.args[0])
        if v is None:
            return None
        if not isinstance(v, Feature):
            raise self.err("_patch_merging_pad expects a feature tensor")
        nd = len(_shape(node) or (0,) * 4)
        s = self._on_axis(v, nd - 1, "_patch_merging_pad")
        if self.sp.is_fixed(s):
            return Feature(Spaces.FIXED, nd - 1)
        return Feature(self.sp.kron([self.sp.fixed_leaf(4), s], node.name), nd - 1)


_FUSED_CHILDREN = {"qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"}


def is_fused_qkv_attention(mod: nn.Module) -> bool:
    """Whether ``mod`` is laid out as timm's ``Attention``: exactly the children ``qkv`` (a
    Linear of ``3 x num_heads x head_dim`` rows), ``proj`` (a Linear reading ``num_heads x
    head_dim``), ``q_norm``/``k_norm`` (identity or a LayerNorm over ``head_dim``), ``norm``
    (identity or a LayerNorm over the heads' output), dropouts, and no parameter of its own.
    derive_spec treats such a module as standard multi-head attention (``check_spec`` then
    verifies it on the model)."""
    heads, dim = getattr(mod, "num_heads", None), getattr(mod, "head_dim", None)
    children = dict(mod.named_children())
    if not isinstance(heads, int) or not isinstance(dim, int) or set(children) != _FUSED_CHILDREN:
        return False
    if getattr(mod, "gate", None) is not None or any(True for _ in mod.parameters(recurse=False)):
        return False
    qkv, proj = children["qkv"], children["proj"]
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear):
        return False
    if qkv.out_features != 3 * heads * dim or proj.in_features != heads * dim:
        return False
    for name, size in (("q_norm", dim), ("k_norm", dim), ("norm", heads * dim)):
        norm = children[name]
        if isinstance(norm, nn.LayerNorm):
            if tuple(norm.normalized_shape) != (size,):
                return False
        elif not isinstance(norm, nn.Identity):
            return False
    return all(
        isinstance(children[n], (nn.Dropout, nn.Identity)) for n in ("attn_drop", "proj_drop")
    )
