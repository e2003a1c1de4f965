"""BatchNorm re-estimation and REPAIR (Jordan et al. 2023; 004 App. B.1, 000 §4).

Both make an interpolated or merged network's activation statistics sensible again: ``reset_bn``
recomputes BatchNorm running statistics on data; ``repair`` rescales every hidden channel of a
network *without* BatchNorm so its mean and std equal the interpolation of the endpoints' and
folds the rescaling back into the weights, leaving an ordinary model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

_BN = (nn.BatchNorm1d, nn.BatchNorm2d)


def _inputs(batch: Any) -> Tensor:
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class _ChannelStats:
    """Exact running per-channel sums of a layer's output (dim 1 is the channel)."""

    def __init__(self) -> None:
        self.n = 0
        self.sum: Tensor | None = None
        self.sumsq: Tensor | None = None

    def update(self, y: Tensor) -> None:
        flat = y.detach().transpose(0, 1).reshape(y.shape[1], -1).double()
        if self.sum is None:
            self.sum, self.sumsq = flat.sum(1), flat.square().sum(1)
        else:
            self.sum += flat.sum(1)
            self.sumsq += flat.square().sum(1)
        self.n += flat.shape[1]

    def mean_var(self, unbiased: bool = False) -> tuple[Tensor, Tensor]:
        assert self.sum is not None and self.sumsq is not None and self.n > 0
        mean = self.sum / self.n
        var = (self.sumsq / self.n - mean.square()).clamp_min(0)
        if unbiased and self.n > 1:
            var = var * self.n / (self.n - 1)
        return mean, var


def _forward_all(
    model: nn.Module,
    batches: Iterable[Any],
    hooks: Sequence[torch.utils.hooks.RemovableHandle],
    device: torch.device | str | None,
) -> None:
    """One forward pass over ``batches`` (on the model's device unless given) for the
    statistics ``hooks`` collect; the hooks are removed afterwards, also on error."""
    device = device or next(model.parameters()).device
    try:
        for batch in batches:
            model(_inputs(batch).to(device))
    finally:
        for h in hooks:
            h.remove()


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, _BN) for m in model.modules())


@torch.no_grad()
def reset_bn(
    model: nn.Module, batches: Iterable[Any], device: torch.device | str | None = None
) -> nn.Module:
    """Recompute every BatchNorm's running mean/var as the exact average over ``batches``.

    One pass in train mode (each BatchNorm normalises with its batch statistics, as during
    training); each layer's running mean is the mean of its input over *all* examples and its
    running var the unbiased variance over all examples, so unequal batch sizes are weighted
    correctly (unlike ``swa_utils.update_bn``'s cumulative average of batch means). The model is
    returned in eval mode.
    """
    bns = [m for m in model.modules() if isinstance(m, _BN)]
    if not bns:
        return model.eval()
    stats = {bn: _ChannelStats() for bn in bns}
    hooks = [bn.register_forward_pre_hook(lambda m, args: stats[m].update(args[0])) for bn in bns]
    was_training = {m: m.training for m in model.modules()}
    model.train()
    try:
        _forward_all(model, batches, hooks, device)
    finally:
        for m, flag in was_training.items():
            m.train(flag)
    for bn, s in stats.items():
        if s.n == 0:
            raise ValueError("reset_bn got no data: the loader is empty")
        mean, var = s.mean_var(unbiased=True)
        bn.running_mean.copy_(mean.to(bn.running_mean))
        bn.running_var.copy_(var.to(bn.running_var))
        bn.num_batches_tracked.zero_()
    return model.eval()


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
    stats = {p: _ChannelStats() for p in points}
    hooks = [
        modules[p].register_forward_hook(lambda m, a, y, p=p: stats[p].update(y)) for p in points
    ]
    model.eval()
    _forward_all(model, batches, hooks, device)
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
        stats = _ChannelStats()

        def hook(m: nn.Module, a: Any, y: Tensor, stats: _ChannelStats = stats) -> None:
            stats.update(y)
            raise _Stop

        handle = layer.register_forward_hook(hook)
        try:
            for batch in batches:
                try:
                    model(_inputs(batch).to(device))
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
    return {
        k: (
            sum(wi * s[k][0] for wi, s in zip(w, stats)),
            sum(wi * s[k][1] for wi, s in zip(w, stats)),
        )
        for k in stats[0]
    }
