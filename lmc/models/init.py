"""Weight initialisation schemes shared by every built-in architecture, and the 003 student's
initialisation at a uniformly drawn global minimum (:func:`sample_minimum`, 003 Assumption 3,
Lemma 8; the overlap of such minima is measured by :mod:`lmc.metrics.overlap`)."""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from torch import Tensor, nn

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
        reset = getattr(module, "reset_parameters", None)
        if reset is not None:
            reset()
        else:
            for m in module.modules():
                if m is not module and (reset := getattr(m, "reset_parameters", None)) is not None:
                    reset()
    return module


class ResettableMixin:
    """``reset_parameters()`` for built-in models: PyTorch's default init, then the model's scheme."""

    init_scheme: InitScheme = "default"
    init_scale: float = 1.0

    @torch.no_grad()
    def reset_parameters(self) -> None:
        module = cast(nn.Module, self)  # mixed into an nn.Module
        for m in module.modules():
            if m is not self and (reset := getattr(m, "reset_parameters", None)) is not None:
                reset()
        init_weights(module, self.init_scheme, self.init_scale)


def free_neurons(width: int, num_types: int) -> int:
    """``width - num_types``: the neurons of a teacher-student global minimum free to take any
    type (003 §3; at least one neuron per teacher neuron)."""
    if not 1 <= num_types <= width:
        raise ValueError(
            f"a global minimum needs at least one student neuron per teacher neuron: width "
            f"{width} < teacher_width {num_types}; use width >= teacher_width"
        )
    return width - num_types


def sample_types(width: int, num_types: int, generator: torch.Generator | None = None) -> Tensor:
    """Neuron types of a uniformly distributed minimum (003 Assumption 3): each type once, the
    other ``width - num_types`` neurons of a uniformly drawn type, in a random neuron order."""
    free = torch.randint(num_types, (free_neurons(width, num_types),), generator=generator)
    types = torch.cat([torch.arange(num_types), free])
    return types[torch.randperm(width, generator=generator)]


def sample_minimum(
    width: int,
    teacher_width: int,
    input_dim: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """First-layer weight (width, input_dim) of a uniformly distributed global minimum for the
    teacher e_1..e_m (003 Assumption 3, Lemma 8, B.1): neuron i = c_i e_{type(i)}, the c_i of a
    type Exp(1) draws normalised to sum 1 (uniform on the simplex)."""
    if teacher_width > input_dim:
        raise ValueError(f"teacher_width {teacher_width} > input_dim {input_dim}")
    types = sample_types(width, teacher_width, generator)
    c = torch.empty(width, dtype=torch.float64).exponential_(1.0, generator=generator)
    totals = torch.zeros(teacher_width, dtype=torch.float64).index_add_(0, types, c)
    weight = torch.zeros(width, input_dim, dtype=torch.float64)
    weight[torch.arange(width), types] = c / totals[types]
    return weight.to(dtype)
