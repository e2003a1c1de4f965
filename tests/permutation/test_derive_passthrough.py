"""derive_spec through operations timm's families use that move no permutation (issue 35
items 1 and 4): a Linear mixing the tokens while the features sit on another axis (MLP-Mixer),
softmax / normalize / powers / exponentials, reductions over the features' axis (GRN),
``addcmul``, ``repeat`` of other axes, upsampling, and one unit of a permuted axis broadcast
over the features (FocalNet's gates). Each model's derived spec passes ``check_spec`` and
weight matching recovers a permuted copy; the groups that cannot move stay fixed."""

from __future__ import annotations

import math

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


class Attention(nn.Module):
    """Multi-head self-attention as most timm families write it (not timm's own Attention
    class, which derive_spec keeps whole): fused qkv reshaped into heads, ``unbind``, ``q @
    k.T`` plus a relative position bias gathered from a table by an index buffer, softmax,
    ``@ v`` (or ``F.scaled_dot_product_attention``), heads merged back, projection."""

    def __init__(self, dim: int = 8, heads: int = 2, tokens: int = 4, sdpa: bool = False) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn(2 * tokens - 1, heads))
        idx = torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :] + tokens - 1
        self.register_buffer("index", idx.flatten(), persistent=False)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self.table[self.index].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        if self.sdpa:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5 + bias
            x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Transformer(nn.Module):
    def __init__(self, sdpa: bool, shift: bool) -> None:
        super().__init__()
        self.shift = shift
        self.embed, self.norm1 = nn.Linear(5, 8), nn.LayerNorm(8)
        self.attn = Attention(sdpa=sdpa)
        self.norm2, self.fc1, self.fc2 = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)
        self.w_g = nn.Parameter(torch.randn(8, 1))  # SwiftFormer's additive attention weights
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.embed(x)
        if self.shift:  # Swin's shifted windows: a roll of the tokens
            x = torch.roll(x, shifts=1, dims=1)
        x = x + self.attn(self.norm1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        g = F.normalize(x, dim=-1) @ self.w_g  # (B, N, 1): summed over the features
        return self.head((x * g.softmax(dim=1)).sum(1))


@pytest.mark.parametrize(("sdpa", "shift"), [(False, False), (True, True)])
def test_attention_written_out_keeps_a_within_head_permutation(sdpa, shift):
    axes = _recovers(Transformer(sdpa, shift).eval(), torch.randn(2, 4, 5))
    stream = axes["embed.weight"][0]
    # the qkv rows as (3 x heads, head_dim): the head dimension permuted alike in q, k, v
    rows = axes["attn.qkv.weight#0"]
    assert rows[0] is None and rows[1] is not None and rows[2] == stream
    assert axes["attn.proj.weight#0"] == (stream, None, rows[1])
    assert axes["w_g"] == (stream, None)  # summed against the features: permuted with them
    assert "attn.table" not in axes or axes["attn.table"] == (None, None)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(F.relu(self.up(F.relu(self.conv(x)))).mean((2, 3)))


def test_a_transposed_convolution_has_its_weight_in_then_out():
    axes = _recovers(Decoder().eval(), torch.randn(2, 3, 8, 8))
    assert axes["up.weight"][:2] == (axes["conv.weight"][0], axes["head.weight"][1])


def test_a_roll_of_the_features_axis_is_refused():
    class Rolled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, x):
            return self.fc2(torch.roll(self.fc1(x), 1, dims=-1))

    with pytest.raises(Exception, match="roll along the permuted axis"):
        derive_spec(Rolled(), torch.randn(2, 4))


def test_a_module_registered_under_two_names_gets_one_permutation_for_both():
    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)
            self.shared = self.fc1  # the same module (and tensors) under a second name

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    net = Aliased().eval()
    spec = derive_spec(net, torch.randn(2, 4))
    assert spec.axes["shared.weight"] == spec.axes["fc1.weight"] == ("fc1", None)
    check_spec(net, spec, torch.randn(2, 4))  # functional_call takes the shared tensor once


