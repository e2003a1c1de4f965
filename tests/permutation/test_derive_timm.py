"""derive_spec on timm models (issue 35), ``pretrained=False`` (nothing downloaded): a handful
in the default suite, one per family that derives in the slow contract test."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch

from lmc.permutation import derive_spec
from tests.permutation.test_derive_torchvision import contract

# a family each: functional batch norm + activation (BatchNormAct2d), timm's Linear (F.linear)
# and squeeze-excitation, layer scale through a reshape
HANDFUL = ["efficientnet_b0", "mobilenetv3_small_050", "convnext_atto"]

# the families whose representative (benchmarks/derive_timm.py) derives and checks today; the
# slow test holds them there (71 of 85 families, 2026-11-27; 33 and 64 earlier that day)
DERIVING = [
    "byoanet", "cait", "coat", "convit", "convmixer", "convnext", "crossvit", "csatv2", "cspnet",
    "cspnext", "davit", "deit", "densenet", "dla", "dpn", "edgenext", "efficientformer",
    "efficientformer_v2", "efficientnet", "efficientvit_mit", "efficientvit_msra", "eva",
    "fasternet", "fastvit", "focalnet", "gcvit", "ghostnet", "hardcorenas", "hgnet", "hrnet",
    "iformer", "inception_next", "inception_v3", "lcnetv2", "levit", "lowformer", "mambaout",
    "maxxvit", "metaformer", "mlp_mixer", "mobilenetv3", "mobilevit", "nest", "pit", "pvt_v2",
    "rdnet", "regnet", "repghost", "repvit", "res2net", "resnest", "resnetv2", "rexnet",
    "selecsls", "senet", "shvit", "sknet", "starnet", "swiftformer", "swin_transformer",
    "swin_transformer_v2", "swin_transformer_v2_cr", "tiny_vit", "twins", "visformer",
    "vision_transformer", "vision_transformer_relpos", "vitamin", "xception", "xception_aligned",
    "xcit",
]  # fmt: skip


def build(name: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timm.create_model(name, pretrained=False, num_classes=10).eval()


@pytest.mark.parametrize("name", HANDFUL)
def test_a_timm_model_meets_the_derive_contract(name):
    """torchvision's contract (tests/permutation/test_derive_torchvision.py): derive, check_spec,
    weight matching recovers a permuted copy exactly, the midpoint of two inits runs."""
    contract(lambda: build(name), size=64)


@pytest.mark.slow
def test_every_deriving_family_still_derives():
    from benchmarks.derive_timm import derive_one, representatives

    picks = representatives()
    failed = {f: derive_one(picks[f]) for f in DERIVING}
    assert {f: s for f, s in failed.items() if s != "ok"} == {}


@pytest.mark.parametrize("qk_norm", [False, True])
def test_timm_attention_is_derived_as_heads(qk_norm):
    """timm's fused-qkv Attention (ViT, DeiT) kept whole by the tracer: its heads and within-head
    dimensions are groups (the q/k norms' weights on the query/key dimension), and the model
    meets the contract."""
    from timm.models.vision_transformer import VisionTransformer

    def vit():
        return VisionTransformer(
            img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=10,
            qk_norm=qk_norm,
        ).eval()  # fmt: skip

    spec = derive_spec(vit(), torch.randn(2, 3, 32, 32))
    sizes = spec.sizes(vit().state_dict())
    assert sizes["blocks.0.attn:heads"] == 2
    assert sizes["blocks.0.attn:qk"] == sizes["blocks.0.attn:v"] == 8
    if qk_norm:
        assert spec.axes["blocks.0.attn.q_norm.weight"] == ("blocks.0.attn:qk",)
    contract(vit, size=32)


def test_heads_folded_into_the_batch_and_relative_logits_of_a_transposed_table():
    """timm's BottleneckAttn (BoTNet): q, k, v reshaped to ``(B x heads, head_dim, HW)`` (the
    heads into the batch axis, kept in order), relative position logits ``q @ rel_k.T`` with
    the tables as parameters used transposed: permuted within each head, the tables along the
    query dimension; weight matching recovers a permuted copy."""
    from timm.layers.bottleneck_attn import BottleneckAttn

    from tests.permutation.test_derive_passthrough import _recovers

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 1)
            self.attn = BottleneckAttn(8, 6, feat_size=(4, 4), num_heads=2, qk_ratio=1.0)
            self.head = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.head(self.attn(self.stem(x)).mean((2, 3)))

    axes = _recovers(Net().eval(), torch.randn(2, 3, 4, 4))
    q, k, v = (axes[f"attn.qkv.weight#{i}"] for i in range(3))
    assert q == k == (None, q[1], "stem", None, None) and v[:2] == (None, v[1]) != q[:2]
    assert axes["attn.pos_embed.width_rel"] == axes["attn.pos_embed.height_rel"] == (None, q[1])
    assert axes["head.weight#0"] == (None, None, v[1])
