"""PGD L-infinity attacks (Madry et al. 2017) for robust curves (002 §2.3, §5).

Data modules feed *normalised* images ``(x - mean) / std``. With ``mean`` and ``std`` given,
the attack works in pixel space: the image is mapped back to [0, 1], perturbed by at most ``eps``
per pixel (8/255 is the usual CIFAR budget), clipped to [0, 1] and normalised again, so ``eps``
means the same thing whatever the normalisation. Without them the attack perturbs the network
input directly, ``eps`` is then in normalised units and no clipping is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class PGD:
    """PGD settings: L-inf radius ``eps``, ``steps`` signed-gradient steps of ``step_size``,
    optional uniform random start in the ball (defaults: 8/255, 2/255, 5 steps, 002 §5)."""

    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = 5
    random_start: bool = True

    def __post_init__(self) -> None:
        if self.eps < 0 or self.step_size <= 0 or self.steps < 0:
            raise ValueError(
                f"PGD needs eps >= 0, step_size > 0 and steps >= 0, got eps={self.eps}, "
                f"step_size={self.step_size}, steps={self.steps}"
            )


def as_pgd(attack: PGD | Mapping[str, Any] | None) -> PGD | None:
    """``attack`` as a :class:`PGD` (a dict of its fields is accepted, e.g. from hparams)."""
    if attack is None or isinstance(attack, PGD):
        return attack
    return PGD(**dict(attack))


def _shape(v: Sequence[float] | Tensor, x: Tensor) -> Tensor:
    t = torch.as_tensor(v, dtype=x.dtype, device=x.device)
    return t.view(1, -1, *([1] * (x.ndim - 2))) if x.ndim > 2 else t.view(1, -1)


def pgd_attack(
    model: Callable[[Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    attack: PGD,
    mean: Sequence[float] | Tensor | None = None,
    std: Sequence[float] | Tensor | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
) -> Tensor:
    """Adversarial inputs maximising ``loss_fn(model(x_adv), y)`` within the L-inf ball.

    Gradients are taken with respect to the perturbation only (``torch.autograd.grad``), so
    no parameter gradient accumulates; ``model`` is called in whatever mode it is in. Returns
    detached, normalised inputs like ``x``.

    Args:
        model: callable from inputs to logits (a network or a curve point, see
            :func:`~lmc.curves.forward_at`).
        x: normalised inputs.
        y: targets.
        attack: the PGD settings.
        mean, std: the data normalisation (per channel); attack in pixel space when given.
    """
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std (pixel-space attack) or neither")
    x = x.detach()
    if mean is not None:
        assert std is not None  # checked above
        scale = _shape(std, x)
        base = x * scale + _shape(mean, x)  # pixels, only used for the [0, 1] box
    else:
        scale, base = None, None

    def to_input(delta: Tensor) -> Tensor:  # x + delta exactly when there is no perturbation
        return x + (delta / scale if scale is not None else delta)

    def clip(delta: Tensor) -> Tensor:
        return (base + delta).clamp(0.0, 1.0) - base if base is not None else delta

    delta = torch.zeros_like(x)
    if attack.random_start and attack.eps > 0:
        delta = clip(delta.uniform_(-attack.eps, attack.eps))
    with torch.enable_grad():
        for _ in range(attack.steps):
            delta.requires_grad_(True)
            loss = loss_fn(model(to_input(delta)), y)
            (grad,) = torch.autograd.grad(loss, delta)
            delta = (delta.detach() + attack.step_size * grad.sign()).clamp(-attack.eps, attack.eps)
            delta = clip(delta)
    return to_input(delta.detach()).detach()


def adversarial_batches(
    model: Callable[[Tensor], Tensor],
    batches: Iterable[Any],
    attack: PGD,
    mean: Sequence[float] | Tensor | None = None,
    std: Sequence[float] | Tensor | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """Every ``(x, y)`` batch with ``x`` replaced by its PGD adversarial version."""
    return [(pgd_attack(model, x, y, attack, mean, std), y) for x, y, *_ in batches]


def data_normalization(
    datamodule: Any,
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(mean, std)`` of a vision data module's normalisation, or ``(None, None)``."""
    mean, std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
    if mean is None or std is None:
        return None, None
    return tuple(mean), tuple(std)
