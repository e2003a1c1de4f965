"""A network that ``lmc`` does not ship, as a user would write it (for the from-YAML tests)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ResidualMLP(nn.Module):
    """Flatten -> Linear -> ReLU -> residual block -> LayerNorm -> Linear: no hand-written spec,
    so matching needs the spec derived with ``torch.fx`` (``spec: auto``)."""

    def __init__(self, in_features: int = 784, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.block = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        h = h + self.block(h)
        return self.out(self.norm(h))


def residual_mlp_spec(net: nn.Module):
    """A user's spec function (``spec: tests.tasks.custom_net:residual_mlp_spec``)."""
    from lmc.permutation import derive_spec

    return derive_spec(net, torch.zeros(2, net.inp.in_features))
