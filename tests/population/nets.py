"""Networks the population tests refuse: one that cannot run under ``vmap``."""

from __future__ import annotations

from torch import Tensor, nn


class DataDependentNet(nn.Module):
    """A linear layer followed by a layer that branches on a tensor's value (no ``vmap``)."""

    def __init__(self, in_features: int = 10) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, 1)
        self.gate = Gate()

    def forward(self, x: Tensor) -> Tensor:
        return self.gate(self.hidden(x))


class Gate(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x if float(x.sum()) > 0 else -x
