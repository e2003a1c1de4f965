"""Derive a permutation spec for a user's model by tracing it with ``torch.fx`` (C2).

Every tensor in the traced graph carries a *channel space* on one axis (its feature axis: axis 1
of a feature map, the last axis of a channels-last or token tensor): the identity of its units.
A Linear/Conv creates a new space for its output; norms, elementwise activations, dropout,
stochastic depth, pooling and shape-only nodes (``torch._assert``, ``size``) pass it through;
a residual ``add`` or a squeeze-and-excitation product merges the spaces of its operands, which
is how a ResNet stream shares one permutation across blocks and shortcuts (002 App. D).
``permute``/``transpose``/``view`` move the feature axis; ``flatten`` of a ``C x H x W`` map
gives ``C`` blocks of ``H W`` features (block permutation), ``torch.cat`` of feature maps the
concatenation of their spaces (block-diagonal), a grouped convolution splits its input and
output into groups permuted within (depthwise: the input's permutation carries through); see
:mod:`lmc.permutation.derive_spaces`. The model's inputs and outputs have a fixed order, so
spaces merged with them are not permuted. Each remaining leaf space is one permutation group,
named after the module that first produced it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from lmc.permutation.derive_attention import AttentionRules, is_fused_qkv_attention
from lmc.permutation.derive_core import SpecDerivationError, nodes_of
from lmc.permutation.derive_functional import FunctionalRules
from lmc.permutation.derive_ops import (
    ACTIVATIONS,
    BINARY_FUNCTIONS,
    BINARY_METHODS,
    ELEMENTWISE_FUNCTIONS,
    ELEMENTWISE_METHODS,
    ELEMENTWISE_NAMES,
    PASS_MODULES,
)
from lmc.permutation.derive_shapes import ShapeRules
from lmc.permutation.derive_spaces import (
    Feature,
    NotExpressible,
    ParamUse,
    Several,
    Spaces,
    spec_from,
)
from lmc.permutation.derive_spaces import node_arg as _arg
from lmc.permutation.derive_spaces import node_shape as _shape
from lmc.permutation.derive_trace import trace_for_derivation
from lmc.permutation.derive_views import ViewRules
from lmc.permutation.derive_where import untraceable_at as _untraceable_at
from lmc.permutation.spec import PermutationSpec

_SHAPE_METHODS = {"size", "dim"}
_TENSOR_ATTRIBUTES = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}
_TORCHVISION_FUNCTIONS = {  # wrapped by torch.fx (one node each): name -> rule
    "shifted_window_attention": "_window_attention",
    "_get_relative_position_bias": "_relative_position_bias",
    "_patch_merging_pad": "_patch_merging_pad",
}


class _Deriver(AttentionRules, ShapeRules, ViewRules, FunctionalRules):
    """The spec deriver: the rules of every kind of operation over the shared state and
    helpers of :class:`~lmc.permutation.derive_core.DeriverCore`."""

    # -- modules ---------------------------------------------------------------------------
    def call_module(self, node: fx.Node) -> Feature | Several | None:
        target = str(node.target)
        mod = self.gm.get_submodule(target)
        shape_in = _shape(node.args[0]) if node.args else None
        if isinstance(mod, nn.Linear):
            bias = f"{target}.bias" if mod.bias is not None else None
            return self._linear(node, target, mod.out_features, f"{target}.weight", bias)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return self._conv(node, target, mod)
        if isinstance(mod, (nn.ConvTranspose1d, nn.ConvTranspose2d)) and mod.groups == 1:
            return self._conv_transpose(node, target, mod)
        if isinstance(
            mod, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
        ):
            v = self._in(node)
            s = self._on_axis(v, 1, type(mod).__name__)
            for name, t in mod.state_dict(keep_vars=True).items():
                self._param(target, name, (s,) if t.ndim else ())
            self._point(target, v, 1)
            return v
        if isinstance(mod, nn.GroupNorm):
            v = self._in(node)
            s = self._on_axis(v, 1, "GroupNorm")
            if 1 < mod.num_groups < mod.num_channels:  # permute within each group
                n = mod.num_channels // mod.num_groups
                self.sp.union(s, self.sp.cat(self.sp.split(s, [n] * mod.num_groups), target))
            for name, t in mod.state_dict(keep_vars=True).items():
                self._param(target, name, (s,) if t.ndim else ())
            self._point(target, v, 1)
            return v
        if isinstance(mod, nn.LayerNorm):
            v = self._in(node)
            self._layer_norm(v, len(shape_in or ()), len(mod.normalized_shape), target, mod)
            self._point(target, v, 1)
            return v
        if isinstance(mod, nn.PReLU):
            v = self._in(node)
            s_w = self._on_axis(v, 1, "PReLU") if mod.weight.numel() > 1 else None
            self._param(target, "weight", (s_w,))
            self._point(target, v, 0)
            return v
        if isinstance(mod, ACTIVATIONS):
            v = self._in(node)
            self._point(target, v, 0)
            return v
        if isinstance(mod, PASS_MODULES):
            return self._in(node)
        if isinstance(mod, nn.Flatten):
            return self._flatten(node, mod.start_dim, mod.end_dim)
        if isinstance(mod, nn.MultiheadAttention):
            return self._mha(node, target, mod)
        if is_fused_qkv_attention(mod):
            return self._fused_qkv(node, target, mod)
        raise self.err(
            f"cannot derive how a permutation passes through module {target!r} of type "
            f"{type(mod).__name__}; supported are Linear, Conv (grouped too), BatchNorm, "
            "InstanceNorm, LayerNorm, GroupNorm (also as functions), MultiheadAttention, "
            "elementwise activations, dropout, "
            "pooling and flatten; write a PermutationSpec by hand for this model"
        )

    def _conv(self, node: fx.Node, target: str, mod: nn.Conv1d | nn.Conv2d | nn.Conv3d) -> Feature:
        v = self._in(node)
        s_in = self._on_axis(v, 1, "Conv")
        g, cin, cout = mod.groups, mod.in_channels, mod.out_channels
        w = (None,) * (mod.weight.ndim - 2)
        if g == 1:
            s_in, s_out = self._layer(target, s_in, lambda: self.sp.new(cout, target))
            self._param(target, "weight", (s_out, s_in, *w))
        elif cin == g:  # depthwise: output channel k*m+j reads input channel k only
            m = cout // g
            s_in, s_out = self._layer(
                target,
                s_in,
                lambda: (
                    self.sp.kron([self._sized(s_in, cin), self.sp.fixed_leaf(m)], target)
                    if m > 1
                    else s_in
                ),
            )
            self._param(target, "weight", (s_out, None, *w))
        else:  # grouped: within-group permutations, each group its own
            ci, co = cin // g, cout // g
            if target in self.module_io:
                raise self.err("a grouped convolution called twice is not supported")
            ins = self.sp.split(s_in, [ci] * g)
            self.sp.union(s_in, self.sp.cat(ins, f"{target}:in"))
            outs = [self.sp.new(co, f"{target}:{i}") for i in range(g)]
            s_out = self.sp.cat(outs, target)
            self.module_io[target] = (s_in, s_out)
            for i in range(g):
                self._param(target, "weight", (outs[i], ins[i], *w), rows=(i * co, i * co + co))
        if mod.bias is not None:
            self._param(target, "bias", (s_out,))
        out = Feature(s_out, 1)
        self._point(target, out, 2)
        return out

    def _layer_norm(self, v: Feature, nd: int, nn_dims: int, target: str, mod: Any) -> None:
        first = nd - nn_dims
        if v.axis >= first and not self._fixed(v.space):
            for name in ("weight", "bias"):
                t = mod.get(name) if isinstance(mod, dict) else getattr(mod, name, None)
                if t is None:
                    continue
                axes: list[int | None] = [None] * nn_dims
                axes[v.axis - first] = v.space
                if isinstance(mod, dict):
                    self._param("", t, tuple(axes))
                else:
                    self._param(target, name, tuple(axes))

    def call_function(self, node: fx.Node) -> Any:
        fn = node.target
        name = getattr(fn, "__name__", "")
        if fn in BINARY_FUNCTIONS:
            return self._broadcast(node, list(node.args[:2]))
        if fn in (torch.addcmul, torch.addcdiv):  # input + value * t1 (* or /) t2
            return self._broadcast(node, list(node.args[:3]))
        if fn in ELEMENTWISE_FUNCTIONS or name in ELEMENTWISE_NAMES:
            return self._in(node) if isinstance(self.val.get(node.args[0]), Feature) else None
        if fn is torch.flatten:
            return self._flatten(node, _arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1))
        if fn is torch.cat or fn is torch.concat:
            return self._cat(node)
        if fn is torch.permute:
            return self._permute(node, _arg(node, 1, "dims"))
        if fn is torch.transpose:
            return self._transpose(node)
        if fn in (torch.reshape,):
            return self._view(node)
        if fn in (torch.mean, torch.amax, torch.sum):
            return self._reduce(node)
        if fn in (torch.norm, torch.linalg.vector_norm):
            return self._reduce(node, at=2)
        if fn is F.layer_norm:
            v = self._in(node)
            shp = _arg(node, 1, "normalized_shape")
            params = {}
            for i, pname in ((2, "weight"), (3, "bias")):
                p = self.val.get(_arg(node, i, pname))
                if isinstance(p, ParamUse):
                    params[pname] = p.key
            self._layer_norm(v, len(_shape(node) or ()), len(shp), "", params)
            return v
        if fn in (F.batch_norm, F.instance_norm, F.group_norm):
            return self._functional_norm(node, fn)
        if fn is F.linear:
            return self._functional_linear(node)
        if fn is F.pad:
            return self._pad(node)
        if fn is operator.getitem:
            src = self.val.get(node.args[0])
            if isinstance(src, Several) and isinstance(node.args[1], int):
                return src.items[node.args[1]]
            if isinstance(src, Feature) and not self._fixed(src.space):
                return self._index(node, src)
            index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
            if isinstance(src, ParamUse) and any(isinstance(i, fx.Node) for i in index):
                return None  # a table gathered by an index tensor (relative position biases):
                # a constant that keeps its order, fixing what it meets
            return self._generic(node)
        if fn is getattr and node.args[1] in _TENSOR_ATTRIBUTES:
            return None
        if fn in (torch.chunk, torch.split):
            return self._split(node, _arg(node, 2, "dim", 0))
        if fn is torch.stack:
            return self._stack(node)
        if fn in (operator.matmul, torch.matmul, torch.bmm):
            return self._matmul(node)
        if fn is F.scaled_dot_product_attention:
            return self._sdpa(node)
        if fn is torch.roll:  # Swin's shifted windows: a shift of other axes moves no feature
            return self._along(node, _arg(node, 2, "dims"))
        if fn is torch.unbind:
            return self._unbind(node, _arg(node, 1, "dim", 0))
        rule = _TORCHVISION_FUNCTIONS.get(name)
        if rule and getattr(fn, "__module__", "").startswith("torchvision."):
            return getattr(self, rule)(node)
        return self._generic(node)

    def call_method(self, node: fx.Node) -> Any:
        name = str(node.target)
        src = self.val.get(node.args[0]) if node.args else None
        if name in _SHAPE_METHODS:
            return None
        if name in BINARY_METHODS:
            return self._broadcast(node, list(node.args[:2]))
        if name in ELEMENTWISE_METHODS:
            return src if isinstance(src, (Feature, ParamUse)) else self._generic(node)
        if name == "flatten":
            return self._flatten(node, _arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1))
        if name in ("view", "reshape", "squeeze", "unsqueeze", "view_as", "reshape_as"):
            return self._view(node)
        if name == "permute":
            dims: Sequence[Any] = node.args[1:]
            dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims
            return self._permute(node, dims)
        if name == "transpose":
            return self._transpose(node)
        if name == "expand" and isinstance(src, ParamUse):
            return ParamUse(src.key, src.ndim, len(_shape(node) or ()) - src.ndim)
        if name in ("expand", "expand_as") and isinstance(src, Feature):
            return self._expand(node, src)
        if name in ("mean", "amax", "sum"):
            return self._reduce(node)
        if name == "norm":
            return self._reduce(node, at=2)
        if name in ("chunk", "split"):
            return self._split(node, _arg(node, 2, "dim", 0))
        if name == "repeat" and (out := self._repeat(node, src)) is not None:
            return out
        if name in ("matmul", "bmm"):
            return self._matmul(node)
        if name == "unbind":
            return self._unbind(node, _arg(node, 1, "dim", 0))
        if name == "roll":
            return self._along(node, _arg(node, 2, "dims"))
        if name == "repeat_interleave":
            return self._along(node, _arg(node, 2, "dim"))
        if isinstance(src, Feature) and not self._fixed(src.space):
            raise self.err(f"cannot derive how a permutation passes through method .{name}()")
        return self._generic(node)

    def run(self, model_name: str) -> PermutationSpec:
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self.val[node] = Feature(Spaces.FIXED, 1)
            elif node.op == "get_attr":
                t = self.gm.get_parameter(node.target) if _is_param(self.gm, node.target) else None
                key = str(node.target)
                if t is None:
                    self.val[node] = None  # a buffer or constant: not permuted ...
                    if key in self.shapes:  # ... unless a functional norm reads it
                        self.buffers[node] = key
                else:
                    self.val[node] = ParamUse(key, t.ndim)
            elif node.op == "output":
                for a in nodes_of(node.args):
                    v = self.val.get(a)
                    for f in v.items if isinstance(v, Several) else (v,):
                        if isinstance(f, Feature):
                            self.sp.fix(f.space)
            else:
                try:
                    self.val[node] = getattr(self, node.op)(node)
                except NotExpressible as e:
                    raise self.err(str(e)) from None
        self.members += [(o, *m[1:]) for m in self.members for o in self.aliases.get(m[0], ())]
        try:
            return spec_from(self.sp, self.shapes, self.members, self.points)
        except NotExpressible as e:
            raise SpecDerivationError(f"{model_name}: {e}") from None


def _is_param(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


class _Tracer(fx.Tracer):
    """torch.fx's tracer, with fused-qkv attention modules kept whole (derived as a unit)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_fused_qkv_attention(m) or super().is_leaf_module(m, module_qualified_name)


