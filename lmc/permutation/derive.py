"""Derive a permutation spec for a user's model by tracing it with ``torch.fx`` (C2).

Every tensor in the traced graph carries a *channel space*: the identity of its feature axis
(axis 1). A Linear/Conv2d creates a new space for its output; norms, elementwise activations,
dropout, pooling and flatten (of a 1x1 map) pass the space through; a residual ``add`` (or an
elementwise product) merges the spaces of its operands, which is how a ResNet stream ends up
sharing one permutation across blocks and shortcuts (002 App. D). The model's inputs and outputs
have a fixed order, so spaces merged with them are not permuted. Each remaining space is one
permutation group; the group is named after the first module that produced it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from lmc.permutation.spec import PermutationSpec


class SpecDerivationError(ValueError):
    """The model contains an operation whose permutation behaviour is unknown."""


_ACTIVATIONS = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
    nn.Tanhshrink, nn.LogSigmoid,
)  # fmt: skip
_PASS_MODULES = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
)  # fmt: skip
_ELEMENTWISE_FUNCTIONS = {
    F.relu, F.relu6, F.leaky_relu, F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.softplus,
    F.hardtanh, F.hardswish, F.hardsigmoid, F.dropout, F.dropout1d, F.dropout2d, F.sigmoid,
    F.tanh, torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu_,
    F.max_pool1d, F.max_pool2d, F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d, F.adaptive_max_pool1d, F.adaptive_max_pool2d, torch.clone,
}  # fmt: skip
_BINARY_FUNCTIONS = {
    operator.add, operator.iadd, operator.sub, operator.isub, operator.mul, operator.imul,
    operator.truediv, operator.itruediv, torch.add, torch.sub, torch.mul, torch.div,
}  # fmt: skip
_ELEMENTWISE_METHODS = {
    "relu", "relu_", "sigmoid", "tanh", "clone", "contiguous", "detach", "float", "to",
}  # fmt: skip
_BINARY_METHODS = {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_"}
_SHAPE_METHODS = {"size", "dim"}


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # keep the older root so that the fixed space (0) and first producers stay roots
            ra, rb = min(ra, rb), max(ra, rb)
            self.parent[rb] = ra
        return ra


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _describe(node: fx.Node) -> str:
    target = (
        node.target
        if isinstance(node.target, str)
        else getattr(node.target, "__name__", node.target)
    )
    return f"node {node.name!r} ({node.op} {target})"


class _Deriver:
    def __init__(self, gm: fx.GraphModule, model: nn.Module) -> None:
        self.gm = gm
        self.model = model
        self.uf = _UnionFind()
        self.fixed = self.uf.new()
        self.space: dict[fx.Node, int | None] = {}
        self.members: list[tuple[str, int, int]] = []  # key, axis, space
        self.names: dict[int, str] = {}  # space created by a module -> module name
        self.module_out: dict[str, int] = {}
        self.module_in: dict[str, int] = {}
        self.points: list[tuple[str, int, int]] = []  # module name, space, priority

    # -- helpers -------------------------------------------------------------------------
    def _in(self, node: fx.Node, i: int = 0) -> int:
        arg = node.args[i] if i < len(node.args) else None
        if not isinstance(arg, fx.Node) or self.space.get(arg) is None:
            raise SpecDerivationError(f"{_describe(node)}: expected a tensor as argument {i}")
        return self.space[arg]  # type: ignore[return-value]

    def _fixed(self, s: int) -> bool:
        return self.uf.find(s) == self.uf.find(self.fixed)

    def _check_channels_kept(self, node: fx.Node, what: str) -> None:
        src = node.args[0]
        s_in = _shape(src) if isinstance(src, fx.Node) else None
        s_out = _shape(node)
        space = self._in(node)
        if self._fixed(space) or s_in is None or s_out is None:
            return
        if len(s_out) < 2 or len(s_in) < 2 or s_in[1] != s_out[1] or s_in[0] != s_out[0]:
            raise SpecDerivationError(
                f"{_describe(node)}: {what} maps shape {s_in} to {s_out}, mixing channels with "
                "other axes; only flattening a map whose spatial size is 1 (after global "
                "pooling) keeps a permutation expressible per axis"
            )

    def _param(self, prefix: str, name: str, axes: Sequence[int | None]) -> None:
        key = f"{prefix}.{name}" if prefix else name
        for axis, s in enumerate(axes):
            if s is not None:
                self.members.append((key, axis, s))

    def _layer_spaces(self, node: fx.Node, target: str) -> tuple[int, int]:
        s_in = self._in(node)
        if target in self.module_out:  # shared module called again: same spaces
            self.uf.union(self.module_in[target], s_in)
            return self.module_in[target], self.module_out[target]
        s_out = self.uf.new()
        self.names[s_out] = target
        self.module_in[target], self.module_out[target] = s_in, s_out
        return s_in, s_out

    # -- node handlers ---------------------------------------------------------------------
    def call_module(self, node: fx.Node) -> int | None:
        target = str(node.target)
        mod = self.gm.get_submodule(target)
        shape_in = _shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
        if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            if isinstance(mod, nn.Linear) and shape_in is not None and len(shape_in) != 2:
                raise SpecDerivationError(
                    f"{_describe(node)}: Linear on a rank-{len(shape_in)} input is not "
                    "supported (its features are the last axis, not axis 1)"
                )
            if not isinstance(mod, nn.Linear) and mod.groups != 1:
                raise SpecDerivationError(
                    f"{_describe(node)}: grouped/depthwise conv is not supported"
                )
            s_in, s_out = self._layer_spaces(node, target)
            self.points.append((target, s_out, 2))  # pre-activations: last-resort points
            w = mod.weight
            self._param(target, "weight", (s_out, s_in) + (None,) * (w.ndim - 2))
            if mod.bias is not None:
                self._param(target, "bias", (s_out,))
            return s_out
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
            s = self._in(node)
            if isinstance(mod, nn.GroupNorm) and mod.num_groups not in (1, mod.num_channels):
                raise SpecDerivationError(
                    f"{_describe(node)}: GroupNorm with {mod.num_groups} groups of "
                    f"{mod.num_channels} channels only allows permutations within groups; "
                    "use num_groups=1 (LayerNorm) or num_groups=num_channels"
                )
            if isinstance(mod, nn.LayerNorm):
                if shape_in is None or tuple(mod.normalized_shape) != tuple(shape_in[1:]):
                    raise SpecDerivationError(
                        f"{_describe(node)}: LayerNorm{tuple(mod.normalized_shape)} on input "
                        f"{shape_in} must normalise every axis but the batch axis"
                    )
            for name, t in mod.state_dict(keep_vars=True).items():
                self._param(target, name, (s,) + (None,) * (t.ndim - 1) if t.ndim else ())
            self.points.append((target, s, 1))
            return s
        if isinstance(mod, nn.PReLU):
            s = self._in(node)
            self._param(target, "weight", (s if mod.weight.numel() > 1 else None,))
            self.points.append((target, s, 0))
            return s
        if isinstance(mod, _ACTIVATIONS):
            s = self._in(node)
            self.points.append((target, s, 0))
            return s
        if isinstance(mod, _PASS_MODULES):
            return self._in(node)
        if isinstance(mod, nn.Flatten):
            if mod.start_dim != 1 or mod.end_dim != -1:
                raise SpecDerivationError(f"{_describe(node)}: only Flatten(1, -1) is supported")
            self._check_channels_kept(node, "flatten")
            return self._in(node)
        raise SpecDerivationError(
            f"{_describe(node)}: cannot derive how a permutation passes through module "
            f"{target!r} of type {type(mod).__name__}; supported are Linear, Conv, BatchNorm, "
            "LayerNorm, GroupNorm(1, C), elementwise activations, dropout, pooling and flatten"
        )

    def _binary(self, node: fx.Node) -> int | None:
        spaces = [self.space.get(a) for a in node.args[:2] if isinstance(a, fx.Node)]
        spaces = [s for s in spaces if s is not None]
        if not spaces:
            return None
        s = spaces[0]
        for other in spaces[1:]:
            s = self.uf.union(s, other)
        return s

    def call_function(self, node: fx.Node) -> int | None:
        fn = node.target
        if fn in _BINARY_FUNCTIONS:
            return self._binary(node)
        if fn in _ELEMENTWISE_FUNCTIONS:
            return self._in(node)
        if fn is torch.flatten:
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            if start != 1:
                raise SpecDerivationError(
                    f"{_describe(node)}: only torch.flatten(x, 1) is supported"
                )
            self._check_channels_kept(node, "flatten")
            return self._in(node)
        if fn in (torch.mean, torch.amax, torch.sum):
            return self._reduce(node)
        if fn is getattr or fn is operator.getitem:
            src = node.args[0]
            if (
                isinstance(src, fx.Node)
                and self.space.get(src) is not None
                and fn is operator.getitem
            ):
                raise SpecDerivationError(
                    f"{_describe(node)}: indexing a feature tensor is not supported"
                )
            return None
        raise SpecDerivationError(
            f"{_describe(node)}: cannot derive how a permutation passes through function "
            f"{getattr(fn, '__name__', fn)}"
        )

    def _reduce(self, node: fx.Node) -> int:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
        s_in = _shape(node.args[0]) if isinstance(node.args[0], fx.Node) else None
        nd = len(s_in) if s_in is not None else 4
        if not dims or any(d % nd in (0, 1) for d in dims):
            raise SpecDerivationError(
                f"{_describe(node)}: reductions over the batch or channel axis are not supported"
            )
        return self._in(node)

    def call_method(self, node: fx.Node) -> int | None:
        name = str(node.target)
        if name in _SHAPE_METHODS:
            return None
        if name in _BINARY_METHODS:
            return self._binary(node)
        if name in _ELEMENTWISE_METHODS:
            return self._in(node)
        if name in ("flatten", "view", "reshape", "squeeze"):
            self._check_channels_kept(node, name)
            return self._in(node)
        if name in ("mean", "amax", "sum"):
            return self._reduce(node)
        raise SpecDerivationError(
            f"{_describe(node)}: cannot derive how a permutation passes through method .{name}()"
        )

    def run(self) -> PermutationSpec:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.space[node] = self.fixed
            elif node.op == "get_attr":
                raise SpecDerivationError(
                    f"{_describe(node)}: parameters used outside their module (functional "
                    "use of weights) are not supported"
                )
            elif node.op == "output":
                self._fix_output(node.args)
            else:
                self.space[node] = getattr(self, node.op)(node)
        return self._build()

    def _fix_output(self, arg: Any) -> None:
        if isinstance(arg, fx.Node):
            if self.space.get(arg) is not None:
                self.uf.union(self.fixed, self.space[arg])  # type: ignore[arg-type]
        elif isinstance(arg, (tuple, list)):
            for a in arg:
                self._fix_output(a)
        elif isinstance(arg, dict):
            for a in arg.values():
                self._fix_output(a)

    def _build(self) -> PermutationSpec:
        root_name: dict[int, str] = {}
        for s in sorted(self.names):  # creation order = graph order
            root_name.setdefault(self.uf.find(s), self.names[s])
        fixed = self.uf.find(self.fixed)
        axes: dict[str, list[str | None]] = {}
        state = self.model.state_dict()
        for key, t in state.items():
            axes[key] = [None] * t.ndim
        for key, axis, s in self.members:
            r = self.uf.find(s)
            if r != fixed:
                axes[key][axis] = root_name[r]
        groups = {g for ax in axes.values() for g in ax if g is not None}
        best: dict[str, list[tuple[int, str]]] = {}
        seen_module: dict[str, str | None] = {}
        for target, s, _prio in self.points:
            r = self.uf.find(s)
            g = root_name.get(r) if r != fixed else None
            if target in seen_module and seen_module[target] != g:
                seen_module[target] = None  # module reused on different spaces: not a point
                continue
            seen_module[target] = g
        for target, _s, prio in self.points:
            g = seen_module.get(target)
            if g is not None and g in groups:
                best.setdefault(g, []).append((prio, target))
        acts = {}
        for g, pts in best.items():
            top = min(p for p, _ in pts)
            names = [t for p, t in pts if p == top]
            acts[g] = tuple(dict.fromkeys(names))
        return PermutationSpec({k: tuple(a) for k, a in axes.items()}, acts)


def derive_spec(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> PermutationSpec:
    """Derive the permutation spec of ``model`` from its ``torch.fx`` graph.

    Supports graphs of Linear/Conv1d/Conv2d, BatchNorm, LayerNorm (over all non-batch axes),
    GroupNorm(1, C), elementwise activations (modules or functions), dropout, pooling,
    flatten/view of a 1x1 map, spatial means and residual ``+``. Activation points for
    :func:`~lmc.permutation.activation_matching` are the activation modules on each group's
    channels (else its norm modules, else the Linear/Conv outputs); a residual stream lists all
    of them (002 App. D).

    Args:
        model: the network; it is traced, not modified (it is run once in eval mode).
        example_input: a batch (or tuple of inputs) used to propagate shapes.

    Raises:
        SpecDerivationError: naming the graph node whose operation cannot be handled, or when
            the model cannot be traced by ``torch.fx``.
    """
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - any tracing failure is reported the same way
        raise SpecDerivationError(
            f"torch.fx could not trace {type(model).__name__} ({e}); derive_spec needs a forward "
            "without data-dependent control flow, or write a PermutationSpec by hand"
        ) from e
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    finally:
        model.train(was_training)
    return _Deriver(gm, model).run()
