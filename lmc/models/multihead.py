"""Several networks of one architecture answering as one: their outputs averaged.

A partially zipped model (ZipIt!, Stoica et al. 2024, §4.4: the models merged up to a layer,
each keeping its own remaining layers as a head) is stored as a :class:`MultiHead` whose members
hold equal weights in the zipped trunk and their own weights in their heads; the output ensemble
of n models is a :class:`MultiHead` of the n unchanged models. Each member computes its whole
forward pass (the shared trunk is not computed once), so the function is exact and the cost is
n networks'.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


class MultiHead(nn.Module):
    """``heads`` copies of ``net`` whose outputs are averaged.

    Args:
        net: the architecture of every member (copied).
        heads: the number of members (2 or more).
    """

    def __init__(self, net: nn.Module, heads: int = 2) -> None:
        super().__init__()
        if heads < 2:
            raise ValueError(f"a MultiHead needs heads >= 2 members, got {heads}")
        self.members = nn.ModuleList(copy.deepcopy(net) for _ in range(heads))

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)