def derive_spec(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> PermutationSpec:
    """Derive the permutation spec of ``model`` from its ``torch.fx`` graph.

    Supports Linear and Conv (grouped and depthwise too), BatchNorm, InstanceNorm, LayerNorm
    (channels-first or channels-last), GroupNorm (modules, or the functions a module calls:
    ``F.batch_norm``, ``F.instance_norm``, ``F.group_norm``, ``F.layer_norm``), elementwise
    activations (modules or functions), dropout,
    stochastic depth, pooling, flatten of feature maps (block permutations),
    ``torch.cat`` of feature maps (block-diagonal), permute/transpose/view that move the feature
    axis, squeeze-and-excitation products, residual ``+``, parameters added or multiplied
    elementwise (layer scale, class tokens) and shape-only nodes. Activation points for
    :func:`~lmc.permutation.activation_matching` are the activation modules on each group's
    channels (else its norm modules, else the Linear/Conv outputs); a residual stream lists all
    of them (002 App. D).

    Args:
        model: the network; it is traced, not modified (it is run once in eval mode).
        example_input: a batch (or tuple of inputs) used to propagate shapes.

    Raises:
        SpecDerivationError: naming the graph node and the model whose operation cannot be
            handled, or when the model cannot be traced by ``torch.fx``.
    """
    name = type(model).__name__
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    gm, e = trace_for_derivation(model, inputs, _Tracer, is_fused_qkv_attention)
    if e is not None:
        at = _untraceable_at(model, e)
        raise SpecDerivationError(
            f"torch.fx could not trace {name}{f' at {at}' if at else ''} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); derive_spec needs a "
            "forward without data-dependent control flow (no Python if/for on tensor values). "
            "Write the spec by hand instead: PermutationSpec({key: (group or None per axis)}) "
            "for every state-dict entry, and pass it as spec= (or spec: package.module:function "
            "in YAML)"
        ) from e
    assert gm is not None  # traced: no error
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception as err:  # noqa: BLE001 - the model's own error, prefixed with the call
        cause: BaseException = err
        while cause.__cause__ is not None:  # ShapeProp wraps it with the whole graph node
            cause = cause.__cause__
        raise SpecDerivationError(
            f"derive_spec: running {name} on the example input of shape "
            f"{[tuple(t.shape) for t in inputs if isinstance(t, Tensor)]} failed: "
            f"{type(cause).__name__}: {cause}"
        ) from err
    finally:
        model.train(was_training)
    try:
        return _Deriver(gm, model).run(name)
    except SpecDerivationError as e:
        msg = str(e)
        if "by hand" not in msg:
            msg += f"; {HAND_WRITTEN}"
        raise SpecDerivationError(f"{name}: {msg}") from None


#: what an error says to write instead of a derived spec
HAND_WRITTEN = (
    "write the spec by hand for this model: PermutationSpec({key: (group or None per axis)}) "
    "for every state-dict entry, the channels this operation mixes in no group, passed as "
    "spec= (or spec: package.module:function in YAML)"
)