class TalkingHeads(nn.Module):
    """CaiT's talking-heads attention: Linear layers mix the heads of the attention map, then
    ``attn @ v`` pairs the mixed heads with v's heads one to one (a batch axis)."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed, self.qkv, self.proj = (
            nn.Linear(5, dim),
            nn.Linear(dim, 3 * dim),
            nn.Linear(dim, 3),
        )
        self.proj_l, self.proj_w = nn.Linear(heads, heads), nn.Linear(heads, heads)

    def forward(self, x):
        x = self.embed(x)
        b, n, c = x.shape
        q, k, v = (
            self.qkv(x)
            .reshape(b, n, 3, self.heads, c // self.heads)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        attn = self.proj_l((q @ k.transpose(-2, -1)).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        attn = self.proj_w(attn.softmax(-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c)).mean(1)


def test_heads_mixed_then_paired_with_unpermuted_heads_stay_in_order():
    axes = _recovers(TalkingHeads().eval(), torch.randn(2, 4, 5))
    assert axes["proj_w.weight"][0] is None  # its output heads meet v's, which do not move


class BiasCat(nn.Module):
    """EVA's / Swin V2's attention input: ``F.linear(x, qkv.weight, cat(q_bias, k_bias,
    v_bias))`` with a constant key bias (zeros: any permutation leaves it as it is; or not)."""

    def __init__(self, uniform: bool) -> None:
        super().__init__()
        self.embed, self.qkv, self.head = (
            nn.Linear(5, 8),
            nn.Linear(8, 24, bias=False),
            nn.Linear(8, 3),
        )
        self.q_bias, self.v_bias = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))
        k_bias = torch.zeros(8) if uniform else torch.arange(8.0)
        self.register_buffer("k_bias", k_bias, persistent=False)
        # a relative position bias computed by an MLP, then gathered by an index (ViT-RelPos)
        self.register_buffer("coords", torch.randn(7, 2), persistent=False)
        self.mlp = nn.Linear(2, 2)
        self.register_buffer("index", torch.randint(0, 7, (16,)), persistent=False)

    def forward(self, x):
        x = self.embed(x)
        b, n, c = x.shape
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        q, k, v = (
            F.linear(x, self.qkv.weight, bias)
            .reshape(b, n, 3, 2, 4)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        rel = self.mlp(self.coords)[self.index].view(n, n, 2).permute(2, 0, 1)
        attn = (q @ k.transpose(-2, -1) + rel).softmax(-1)
        return self.head(((attn @ v).transpose(1, 2).reshape(b, n, c)).mean(1))


@pytest.mark.parametrize("uniform", [True, False])
def test_a_bias_concatenated_from_parameters_gives_each_its_rows(uniform):
    axes = _recovers(BiasCat(uniform).eval(), torch.randn(2, 4, 5))
    # the q, k and v row blocks, each (heads, head_dim) x features
    blocks = [axes[f"qkv.weight#{i}"] for i in range(3)]
    if uniform:  # a zero key bias: the head dimension keeps one permutation in q, k and v
        head_dim = blocks[0][1]
        assert head_dim is not None and all(b[1] == head_dim for b in blocks)
        assert axes["q_bias#0"][-1] == head_dim and axes["v_bias#0"][-1] == head_dim
    else:  # a key bias that is not uniform fixes the rows it is added to (and so all three)
        assert all(None in b[:-1] and len(b) == 2 for b in blocks)
        assert axes["q_bias"] == axes["v_bias"] == (None,)


class ShapeBranches(nn.Module):
    """Python control flow on shapes, which torch.fx cannot trace symbolically (NesT's
    ``int(math.sqrt(T))``, TinyViT's window test, CPUBone's padding test)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc, self.head = (
            nn.Conv2d(3, 6, 3, padding=1),
            nn.Linear(6, 8),
            nn.Linear(8, 2),
        )

    def forward(self, x):
        x = F.relu(self.conv(x))
        b, c, h, w = x.shape
        if h % 2 or w % 2:  # the example's branch is the one traced
            x = F.pad(x, (0, w % 2, 0, h % 2))
        side = int(math.sqrt(x.shape[2] * x.shape[3]))
        tokens = x.flatten(2).transpose(1, 2)[:, : side * side]
        return self.head(F.gelu(self.fc(tokens)).mean(1))


@pytest.mark.parametrize("size", [5, 6])
def test_control_flow_on_shapes_traces_with_the_example_values(size):
    x = torch.randn(2, 3, size, size)
    with pytest.raises(torch.fx.proxy.TraceError):  # what torch.fx alone says
        torch.fx.symbolic_trace(ShapeBranches())
    net = ShapeBranches().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    axes = _recovers(net, x)
    assert axes["fc.weight"][1] == axes["conv.weight"][0]
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())  # unchanged


