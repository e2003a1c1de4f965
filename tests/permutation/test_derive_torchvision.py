"""derive_spec across torchvision's classification families (issue 19).

Contract per model: a spec is derived, ``check_spec`` passes (the permuted model computes the
same function), weight matching recovers a randomly permuted copy exactly, and the
interpolation of two differently seeded inits runs. Weights are never downloaded.

A representative handful (one model per family, small inputs) runs by default; every
classification model of ``torchvision.models.list_models`` with <= 30 M parameters runs under
``-m slow``, except those in :data:`LEFT_OUT` (with the reason).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision.models as tvm
from torch import nn
from torchvision.models.convnext import CNBlockConfig, ConvNeXt
from torchvision.models.swin_transformer import (
    PatchMergingV2,
    SwinTransformer,
    SwinTransformerBlockV2,
)
from torchvision.models.vgg import VGG, make_layers
from torchvision.models.vision_transformer import VisionTransformer

from lmc.interpolation.states import lerp_state
from lmc.io import load_state
from lmc.permutation import (
    apply_permutation,
    check_spec,
    derive_spec,
    random_permutation,
    weight_matching,
)

MAX_PARAMS = 30_000_000
KWARGS = {  # auxiliary heads only exist in training mode and return a tuple: off
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}
SIZE = {"inception_v3": 80}  # smallest input each model accepts (others: 64)
LEFT_OUT: dict[str, str] = {}  # name -> why the contract cannot hold (none at torchvision 0.29)


def _params(name: str) -> int:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm.get_model(name, weights=None, **KWARGS.get(name, {}))
    return sum(p.numel() for p in model.parameters())


SMALL_MODELS = [  # list_models(module=torchvision.models) with <= 30 M parameters (torchvision 0.29)
    "convnext_tiny", "densenet121", "densenet161", "densenet169", "densenet201",
    "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4",
    "efficientnet_v2_s", "googlenet", "inception_v3", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0",
    "mnasnet1_3", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_1_6gf",
    "regnet_x_3_2gf", "regnet_x_400mf", "regnet_x_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf",
    "regnet_y_400mf", "regnet_y_800mf", "resnet18", "resnet34", "resnet50", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1", "swin_t", "swin_v2_t",
]  # fmt: skip


def small_models() -> list[str]:
    """Every torchvision classification model with at most 30 M parameters (slow: builds all)."""
    out = []
    for name in tvm.list_models(module=tvm):
        try:
            n = _params(name)
        except (RuntimeError, NotImplementedError):  # init that reads values: count on CPU
            n = sum(p.numel() for p in tvm.get_model(name, weights=None).parameters())
        if n <= MAX_PARAMS:
            out.append(name)
    return out


def distinct(state: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """``state`` with every 1-D float entry (biases, norm parameters, running statistics) drawn
    at random: a fresh init's constant entries would leave the matching with ties."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in state.items():
        if t.is_floating_point() and t.ndim == 1:
            t = (
                torch.rand(t.shape, generator=g) + 0.5
                if k.endswith("running_var")
                else (torch.randn(t.shape, generator=g))
            )
        out[k] = t
    return out


def contract(factory, size: int = 64) -> None:
    torch.manual_seed(0)
    model = factory().eval()
    x = torch.randn(4, 3, size, size)
    spec = derive_spec(model, x)
    assert spec.groups
    check_spec(model, spec, x)  # raises naming the broken groups
    state = distinct(model.state_dict())
    perm = random_permutation(spec.sizes(state), 1)
    permuted = apply_permutation(state, spec, perm)
    found = weight_matching(permuted, state, spec).perm
    assert all(torch.equal(found[g], perm[g]) for g in perm)
    torch.manual_seed(1)
    other = factory().eval()
    mid = lerp_state(model.state_dict(), other.state_dict(), 0.5)
    load_state(other, mid)  # with the model's metadata: MNASNet refuses a plain dict
    with torch.inference_mode():
        assert torch.isfinite(other(x)).all()


def _vgg11_bn() -> nn.Module:
    """vgg11_bn's features and its flatten of a 512 x 7 x 7 map, with a narrow classifier."""
    model = VGG(make_layers([64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"], True))
    model.classifier = nn.Sequential(
        nn.Linear(512 * 7 * 7, 32), nn.ReLU(True), nn.Dropout(), nn.Linear(32, 10)
    )
    return model


def _convnext() -> nn.Module:
    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 1)], num_classes=10)


def _vit() -> nn.Module:
    """A small torchvision ViT: 4 heads of 8 dimensions, two encoder blocks."""
    return VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    )  # fmt: skip


def _swin(v2: bool = False) -> nn.Module:
    """A small torchvision Swin (V2: cosine attention, bias MLP, patch merging V2): a shifted
    window block in each of two stages."""
    extra = {"block": SwinTransformerBlockV2, "downsample_layer": PatchMergingV2} if v2 else {}
    return SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        num_classes=10, **extra,
    )  # fmt: skip


def _tv(name: str, **kw):
    return lambda: tvm.get_model(name, weights=None, **{**KWARGS.get(name, {}), **kw})


HANDFUL = [
    pytest.param(_vgg11_bn, 32, id="vgg11_bn-narrow-classifier"),
    pytest.param(_tv("mobilenet_v2", width_mult=0.25), 64, id="mobilenet_v2-x0.25"),
    pytest.param(
        lambda: tvm.DenseNet(8, (2, 2), 16, num_classes=10),
        32,
        id="densenet-small",
    ),
    pytest.param(_convnext, 32, id="convnext-small"),
    pytest.param(_tv("resnet18", num_classes=10), 32, id="resnet18"),
    # grouped convolutions give many small groups: minutes of weight matching on 2 cores
    pytest.param(
        _tv("regnet_y_400mf", num_classes=10), 32, id="regnet_y_400mf", marks=pytest.mark.slow
    ),
    pytest.param(_tv("squeezenet1_1", num_classes=10), 64, id="squeezenet1_1"),
    pytest.param(_tv("mnasnet0_5", num_classes=10), 64, id="mnasnet0_5"),
    pytest.param(_vit, 32, id="vit-small"),
    pytest.param(_swin, 32, id="swin-small"),
    pytest.param(lambda: _swin(v2=True), 32, id="swin_v2-small", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("factory", "size"), HANDFUL)
def test_derive_contract_handful(factory, size):
    contract(factory, size)


@pytest.mark.slow
def test_small_models_list_is_current():
    assert sorted(small_models()) == sorted(SMALL_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL_MODELS)
def test_derive_contract_all_torchvision(name):
    if name in LEFT_OUT:
        pytest.skip(LEFT_OUT[name])
    contract(_tv(name), SIZE.get(name, 64))
