"""Offline pruning studies on trained models: the hook where loss barriers plug in (000 §4.3).

The barrier and the permutation matching live in other packages (``lmc.permutation`` and
``lmc.interpolation``); they are passed in as callables so this module depends on neither. A
``barrier_fn`` is typically a closure over fixed evaluation batches, e.g. one that runs
``lmc.interpolation.interpolate_path`` on the two models' state dicts and returns the test loss
barrier.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

from torch import nn

from lmc.metrics.layers import effective_weight, is_pruned, weight_layers
from lmc.pruning.magnitude import make_permanent, prune_magnitude

Aligner = Callable[[nn.Module, nn.Module], nn.Module]
BarrierFn = Callable[[nn.Module, nn.Module], float]


def pruned_copy(model: nn.Module, rate: float, layers: Iterable[str] | None = None) -> nn.Module:
    """A copy of ``model`` pruned to ``rate`` and made permanent (``only_prune``, 000 A.3)."""
    for module in weight_layers(model).values():
        if is_pruned(module):  # a forward leaves a non-leaf `weight` that deepcopy refuses
            module.weight = effective_weight(module)
    clone = copy.deepcopy(model)
    prune_magnitude(clone, rate, layers)
    return make_permanent(clone)


def barrier_vs_rate(
    model_a: nn.Module,
    model_b: nn.Module,
    rates: Sequence[float],
    barrier_fn: BarrierFn,
    align_fn: Aligner | None = None,
    layers: Iterable[str] | None = None,
) -> dict[float, float]:
    """Barrier between two models after ``only_prune`` at each rate (000 §4.3, Fig. 5).

    For each rate both models are pruned (plain copies), ``model_b`` is aligned to ``model_a``
    with ``align_fn(model_a, model_b)`` (e.g. weight matching from ``lmc.permutation``; ``None``
    skips re-basin) and ``barrier_fn(model_a, model_b)`` is recorded. For the other strategies,
    train with :class:`callbacks.MagnitudePruning` and pass the resulting checkpoints' models
    with ``rates=[0.0]``.
    """
    out = {}
    layers = list(layers) if layers is not None else None
    for rate in rates:
        a, b = pruned_copy(model_a, rate, layers), pruned_copy(model_b, rate, layers)
        if align_fn is not None:
            b = align_fn(a, b)
        out[float(rate)] = float(barrier_fn(a, b))
    return out
