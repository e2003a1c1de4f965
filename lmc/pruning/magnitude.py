"""Local unstructured magnitude pruning on ``torch.nn.utils.prune`` (000 §4.3, A.1.2, A.3).

Every selected Linear/Conv ``weight`` gets the same rate r: exactly ⌊r·n⌋ of its n entries are
masked, those of smallest |w|, ties broken by position (a stable sort), so the count is exact
even for constant weights. Masks are registered with ``prune.custom_from_mask``: the layer keeps
``weight_orig`` (the same ``Parameter`` object, so optimizers keep updating it) and a
``weight_mask`` buffer, and its forward uses ``weight = weight_orig * weight_mask``. Masked
entries therefore stay zero while fine-tuning. Pruning again only grows a mask: entries masked
before stay masked.

While pruned, a layer still *serialises* like the dense one: a state-dict hook replaces
``weight_orig``/``weight_mask`` by ``weight = weight_orig * weight_mask`` (dense keys, dense
order), so every checkpoint (Lightning's ``save_weights_only`` too) and every state-dict consumer
(matching, interpolation) sees a dense model; loading a dense state dict into a pruned layer
writes ``weight_orig`` and keeps the current mask. The masks themselves are read with
:func:`get_masks`. :func:`make_permanent` turns every layer back into a plain parameter and
removes all hooks, as matching and merging expect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.utils import prune

from lmc.metrics.layers import effective_weight, is_pruned, weight_layers


def num_pruned(rate: float, n: int) -> int:
    """⌊rate · n⌋, robust to floating-point noise (0.29 · 100 is 29, not 28)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"pruning rate must lie in [0, 1], got {rate}")
    return math.floor(round(rate * n, 6))


@torch.no_grad()
def magnitude_mask(weight: Tensor, rate: float, mask: Tensor | None = None) -> Tensor:
    """A {0, 1} mask (dtype of ``weight``) zeroing exactly ⌊rate·n⌋ smallest-magnitude entries.

    Args:
        weight: the tensor to prune (its effective, already-masked values).
        rate: fraction of entries to mask in total, including those masked before.
        mask: the current mask; its zeros are kept and counted towards ⌊rate·n⌋.

    Raises:
        ValueError: ``rate`` is below the current mask's sparsity (masks never shrink).
    """
    k = num_pruned(rate, weight.numel())
    score = weight.detach().abs().reshape(-1)
    if mask is not None:
        already = int((mask == 0).sum())
        if already > k:
            raise ValueError(
                f"rate {rate} masks {k} entries but {already} are masked already; "
                "iterative pruning needs non-decreasing rates"
            )
        score = torch.where(mask.reshape(-1) == 0, torch.full_like(score, -1.0), score)
    # the first k of a stable sort by magnitude, without sorting: everything below the k-th
    # smallest value, then the lowest-index entries equal to it (ties broken by position)
    new = torch.ones(weight.numel(), dtype=weight.dtype, device=weight.device)
    if k > 0:
        kth = torch.kthvalue(score, k).values
        below = score < kth
        ties = (score == kth).nonzero().flatten()[: k - int(below.sum())]
        new[below] = 0
        new[ties] = 0
    return new.view_as(weight)


def _dense_state_dict(module: nn.Module, state: dict, prefix: str, local_metadata: Any) -> None:
    """State-dict post-hook: ``weight_orig``/``weight_mask`` -> ``weight``, weight first."""
    orig, mask = prefix + "weight_orig", prefix + "weight_mask"
    if orig not in state or mask not in state:
        return
    own = [k for k in list(state) if k.startswith(prefix) and "." not in k[len(prefix) :]]
    values = {k: state.pop(k) for k in own}
    state[prefix + "weight"] = (values.pop(orig) * values.pop(mask)).detach()
    state.update(values)


def _load_dense(module: nn.Module, state: dict, prefix: str, *args: Any) -> None:
    """Load pre-hook: a dense ``weight`` goes into ``weight_orig``; the current mask is kept."""
    if prefix + "weight" in state and prefix + "weight_orig" not in state and is_pruned(module):
        state[prefix + "weight_orig"] = state.pop(prefix + "weight")
        state.setdefault(prefix + "weight_mask", module.weight_mask)


def _remove_dense_hooks(module: nn.Module) -> None:
    # by identity, not by handle: handles of a deep-copied module would point at the original
    for key, hook in list(module._state_dict_hooks.items()):
        if hook is _dense_state_dict:
            del module._state_dict_hooks[key]
    for key, hook in list(module._load_state_dict_pre_hooks.items()):
        if getattr(hook, "hook", None) is _load_dense:
            del module._load_state_dict_pre_hooks[key]


def _tensor(module: nn.Module, name: str) -> Tensor:
    """``module.<name>``, a parameter or buffer (``nn.Module.__getattr__`` says either)."""
    return cast(Tensor, getattr(module, name))


