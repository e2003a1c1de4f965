"""What every rule of the spec deriver (:mod:`lmc.permutation.derive`) shares, defined once:
the state of a derivation (the channel spaces, each node's value, the parameters' members,
the modules' spaces) and the helpers every rule uses (the error naming the node, a node's
input feature, a parameter's member, a layer's spaces, the check that a node reads no feature).
The rules of each kind of operation subclass it (:mod:`~lmc.permutation.derive_attention`,
:mod:`~lmc.permutation.derive_functional`, :mod:`~lmc.permutation.derive_shapes`,
:mod:`~lmc.permutation.derive_views`), and the deriver is all of them."""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from lmc.permutation.derive_spaces import (
    Feature,
    Member,
    ParamCat,
    ParamT,
    ParamUse,
    Several,
    Spaces,
)
from lmc.permutation.derive_where import describe as _describe
from lmc.permutation.spec import aliases


class SpecDerivationError(ValueError):
    """The model contains an operation whose permutation behaviour is unknown."""


def nodes_of(args: Any) -> list[fx.Node]:
    out: list[fx.Node] = []
    fx.node.map_arg(args, out.append)
    return out


class DeriverCore:
    """The state of a derivation and the helpers every rule uses."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module) -> None:
        self.gm = gm
        self.sp = Spaces()
        # node -> value, looked up by any argument (None: a constant)
        self.val: dict[Any, Feature | ParamUse | ParamT | ParamCat | Several | None] = {}
        self.members: list[Member] = []
        self.module_io: dict[str, tuple[int, int]] = {}
        self.attn: dict[str, tuple[int, ...]] = {}
        self.tables: dict[str, int] = {}
        self.points: list[tuple[str, int, int]] = []  # module name, space, priority
        self.buffers: dict[fx.Node, str] = {}  # get_attr of a state-dict buffer -> its key
        # the state dict's shapes (its keys: buffers, not the constants fx made attributes)
        self.shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}
        self.aliases = aliases(model)  # names of one tensor shared by modules: one spec
        self.node: fx.Node | None = None

    # -- helpers -------------------------------------------------------------------------
    def err(self, msg: str) -> SpecDerivationError:
        assert self.node is not None  # raised only while run() visits a node
        return SpecDerivationError(f"{_describe(self.node)}: {msg}")

    def _in(self, node: fx.Node, i: int = 0) -> Feature:
        arg = node.args[i] if i < len(node.args) else None
        v = self.val.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(arg, fx.Node) and v is None:  # a buffer or constant: not permuted
            return Feature(Spaces.FIXED, 1)
        if not isinstance(v, Feature):
            raise self.err(f"expected a feature tensor as argument {i}")
        return v

    def _fixed(self, s: int) -> bool:
        return self.sp.is_fixed(s)

    def _sized(self, s: int, n: int) -> int:
        """``s``, or a fixed space of ``n`` units if ``s`` is fixed (whose size may differ: the
        fixed space stands for any unpermuted axis), to build concatenations and products."""
        return self.sp.fixed_leaf(n) if self.sp.is_fixed(s) else s

    def _param(self, prefix: str, name: str, axes: tuple[int | None, ...], rows=None) -> None:
        key = f"{prefix}.{name}" if prefix else name
        for axis, s in enumerate(axes):
            if s is not None:
                self.members.append((key, axis, s, rows))

    def _point(self, target: str, v: Feature, prio: int) -> None:
        if v.axis == 1:
            self.points.append((target, v.space, prio))

    def _on_axis(self, v: Feature, axis: int, what: str) -> int:
        """The space of ``v`` if it sits on ``axis`` (a fixed space anywhere is fine)."""
        if v.axis != axis and not self._fixed(v.space):
            raise self.err(
                f"{what} acts on axis {axis} but the permuted features are on axis {v.axis}"
            )
        return v.space if v.axis == axis else Spaces.FIXED

    def _layer(self, target: str, s_in: int, make_out) -> tuple[int, int]:
        if target in self.module_io:  # shared module called again: same spaces
            s0, s1 = self.module_io[target]
            self.sp.union(s0, s_in)
            return s0, s1
        s_out = make_out()
        self.module_io[target] = (s_in, s_out)
        return s_in, s_out

    def _live(self, v: Any) -> bool:
        """Whether ``v`` carries a permuted axis (a tuple: in one of its items)."""
        if isinstance(v, Several):
            return any(self._live(i) for i in v.items)
        return isinstance(v, Feature) and not self._fixed(v.space)

    def _generic(self, node: fx.Node) -> None:
        """A node reading no feature tensor (shapes, asserts, masks) carries no permutation."""
        for a in nodes_of((node.args, node.kwargs)):
            v = self.val.get(a)
            if self._live(v):
                raise self.err("cannot derive how a permutation passes through this operation")
            if isinstance(v, (ParamUse, ParamT)):
                raise self.err(
                    f"parameter {v.key!r} is used outside its module in a way derive_spec "
                    "does not know; write a PermutationSpec by hand"
                )
        return None
