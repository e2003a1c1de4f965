"""Weight initialisation schemes shared by every built-in architecture."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

InitScheme = Literal["default", "he_normal", "he_uniform", "xavier_normal"]
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def he_std(weight: torch.Tensor) -> float:
    """Standard deviation of He et al. (2015) normal init, sqrt(2 / fan_in)."""
    fan_in = weight[0].numel()
    return math.sqrt(2.0 / fan_in)


@torch.no_grad()
def init_weights(module: nn.Module, scheme: InitScheme = "default", scale: float = 1.0) -> None:
    """Re-initialise every Linear/Conv weight of ``module`` in place.

    ``he_normal`` draws from N(0, (scale * sigma_He)^2) with sigma_He = sqrt(2 / fan_in); this is
    the ``c_d * sigma_He`` init of 000 §4.1 with ``scale = c_d``. Biases are zeroed and norm
    layers reset to the identity affine map for every scheme except ``default``, which keeps
    PyTorch's own initialisation (optionally multiplied by ``scale``).
    """
    if scheme not in ("default", "he_normal", "he_uniform", "xavier_normal"):
        raise ValueError(
            f"unknown init scheme {scheme!r}; use one of default, he_normal, he_uniform, xavier_normal"
        )
    if scale <= 0:
        raise ValueError(f"init scale must be positive, got {scale}")
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if not m.weight.requires_grad and scheme != "default":
                continue  # frozen weights (e.g. a fixed second layer) keep their values
            if scheme == "default":
                if scale != 1.0:
                    m.weight.mul_(scale)
                continue
            if scheme == "he_normal":
                m.weight.normal_(0.0, scale * he_std(m.weight))
            elif scheme == "he_uniform":
                bound = scale * he_std(m.weight) * math.sqrt(3.0)
                m.weight.uniform_(-bound, bound)
            else:
                nn.init.xavier_normal_(m.weight, gain=scale)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, _NORMS) and scheme != "default" and m.weight is not None:
            m.weight.fill_(1.0)
            m.bias.zero_()


@torch.no_grad()
def reinitialize(module: nn.Module, seed: int) -> nn.Module:
    """Draw fresh initial weights for ``module`` from ``seed`` without touching the global RNG.

    Uses the module's own ``reset_parameters()`` when it has one (all built-in models do, and
    reproduce their configured init scheme); otherwise resets every submodule that can.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
        else:
            for m in module.modules():
                if m is not module and hasattr(m, "reset_parameters"):
                    m.reset_parameters()
    return module


class ResettableMixin:
    """``reset_parameters()`` for built-in models: PyTorch's default init, then the model's scheme."""

    init_scheme: InitScheme = "default"
    init_scale: float = 1.0

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for m in self.modules():  # type: ignore[attr-defined]
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        init_weights(self, self.init_scheme, self.init_scale)  # type: ignore[arg-type]