@torch.no_grad()
def _set_mask(module: nn.Module, mask: Tensor) -> None:
    if is_pruned(module):
        _tensor(module, "weight_mask").copy_(mask)
        # refresh until next forward
        module.weight = _tensor(module, "weight_orig") * _tensor(module, "weight_mask")
    else:
        weight = _tensor(module, "weight")
        prune.custom_from_mask(module, "weight", mask.to(weight.device, weight.dtype))
        module.register_state_dict_post_hook(_dense_state_dict)
        module.register_load_state_dict_pre_hook(_load_dense)


def prune_magnitude(
    model: nn.Module, rate: float, layers: Iterable[str] | None = None
) -> dict[str, Tensor]:
    """Prune every selected layer of ``model`` in place to ``rate`` (local, unstructured).

    Args:
        model: the network (already pruned layers are pruned further, never un-pruned).
        rate: the fraction of each layer's weights masked after this call.
        layers: layer names to prune (default every Linear/Conv layer, output layer included).

    Returns:
        The masks by layer name.
    """
    masks = {}
    for name, module in weight_layers(model, layers).items():
        old = _tensor(module, "weight_mask") if is_pruned(module) else None
        masks[name] = magnitude_mask(effective_weight(module), rate, old)
        _set_mask(module, masks[name])
    return masks


def apply_masks(model: nn.Module, masks: Mapping[str, Tensor]) -> None:
    """Register (or overwrite) the given masks, e.g. restored from a checkpoint."""
    layers = weight_layers(model, masks.keys())
    for name, mask in masks.items():
        _set_mask(layers[name], mask.to(_tensor(layers[name], "weight").device))


def get_masks(model: nn.Module) -> dict[str, Tensor]:
    """The current masks (the ``weight_mask`` buffers) of every pruned layer, by layer name."""
    return {n: _tensor(m, "weight_mask") for n, m in weight_layers(model).items() if is_pruned(m)}


def make_permanent(model: nn.Module) -> nn.Module:
    """Fold every mask into a plain ``weight`` parameter (no hooks, dense state-dict keys)."""
    for module in weight_layers(model).values():
        if is_pruned(module):
            _remove_dense_hooks(module)
            prune.remove(module, "weight")
            # prune.remove re-registers `weight` last; put it back first, as in the dense layer
            params = dict(module._parameters)
            module._parameters.clear()
            module._parameters["weight"] = params.pop("weight")
            module._parameters.update(params)
    return model


def layer_sparsity(model: nn.Module, layers: Iterable[str] | None = None) -> dict[str, float]:
    """Fraction of zero entries of each layer's effective weight."""
    return {
        n: float((effective_weight(m) == 0).double().mean())
        for n, m in weight_layers(model, layers).items()
    }


def fold_masks(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A state dict with every ``X_orig``/``X_mask`` pair replaced by ``X = orig * mask``.

    For state dicts of layers pruned by plain ``torch.nn.utils.prune`` (layers pruned here already
    serialise densely).

    The result loads into the dense (unpruned) model and has its keys in its order (the folded
    weight first among its module's entries, as in Linear/Conv layers).
    """
    items: list[tuple[str, Tensor]] = []
    for key, value in state_dict.items():
        if key.endswith("_orig") and key[:-5] + "_mask" in state_dict:
            # pruning moved the weight behind its module's other entries: put it back first
            name = key[:-5]
            prefix = name.rpartition(".")[0]
            pos = next(
                (i for i, (k, _) in enumerate(items) if k.rpartition(".")[0] == prefix),
                len(items),
            )
            items.insert(pos, (name, value * state_dict[name + "_mask"]))
        elif not (key.endswith("_mask") and key[:-5] + "_orig" in state_dict):
            items.append((key, value))
    return dict(items)


def dense_snapshot(model: nn.Module) -> dict[str, Tensor]:
    """A CPU copy of the model's dense state dict (masks folded), e.g. the init for rewinding."""
    return fold_masks({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})


@torch.no_grad()
def rewind(model: nn.Module, init_state: Mapping[str, Tensor]) -> None:
    """Lottery-ticket rewind (Frankle & Carbin, 2018; 000 A.3): reset to ``init_state``, keep masks.

    Every parameter and buffer named in the dense ``init_state`` is copied back; for a
    pruned weight the values go into ``weight_orig``, so surviving weights equal their initial
    values bit for bit and masked ones stay zero.
    """
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for key, value in init_state.items():
        target: Tensor
        if key + "_orig" in params:
            target = params[key + "_orig"]
        elif key in params:
            target = params[key]
        elif key in buffers:
            target = buffers[key]
        else:
            continue
        target.copy_(value)
    for module in weight_layers(model).values():
        if is_pruned(module):
            module.weight = _tensor(module, "weight_orig") * _tensor(module, "weight_mask")
