"""Evaluation utilities shared by every area: mean loss and accuracy of a model on batches,
cached batches, and exact BatchNorm re-estimation (004 App. B.1, 000 §4).

Pure torch (no Lightning), so interpolation, merging, curves, callbacks and notebooks use the
same functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

LossName = Literal["cross_entropy", "mse", "half_mse"]


@dataclass(frozen=True)
class EvalResult:
    """Mean loss over all examples, accuracy (``nan`` for regression) and example count."""

    loss: float
    acc: float
    n: int


def _split(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise ValueError("batches must be (inputs, targets) pairs")


def batch_loss(output: Tensor, target: Tensor, loss: LossName) -> Tensor:
    """Summed loss of a batch (so means over unequal batches are exact)."""
    if loss == "cross_entropy":
        return nn.functional.cross_entropy(output, target, reduction="sum")
    mse = nn.functional.mse_loss(output, target, reduction="none").flatten(1).mean(1).sum()
    return 0.5 * mse if loss == "half_mse" else mse


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    loss: LossName = "cross_entropy",
    device: torch.device | str | None = None,
) -> EvalResult:
    """Mean loss and accuracy of ``model`` (in eval mode) over ``batches``.

    Args:
        model: the network; it is put in eval mode and left there.
        batches: an iterable of ``(inputs, targets)``, e.g. a DataLoader or a cached list.
        loss: ``cross_entropy`` (classification; accuracy is reported) or ``mse``/``half_mse``.
        device: where to run; defaults to the model's device.
    """
    model.eval()
    if device is None:
        device = next(model.parameters()).device
    total, correct, n = 0.0, 0, 0
    for batch in batches:
        x, y = _split(batch)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(x)
        total += float(batch_loss(out, y, loss))
        if loss == "cross_entropy":
            correct += int((out.argmax(1) == y).sum())
        n += y.shape[0]
    if n == 0:
        raise ValueError("cannot evaluate on an empty loader")
    acc = correct / n if loss == "cross_entropy" else float("nan")
    return EvalResult(loss=total / n, acc=acc, n=n)


def stacked_forward(
    net: nn.Module,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    x: Tensor,
    shared_input: bool = False,
) -> Tensor:
    """The outputs of N models of ``net``'s architecture, shape (N, B, ...): ``params`` and
    ``buffers`` hold each entry stacked along dim 0 (N, ...), ``x`` is (N, B, ...), or (B, ...)
    given to every model when ``shared_input``; one ``torch.func.vmap`` of ``functional_call``
    (populations train with it as ``lmc.population.population_forward``). Dropout draws
    independent masks per model (``randomness="different"``)."""
    from torch.func import functional_call, vmap

    def one(p: dict[str, Tensor], b: dict[str, Tensor], xi: Tensor) -> Tensor:
        return functional_call(net, (p, b), (xi,))

    in_x = None if shared_input else 0
    return vmap(one, in_dims=(0, 0, in_x), randomness="different")(params, buffers, x)


@torch.inference_mode()
def evaluate_many(
    net: nn.Module,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    batches: Iterable[Any],
    loss: LossName = "cross_entropy",
) -> list[EvalResult]:
    """:func:`evaluate` of N models of ``net``'s architecture at once: ``params`` and
    ``buffers`` hold each entry stacked along dim 0 (N, ...), every batch goes through all N
    as one vectorised forward (:func:`stacked_forward`), and the sums stay on the device until
    the end (one read back, not one per batch). Equal to N calls of :func:`evaluate` up to the
    order of floating-point sums; ``net`` is put in eval mode."""
    net.eval()
    first = next(iter(params.values()))
    members, device = first.shape[0], first.device
    total = torch.zeros(members, dtype=torch.float64, device=device)
    correct = torch.zeros(members, dtype=torch.long, device=device)
    n = 0
    for batch in batches:
        x, y = _split(batch)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = stacked_forward(net, params, buffers, x, shared_input=True)  # (N, B, ...)
        if loss == "cross_entropy":
            per = nn.functional.cross_entropy(
                out.flatten(0, 1), y.repeat(members), reduction="none"
            ).view(members, -1)
            correct += (out.argmax(-1) == y).sum(1)
        else:
            per = nn.functional.mse_loss(out, y.expand_as(out), reduction="none")
            per = per.flatten(2).mean(2) * (0.5 if loss == "half_mse" else 1.0)
        total += per.sum(1, dtype=torch.float64)
        n += y.shape[0]
    if n == 0:
        raise ValueError("cannot evaluate on an empty loader")
    losses, rights = (total / n).tolist(), correct.tolist()
    return [
        EvalResult(loss=l_, acc=r / n if loss == "cross_entropy" else float("nan"), n=n)
        for l_, r in zip(losses, rights)
    ]


def cache_batches(
    batches: Iterable[Any], device: torch.device | str = "cpu"
) -> list[tuple[Tensor, Tensor]]:
    """Materialise a loader once (on ``device``) so many evaluations skip data loading."""
    return [(x.to(device), y.to(device)) for x, y in map(_split, batches)]


_BN = (nn.BatchNorm1d, nn.BatchNorm2d)


def batch_inputs(batch: Any) -> Tensor:
    """The inputs of a batch: its first entry, or the batch itself when it is a tensor."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class ChannelStats:
    """Exact running per-channel sums of a layer's output (dim 1 is the channel)."""

    def __init__(self) -> None:
        self.n = 0
        self.sum: Tensor | None = None
        self.sumsq: Tensor | None = None

    def update(self, y: Tensor) -> None:
        flat = y.detach().transpose(0, 1).reshape(y.shape[1], -1).double()
        if self.sum is None or self.sumsq is None:  # both set together on the first update
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


def forward_all(
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
            model(batch_inputs(batch).to(device))
    finally:
        for h in hooks:
            h.remove()


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer (its running statistics need re-estimation)."""
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
    stats = {bn: ChannelStats() for bn in bns}
    hooks = [bn.register_forward_pre_hook(lambda m, args: stats[m].update(args[0])) for bn in bns]
    was_training = {m: m.training for m in model.modules()}
    model.train()
    try:
        forward_all(model, batches, hooks, device)
    finally:
        for m, flag in was_training.items():
            m.train(flag)
    for bn, s in stats.items():
        if s.n == 0:
            raise ValueError("reset_bn got no data: the loader is empty")
        mean, var = s.mean_var(unbiased=True)
        assert bn.running_mean is not None and bn.running_var is not None
        assert bn.num_batches_tracked is not None
        bn.running_mean.copy_(mean.to(bn.running_mean))
        bn.running_var.copy_(var.to(bn.running_var))
        bn.num_batches_tracked.zero_()
    return model.eval()
