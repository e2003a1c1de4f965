"""Evaluation of a model on a loader: mean loss and accuracy, under ``torch.inference_mode``."""

from __future__ import annotations

from collections.abc import Iterable
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


def cache_batches(
    batches: Iterable[Any], device: torch.device | str = "cpu"
) -> list[tuple[Tensor, Tensor]]:
    """Materialise a loader once (on ``device``) so many evaluations skip data loading."""
    return [tuple(t.to(device) for t in _split(b)) for b in batches]  # type: ignore[misc]
