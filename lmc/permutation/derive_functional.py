"""Functional forms for :func:`~lmc.permutation.derive_spec` (issue 35): what timm's blocks
call as functions on their own parameters — ``F.linear`` (timm's ``Linear``), ``F.batch_norm``
/ ``F.instance_norm`` / ``F.group_norm`` (``BatchNormAct2d``, ``GroupNorm1``) — and spatial
``F.pad``, each as its module form."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import fx, nn

from lmc.permutation.derive_core import DeriverCore
from lmc.permutation.derive_spaces import (
    Feature,
    ParamCat,
    ParamUse,
    node_arg,
    node_shape,
)

_arg, _shape = node_arg, node_shape


class FunctionalRules(DeriverCore):
    """Mixin of the deriver: Linear layers (module or function), functional norms, padding."""

    def _linear(
        self, node: fx.Node, target: str, out_features: int, weight: str, bias: str | None
    ) -> Feature:
        """A Linear layer (module, or ``F.linear`` on its parameters) on the last axis."""
        v = self._in(node)
        shape_in = _shape(node.args[0]) if node.args else None
        nd = len(shape_in) if shape_in else 2
        if v.axis != nd - 1 and not self.sp.is_fixed(v.space):
            # it mixes another axis (MLP-Mixer's tokens), each feature alone: the features
            # pass through on their axis, and the layer's own units stay in their order (a
            # tensor carries one permuted axis)
            self.sp.fix(self._layer(target, self.sp.FIXED, lambda: self.sp.FIXED)[1])
            return v
        s_in = self._on_axis(v, nd - 1, "Linear")
        s_in, s_out = self._layer(target, s_in, lambda: self.sp.new(out_features, target))
        out = Feature(s_out, nd - 1)
        self._point(target, out, 2)
        self._param("", weight, (s_out, s_in))
        if bias is not None:
            self._param("", bias, (s_out,))
        return out

    def _conv_transpose(
        self, node: fx.Node, target: str, mod: nn.ConvTranspose1d | nn.ConvTranspose2d
    ) -> Feature:
        """A transposed convolution (one group): its weight is ``(in, out, kernel...)``."""
        s_in, s_out = self._layer(
            target, self._on_axis(self._in(node), 1, "ConvTranspose"),
            lambda: self.sp.new(mod.out_channels, target),
        )  # fmt: skip
        self._param(target, "weight", (s_in, s_out, *(None,) * (mod.weight.ndim - 2)))
        if mod.bias is not None:
            self._param(target, "bias", (s_out,))
        return Feature(s_out, 1)

    def _functional_linear(self, node: fx.Node) -> Feature:
        """``F.linear(x, weight, bias)`` on a module's parameters (timm's ``Linear`` casts its
        weight and calls it): the module's Linear layer."""
        keys = []
        cat = self.val.get(_arg(node, 2, "bias"))
        for i, name in ((1, "weight"), (2, "bias")):
            arg = _arg(node, i, name)
            key = self._state_key(arg)
            if arg is not None and key is None and not (i == 2 and isinstance(cat, ParamCat)):
                raise self.err(f"F.linear with a {name} that is not a parameter of the model")
            keys.append(key)
        weight, bias = keys
        assert weight is not None  # F.linear's weight is required, a parameter (checked above)
        target = weight.rsplit(".", 1)[0] if "." in weight else weight
        out = self._linear(node, target, (_shape(node) or (0,))[-1], weight, bias)
        if isinstance(cat, ParamCat):  # a bias concatenated from parts: each its rows
            parts = self.sp.split(out.space, [n for _, n, _ in cat.parts])
            for (key, _, uniform), part in zip(cat.parts, parts):
                if key is not None:
                    self._param("", key, (part,))
                elif not uniform:
                    self.sp.fix(part)
        return out

    def _state_key(self, arg: Any) -> str | None:
        """The state-dict key of a parameter or buffer a function reads, else ``None``."""
        used = self.val.get(arg) if isinstance(arg, fx.Node) else None
        return used.key if isinstance(used, ParamUse) else self.buffers.get(arg)

    def _pad(self, node: fx.Node) -> Feature | None:
        """``F.pad`` of the trailing axes (spatial padding, window partitions): the features
        pass through unless their own axis is padded."""
        v = self.val.get(node.args[0])
        if not isinstance(v, Feature):
            self._generic(node)
            return None
        if self._fixed(v.space):
            return v
        pad = _arg(node, 1, "pad")
        nd = len(_shape(node) or ())
        padded = range(nd - len(pad) // 2, nd)
        widths = [pad[2 * (nd - 1 - k)] or pad[2 * (nd - 1 - k) + 1] for k in padded]
        if any(w for k, w in zip(padded, widths) if k == v.axis):
            raise self.err(f"F.pad pads axis {v.axis}, the permuted features' axis")
        return v

    def _functional_norm(self, node: fx.Node, fn: Any) -> Feature:
        """``F.batch_norm`` / ``F.instance_norm`` / ``F.group_norm`` called by a module (timm's
        ``BatchNormAct2d``, ``GroupNorm1``): as the module forms, with the parameters and
        running statistics they read placed on the channels' space."""
        v = self._in(node)
        what = fn.__name__
        s = self._on_axis(v, 1, what)
        tensors: tuple[tuple[int, str], ...]  # (argument index, name)
        if fn is F.group_norm:
            tensors = ((2, "weight"), (3, "bias"))
        else:
            tensors = ((1, "running_mean"), (2, "running_var"), (3, "weight"), (4, "bias"))
        keys = [k for i, name in tensors if (k := self._state_key(_arg(node, i, name)))]
        module = keys[0].rsplit(".", 1)[0] if keys and "." in keys[0] else ""  # the caller
        if fn is F.group_norm:
            groups, channels = _arg(node, 1, "num_groups"), (_shape(node) or (0, 0))[1]
            if isinstance(groups, int) and 1 < groups < channels:  # permute within each group
                n = channels // groups
                name = module or f"{what}:{node}"
                self.sp.union(s, self.sp.cat(self.sp.split(s, [n] * groups), name))
        for key in keys:
            self._param("", key, (s,))
        if module:  # an activation point, as a norm module's
            self._point(module, v, 1)
        return v
