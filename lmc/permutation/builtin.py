"""Hand-written permutation specs for the built-in architectures (C2).

Group names: ``layers.i`` (MLP hidden layer ``i``), ``features.j`` (VGG/TinyTen conv at index
``j`` of ``features``), ``hidden`` (two-layer ReLU), and for ResNets ``layer{s}.{b}.conv1``
(inside a block) and ``stream{s}`` (the residual stream of stage ``s``: the stem or the stage's
shortcut conv/norm, every block's ``conv2``/``bn2`` output and the next readers, 002 App. D).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from torch import Tensor, nn

from lmc.models import MLP, VGG, ResNet, TinyTen, TwoLayerReLU
from lmc.models.resnet import BasicBlock
from lmc.permutation.spec import Axes, PermutationSpec

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def _layer(
    axes: dict[str, Axes], prefix: str, module: nn.Module, out: str | None, inp: str | None
) -> None:
    """Axes of a Linear/Conv2d: weight (out, in, None...), bias (out,)."""
    for name, t in module.state_dict().items():
        if name == "weight":
            axes[f"{prefix}.weight"] = (out, inp) + (None,) * (t.ndim - 2)
        elif name == "bias":
            axes[f"{prefix}.bias"] = (out,)
        else:  # pragma: no cover - Linear/Conv have no other entries
            raise ValueError(f"unexpected entry {prefix}.{name}")


def _norm(axes: dict[str, Axes], prefix: str, module: nn.Module, group: str | None) -> None:
    """Axes of a norm layer: affine params and running stats permuted, counters untouched.

    ``GroupNorm(1, C)`` normalises over all channels at once, which is permutation invariant,
    so only its per-channel affine parameters are permuted (like BatchNorm's).
    """
    if isinstance(module, nn.Identity):
        return
    if not isinstance(module, _NORMS):
        raise TypeError(f"{prefix} is a {type(module).__name__}, expected a norm layer or Identity")
    for name, t in module.state_dict().items():
        axes[f"{prefix}.{name}"] = (group,) + (None,) * (t.ndim - 1) if t.ndim else ()


def mlp_spec(model: MLP) -> PermutationSpec:
    """Spec of :class:`~lmc.models.MLP`: one group per hidden layer (004 §2.2)."""
    axes: dict[str, Axes] = {}
    acts: dict[str, tuple[str, ...]] = {}
    prev: str | None = None
    for i, (layer, norm) in enumerate(zip(model.layers, model.norms)):
        g = f"layers.{i}"
        _layer(axes, f"layers.{i}", layer, g, prev)
        _norm(axes, f"norms.{i}", norm, g)
        acts[g] = (f"acts.{i}",)
        prev = g
    _layer(axes, "head", model.head, None, prev)
    return PermutationSpec(axes, acts)


def two_layer_spec(model: TwoLayerReLU) -> PermutationSpec:
    """Spec of :class:`~lmc.models.TwoLayerReLU`: the hidden units (003 §2); the frozen output
    weights are permuted too, so the student's function is unchanged."""
    axes: dict[str, Axes] = {}
    _layer(axes, "hidden", model.hidden, "hidden", None)
    _layer(axes, "head", model.head, None, "hidden")
    return PermutationSpec(axes, {"hidden": ("act",)})


def _features_spec(model: VGG | TinyTen) -> PermutationSpec:
    """conv / norm / ReLU / pool ``features`` then global pool and ``classifier``."""
    axes: dict[str, Axes] = {}
    acts: dict[str, tuple[str, ...]] = {}
    group: str | None = None
    for j, m in enumerate(model.features):
        prefix = f"features.{j}"
        if isinstance(m, nn.Conv2d):
            new = prefix
            _layer(axes, prefix, m, new, group)
            group = new
        elif isinstance(m, (*_NORMS, nn.Identity)):
            _norm(axes, prefix, m, group)
        elif isinstance(m, nn.ReLU):
            assert group is not None
            acts[group] = (prefix,)
    _layer(axes, "classifier", model.classifier, None, group)
    return PermutationSpec(axes, acts)


def vgg_spec(model: VGG) -> PermutationSpec:
    """Spec of :class:`~lmc.models.VGG` (any depth, width and norm): one group per conv."""
    return _features_spec(model)


def tinyten_spec(model: TinyTen) -> PermutationSpec:
    """Spec of :class:`~lmc.models.TinyTen` (002 §4): one group per conv."""
    return _features_spec(model)


def resnet_spec(model: ResNet) -> PermutationSpec:
    """Spec of :class:`~lmc.models.ResNet`: block-internal groups and one group per residual
    stream, shared by the stem (or the stage's shortcut conv/norm), every block's ``conv2``/
    ``bn2`` and everything reading the stream (002 App. D)."""
    axes: dict[str, Axes] = {}
    acts: dict[str, list[str]] = {}
    stream = "stream1"
    _layer(axes, "conv1", model.conv1, stream, None)
    _norm(axes, "bn1", model.bn1, stream)
    acts[stream] = ["act"]
    for s, stage in enumerate((model.layer1, model.layer2, model.layer3), start=1):
        for b, block in enumerate(cast(Iterable[BasicBlock], stage)):
            p = f"layer{s}.{b}"
            out = stream
            if len(block.shortcut) > 0:
                out = f"stream{s}"
                if out == stream:  # the stem stream cannot change width in stage 1
                    raise ValueError(f"{p} has a shortcut conv but continues stream {stream}")
                _layer(axes, f"{p}.shortcut.0", block.shortcut[0], out, stream)
                _norm(axes, f"{p}.shortcut.1", block.shortcut[1], out)
                acts[out] = []
            inner = f"{p}.conv1"
            _layer(axes, f"{p}.conv1", block.conv1, inner, stream)
            _norm(axes, f"{p}.bn1", block.bn1, inner)
            _layer(axes, f"{p}.conv2", block.conv2, out, inner)
            _norm(axes, f"{p}.bn2", block.bn2, out)
            acts[inner] = [f"{p}.act1"]
            acts[out].append(f"{p}.act2")
            stream = out
    _layer(axes, "linear", model.linear, None, stream)
    return PermutationSpec(axes, {g: tuple(p) for g, p in acts.items()})


#: (class, its spec function): a function only gets models of exactly its class, a pairing no
#: static type expresses (so ``Any``)
_BUILTIN: tuple[tuple[type[nn.Module], Callable[[Any], PermutationSpec]], ...] = (
    (MLP, mlp_spec),
    (TwoLayerReLU, two_layer_spec),
    (VGG, vgg_spec),
    (TinyTen, tinyten_spec),
    (ResNet, resnet_spec),
)


def has_builtin_spec(model: nn.Module) -> bool:
    """Whether ``model`` is a built-in architecture with a hand-written spec."""
    return any(type(model) is cls for cls, _ in _BUILTIN)


def spec_for(
    model: nn.Module, example_input: Tensor | tuple[Tensor, ...] | None = None
) -> PermutationSpec:
    """The permutation spec of ``model``.

    Built-in architectures use their hand-written spec; any other model is derived with
    :func:`~lmc.permutation.derive.derive_spec`, which needs ``example_input``.

    Raises:
        TypeError: ``model`` is not built in and no ``example_input`` was given.
    """
    for cls, fn in _BUILTIN:
        if type(model) is cls:
            return fn(model)
    if example_input is None:
        raise TypeError(
            f"no built-in permutation spec for {type(model).__name__}; pass example_input to "
            "derive one with torch.fx (lmc.permutation.derive_spec), or write a PermutationSpec"
        )
    from lmc.permutation.derive import derive_spec

    return derive_spec(model, example_input)