def test_data_dependent_control_flow_is_still_named_when_the_fallback_fails_too():
    class OnValues(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y.expand(3, -1, -1) if y.sum() > 0 else y  # not derivable either way

    with pytest.raises(Exception, match="expand|could not trace"):
        derive_spec(OnValues(), torch.randn(2, 4))


class Stacked(nn.Module):
    """SKNet / CrossViT in short: branches stacked on a new axis, reduced over it; a feature
    map expanded over new leading axes; a scalar from all axes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 6, 1)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        paths = torch.stack([F.relu(self.a(x)), F.relu(self.b(x))], dim=1)  # (B, 2, C, H, W)
        y = paths.sum(dim=1) * paths.mean(dim=0, keepdim=True).mean(dim=1)  # over the batch too
        y = y.unsqueeze(0).expand(3, -1, -1, -1, -1).mean(0)
        scale = y.sum()  # every axis: one number, whatever the order
        return self.head(y.mean((2, 3)) / scale.abs().clamp_min(1.0))


def test_stacks_expands_and_reductions_over_other_axes_keep_the_features():
    axes = _recovers(Stacked().eval(), torch.randn(2, 3, 4, 4))
    assert axes["a.weight"][0] == axes["b.weight"][0] == axes["head.weight"][1] is not None


class InterleavedHeads(nn.Module):
    """Attention whose fused projection lays out q, k and v per head, one head after the other
    (LeViT, EfficientFormer, LowFormer, CoAtNet, TinyViT): ``view(B, N, heads, -1)`` then
    ``split([key, key, value])`` on the last axis, values of a different width than keys."""

    def __init__(self, dim: int = 6, heads: int = 2, key: int = 3, value: int = 4) -> None:
        super().__init__()
        self.heads, self.key, self.value = heads, key, value
        self.embed = nn.Linear(5, dim)
        self.qkv = nn.Linear(dim, heads * (2 * key + value))
        self.proj, self.head = nn.Linear(heads * value, dim), nn.Linear(dim, 3)

    def forward(self, x):
        x = self.embed(x)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, self.heads, -1).split([self.key, self.key, self.value], 3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        attn = (q @ k.transpose(-2, -1) * self.key**-0.5).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1))
        return self.head(x.mean(1))


def test_q_k_v_interleaved_head_by_head_are_permuted_within_each_block():
    axes = _recovers(InterleavedHeads().eval(), torch.randn(2, 4, 5))
    # the projection's rows: per head a q, a k and a v block, the same permutations in every
    # head (the heads themselves stay in order: blocks moved as a whole are not a group)
    blocks = [axes[f"qkv.weight#{i}"] for i in range(6)]
    q, k, v = (b[0] for b in blocks[:3])
    assert q == k and v not in (None, q)
    assert [b[0] for b in blocks] == [q, k, v, q, k, v]
    assert all(b[1] == axes["embed.weight"][0] for b in blocks)
    assert axes["proj.weight#0"][1:] == (None, v)


class PatchFold(nn.Module):
    """MobileViT's unfold and fold: the channels merged into the batch axis with the patch rows
    (``(B x C x n_h, p_h, n_w, p_w)``), then brought back as the last axis of ``(B x P, N, C)``
    for a token Linear, and folded back to ``(B, C, H, W)``."""

    def __init__(self, channels: int = 6, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.conv, self.fc = nn.Conv2d(3, channels, 1), nn.Linear(channels, channels)
        self.proj, self.head = nn.Conv2d(channels, 4, 1), nn.Linear(4, 3)

    def forward(self, x):
        x = self.conv(x)
        b, c, h, w = x.shape
        p, nh, nw = self.patch, h // self.patch, w // self.patch
        x = x.reshape(b * c * nh, p, nw, p).transpose(1, 2)
        x = x.reshape(b, c, nh * nw, p * p).transpose(1, 3).reshape(b * p * p, nh * nw, -1)
        x = F.gelu(self.fc(x))
        x = x.contiguous().view(b, p * p, nh * nw, -1).transpose(1, 3).reshape(b * c * nh, nw, p, p)
        x = x.transpose(1, 2).reshape(b, c, nh * p, nw * p)
        return self.head(self.proj(x).mean((2, 3)))


def test_channels_folded_into_the_batch_axis_with_fixed_factors_come_back_whole():
    axes = _recovers(PatchFold().eval(), torch.randn(2, 3, 4, 6))
    channels = axes["conv.weight"][0]
    assert channels is not None and axes["fc.weight"] == (axes["fc.bias"][0], channels)
    assert axes["proj.weight"][1] == axes["fc.bias"][0] is not None
