"""derive_spec through multi-head attention (issue 19): the heads, the query/key dimension
shared by Q and K and the value dimension shared by V and the output projection are found with
their sizes, a random permutation of them leaves the network's function unchanged, and weight
matching recovers a randomly permuted copy exactly (the heads paired first by
:func:`lmc.permutation.coupled.coupled_start`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmc.permutation import (
    apply_permutation,
    check_spec,
    derive_spec,
    random_permutation,
    weight_matching,
)
from lmc.permutation.coupled import coupled_groups, coupled_start

E, H = 16, 4  # embedding width, heads (4 dimensions each)


class Block(nn.Module):
    """Pre-norm self-attention and MLP, residual stream of width E, on (B, L, E)."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Linear(6, E)
        self.norm = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=batch_first)
        self.mlp = nn.Sequential(nn.Linear(E, 32), nn.GELU(), nn.Linear(32, E))
        self.head = nn.Linear(E, 3)

    def forward(self, x):
        h = self.embed(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        y = self.norm(h)
        h = h + self.attn(y, y, y, need_weights=False)[0]
        h = h + self.mlp(h)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(h.mean(1))


class Cross(nn.Module):
    """Cross-attention with its own key/value width (separate q/k/v projection weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_in = nn.Linear(6, E)
        self.kv_in = nn.Linear(5, 12)
        self.attn = nn.MultiheadAttention(E, H, kdim=12, vdim=12, batch_first=True)
        self.head = nn.Linear(E, 3)

    def forward(self, x):
        q, kv = self.q_in(x), torch.relu(self.kv_in(x[..., :5]))
        return self.head(self.attn(q, kv, kv)[0].mean(1))


def _groups(spec) -> dict[str, int]:
    return {g.rsplit(":", 1)[1]: len(m) for g, m in spec.groups.items() if ":" in g}


def _randomise(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fresh inits have constant biases and norms (ties for the matching): draw them."""
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(v.shape, generator=g) if v.ndim == 1 else v for k, v in state.items()}


@pytest.mark.parametrize("net", [Block, lambda: Block(batch_first=False), Cross])
def test_attention_spec_has_heads_and_within_head_groups(net):
    torch.manual_seed(0)
    model = net().eval()
    x = torch.randn(2, 7, 6)
    spec = derive_spec(model, x)
    sizes = spec.sizes(model.state_dict())
    assert sizes["attn:heads"] == H
    assert sizes["attn:qk"] == sizes["attn:v"] == E // H
    assert coupled_groups(spec) == ["attn:heads"]
    check_spec(model, spec, x)  # raises naming a broken group


@pytest.mark.parametrize("net", [Block, Cross])
def test_weight_matching_recovers_a_permuted_copy_through_attention(net):
    torch.manual_seed(0)
    model = net().eval()
    x = torch.randn(2, 7, 6)
    spec = derive_spec(model, x)
    state = _randomise(model.state_dict())
    perm = random_permutation(spec.sizes(state), 3)
    permuted = apply_permutation(state, spec, perm)
    # the heads' start is exact: sorted blocks are invariant to every other group
    assert torch.equal(coupled_start(permuted, state, spec)["attn:heads"], perm["attn:heads"])
    for method in ("plain", "accelerated"):
        found = weight_matching(permuted, state, spec, method=method).perm
        assert {g for g in perm if not torch.equal(found[g], perm[g])} == set(), method


def test_specs_without_attention_have_no_coupled_groups():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 2))
    assert coupled_groups(derive_spec(model, torch.randn(2, 3, 4))) == []
