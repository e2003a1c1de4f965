"""derive_spec through operations timm's families use that move no permutation (issue 35
items 1 and 4): a Linear mixing the tokens while the features sit on another axis (MLP-Mixer),
softmax / normalize / powers / exponentials, reductions over the features' axis (GRN),
``addcmul``, ``repeat`` of other axes, upsampling, and one unit of a permuted axis broadcast
over the features (FocalNet's gates). Each model's derived spec passes ``check_spec`` and
weight matching recovers a permuted copy; the groups that cannot move stay fixed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmc.permutation import (
    apply_permutation,
    check_spec,
    derive_spec,
    random_permutation,
    weight_matching,
)
from lmc.permutation.derive_spaces import Spaces
from tests.permutation.test_derive_functional import _randomise


def _recovers(net: nn.Module, x: torch.Tensor) -> dict:
    """Derive, check, and recover a random permutation of every group by weight matching."""
    spec = derive_spec(net, x)
    check_spec(net, spec, x)
    state = _randomise(net)
    perm = random_permutation(spec.sizes(state), 2)
    found = weight_matching(apply_permutation(state, spec, perm), state, spec).perm
    assert {g for g in perm if not torch.equal(found[g], perm[g])} == set()
    return spec.axes


class Mixer(nn.Module):
    """MLP-Mixer in short: a token MLP on the transposed tokens, a channel MLP, a head."""

    def __init__(self, tokens: int = 5, dim: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(4, dim)
        self.norm = nn.LayerNorm(dim)
        self.tok1, self.tok2 = nn.Linear(tokens, 7), nn.Linear(7, tokens)
        self.ch1, self.ch2 = nn.Linear(dim, 12), nn.Linear(12, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):  # (B, tokens, 4)
        x = self.embed(x)
        t = self.norm(x).transpose(1, 2)  # (B, dim, tokens): the features on axis 1
        x = x + self.tok2(F.gelu(self.tok1(t))).transpose(1, 2)
        x = x + self.ch2(F.gelu(self.ch1(x)))
        return self.head(x.mean(1))


def test_a_linear_mixing_the_tokens_passes_the_features_through():
    axes = _recovers(Mixer().eval(), torch.randn(3, 5, 4))
    stream = axes["embed.weight"][0]
    assert stream is not None and axes["ch1.weight"][1] == stream
    assert axes["ch1.weight"][0] is not None  # the channel MLP's hidden units: a group
    # the token MLP's weights act on the tokens: in their order (not in the spec)
    assert all(g is None for g in axes.get("tok1.weight", (None, None)))
    assert all(g is None for g in axes.get("tok2.weight", (None, None)))


class StarReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale, self.bias = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.scale * F.relu(x) ** 2 + self.bias


class GRN(nn.Module):
    """ConvNeXt V2's global response normalisation (channels last), as timm writes it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(dim)), nn.Parameter(torch.randn(dim))

    def forward(self, x):  # (B, H, W, C)
        g = x.norm(p=2, dim=(1, 2), keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)  # over the features: invariant
        return x + torch.addcmul(self.bias.view(1, 1, 1, -1), self.weight.view(1, 1, 1, -1), x * n)


class Elementwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.act, self.grn = StarReLU(), GRN(8)
        self.up = nn.Upsample(scale_factor=2)
        self.pos = nn.Parameter(torch.randn(1, 8, 1, 1))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.act(self.conv1(x))
        x = x.softmax(dim=1) + F.normalize(x, dim=1) + torch.exp(-x.abs()) + x.sqrt()
        x = x + self.pos.repeat(x.shape[0], 1, 1, 1)  # the features' axis not repeated
        x = self.grn(self.conv2(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = F.interpolate(self.up(x), scale_factor=0.5)
        return self.head(F.log_softmax(x, dim=1).mean((2, 3)))


def test_elementwise_reductions_repeats_and_upsampling_keep_the_channels():
    axes = _recovers(Elementwise().eval(), torch.rand(2, 3, 6, 6))
    assert axes["grn.weight"] == (axes["conv2.weight"][0],)
    assert axes["pos"][1] == axes["conv1.weight"][0]


class Gated(nn.Module):
    """FocalNet's modulation in short: one Linear split into q, context and per-level gates;
    each gate (one unit of the gates' block) scales every context channel."""

    def __init__(self, dim: int = 6, levels: int = 2) -> None:
        super().__init__()
        self.levels = levels
        self.f = nn.Conv2d(dim, 2 * dim + levels + 1, 1)
        self.h = nn.Conv2d(dim, dim, 1)
        self.stem, self.head = nn.Conv2d(3, dim, 1), nn.Linear(dim, 2)

    def forward(self, x):
        x = self.stem(x)
        q, ctx, gates = torch.split(self.f(x), (x.shape[1], x.shape[1], self.levels + 1), 1)
        out = 0
        for level in range(self.levels + 1):
            out = out + ctx * gates[:, level : level + 1]
        return self.head((q * self.h(out)).mean((2, 3)))


def test_one_unit_broadcast_over_the_features_fixes_its_own_block():
    axes = _recovers(Gated().eval(), torch.randn(2, 3, 4, 4))
    # q and the context keep their groups; each gate unit (one row) stays in place
    assert axes["f.weight#0"][0] is not None and axes["f.weight#1"][0] is not None
    assert axes["f.weight#2"][0] is None


def test_spaces_of_different_sizes_are_never_merged_into_one_permutation():
    sp = Spaces()
    a, b = sp.new(4, "a"), sp.new(3, "b")
    sp.union(a, b)
    assert sp.is_fixed(a) and sp.is_fixed(b)


@pytest.mark.parametrize("dim", [1, 2])
def test_a_reduction_over_the_batch_is_still_refused_but_not_over_the_features(dim):
    class Reduce(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 6)

        def forward(self, x):
            y = self.fc(x)  # (B, T, 6): the features on axis 2
            return y.sum(dim=dim, keepdim=True) * y

    spec = derive_spec(Reduce().eval(), torch.randn(2, 3, 4))
    check_spec(Reduce().eval(), spec, torch.randn(2, 3, 4))
