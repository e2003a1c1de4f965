"""BatchNorm re-estimation and REPAIR (Jordan et al. 2023; 004 App. B.1, 000 §4).

Both make an interpolated or merged network's activation statistics sensible again:
:func:`lmc.evaluation.reset_bn` recomputes BatchNorm running statistics on data; ``repair``
rescales every hidden channel of a network *without* BatchNorm so its mean and std equal the
interpolation of the endpoints' and folds the rescaling back into the weights, leaving an
ordinary model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from lmc.evaluation import ChannelStats, batch_inputs, forward_all


def repair_points(model: nn.Module) -> list[str]:
    """Names of the layers REPAIR rescales: every Linear/Conv2d but the last (output) layer
    that carries a bias (the bias absorbs the mean shift, so the state-dict keys stay fixed)."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return [n for n, m in layers[:-1] if m.bias is not None]


@torch.no_grad()
def channel_stats(
    model: nn.Module,
    batches: Iterable[Any],
    points: Sequence[str],
    device: torch.device | str | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-channel (mean, std) of the outputs of ``points`` over ``batches`` (eval mode)."""
    modules = dict(model.named_modules())
    stats = {p: ChannelStats() for p in points}
    hooks = [
        modules[p].register_forward_hook(lambda m, a, y, p=p: stats[p].update(y)) for p in points
    ]
    model.eval()
    forward_all(model, batches, hooks, device)
    out = {}
    for p, s in stats.items():
        mean, var = s.mean_var()
        out[p] = (mean, var.sqrt())
    return out


class _Stop(Exception):
    pass


@torch.no_grad()
def repair(
    model: nn.Module,
    targets: Mapping[str, tuple[Tensor, Tensor]],
    batches: Sequence[Any],
    device: torch.device | str | None = None,
    eps: float = 1e-5,
) -> nn.Module:
    """REPAIR: make each point's per-channel (mean, std) equal ``targets`` and fold it in.

    Points are processed in forward order; for each, its current statistics are measured on
    ``batches`` (the forward pass stops right after that layer) and the layer's weight and bias
    are rescaled: ``W' = W * s``, ``b' = (b - mu) * s + mu_t`` with ``s = std_t / (std + eps)``.
    Because earlier points are already repaired when a later one is measured, every point's
    statistics match its target exactly on ``batches``. Layers without a bias get one.

    Args:
        model: a network without BatchNorm (use ``reset_bn`` for BatchNorm networks).
        targets: point name -> (mean, std) to reach, typically
            ``(1 - alpha) * stats_a + alpha * stats_b`` (see ``interpolate_stats``).
        batches: the data (e.g. the alignment subset), iterated once per point.
    """
    device = device or next(model.parameters()).device
    modules = dict(model.named_modules())
    model.eval()
    for name in [n for n in modules if n in targets]:
        layer = modules[name]
        stats = ChannelStats()

        def hook(m: nn.Module, a: Any, y: Tensor, stats: ChannelStats = stats) -> None:
            stats.update(y)
            raise _Stop

        handle = layer.register_forward_hook(hook)
        try:
            for batch in batches:
                try:
                    model(batch_inputs(batch).to(device))
                except _Stop:
                    pass
        finally:
            handle.remove()
        mean, var = stats.mean_var()
        t_mean, t_std = (t.to(mean) for t in targets[name])
        scale = t_std / (var.sqrt() + eps)
        shape = (-1,) + (1,) * (layer.weight.dim() - 1)
        layer.weight.mul_(scale.view(shape).to(layer.weight))
        bias = layer.bias if layer.bias is not None else torch.zeros_like(mean)
        new_bias = ((bias.to(mean) - mean) * scale + t_mean).to(layer.weight)
        if layer.bias is None:
            layer.bias = nn.Parameter(new_bias)
        else:
            layer.bias.copy_(new_bias)
    return model


def interpolate_stats(
    stats_a: Mapping[str, tuple[Tensor, Tensor]],
    stats_b: Mapping[str, tuple[Tensor, Tensor]],
    alpha: float,
) -> dict[str, tuple[Tensor, Tensor]]:
    """REPAIR targets: ``(1 - alpha) * stats_a + alpha * stats_b`` for means and stds."""
    return {
        k: (torch.lerp(ma, stats_b[k][0], alpha), torch.lerp(sa, stats_b[k][1], alpha))
        for k, (ma, sa) in stats_a.items()
    }


def average_stats(
    stats: Sequence[Mapping[str, tuple[Tensor, Tensor]]], weights: Sequence[float] | None = None
) -> dict[str, tuple[Tensor, Tensor]]:
    """REPAIR targets of a merge of several models: weighted averages of their statistics."""
    n = len(stats)
    w = [1.0 / n] * n if weights is None else list(weights)
    # sums of tensors (stats is never empty), not the start value 0
    return {
        k: (
            cast(Tensor, sum(wi * s[k][0] for wi, s in zip(w, stats))),
            cast(Tensor, sum(wi * s[k][1] for wi, s in zip(w, stats))),
        )
        for k in stats[0]
    }
