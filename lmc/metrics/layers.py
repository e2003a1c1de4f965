"""Which modules carry a neuron weight matrix, and their effective (masked) weights."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

#: Modules whose ``weight`` holds one neuron per output row (Linear) or output channel (Conv).
WEIGHT_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def weight_layers(model: nn.Module, names: Iterable[str] | None = None) -> dict[str, nn.Module]:
    """The Linear and Conv layers of ``model`` by qualified name, in definition order.

    Args:
        model: any network (an MLP gives ``layers.0``, ..., ``head``).
        names: keep only these layer names; ``None`` keeps every weight layer.

    Raises:
        KeyError: a requested name is not a Linear/Conv layer of ``model``; the message lists
            the available names.
    """
    layers = {n: m for n, m in model.named_modules() if isinstance(m, WEIGHT_LAYER_TYPES)}
    if names is None:
        return layers
    names = list(names)
    missing = [n for n in names if n not in layers]
    if missing:
        raise KeyError(f"no Linear/Conv layer named {missing}; available: {list(layers)}")
    return {n: layers[n] for n in names}


def is_pruned(module: nn.Module, name: str = "weight") -> bool:
    """Whether ``module.<name>`` is reparametrised by ``torch.nn.utils.prune`` (orig and mask)."""
    return f"{name}_orig" in module._parameters and f"{name}_mask" in module._buffers


def effective_weight(module: nn.Module, name: str = "weight") -> Tensor:
    """The weight the layer computes with, detached: ``orig * mask`` while pruned.

    ``torch.nn.utils.prune`` refreshes ``module.weight`` only in the forward pre-hook, so after an
    optimizer step the attribute is stale until the next forward; this reads the source instead.
    """
    if is_pruned(module, name):
        return (getattr(module, f"{name}_orig") * getattr(module, f"{name}_mask")).detach()
    return getattr(module, name).detach()
