"""Tiny built-in models in every option, made to look trained (no dead units, non-trivial norms)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from lmc.models import MLP, VGG, ResNet, TinyTen, TwoLayerReLU

Factory = Callable[[], nn.Module]

CASES: list[tuple[str, Factory, tuple[int, ...]]] = [
    ("mlp", lambda: MLP(784, 10, width=16, depth=3), (1, 28, 28)),
    ("mlp-bn", lambda: MLP(20, 5, width=12, depth=2, norm="batch"), (20,)),
    ("mlp-ln-gelu", lambda: MLP(20, 5, width=12, depth=2, norm="layer", activation="gelu"), (20,)),
    ("mlp-nobias", lambda: MLP(3, 1, width=8, depth=2, bias=False), (3,)),
    ("two-layer-relu", lambda: TwoLayerReLU(10, 7), (10,)),
]
for _d in (11, 16):
    for _n in ("batch", "layer", "none"):
        CASES.append(
            (
                f"vgg{_d}-{_n}",
                lambda d=_d, n=_n: VGG(d, width=1 / 16, norm=n, init="he_normal"),
                (3, 8, 8),
            )
        )
for _d in (20, 32):
    for _n in ("batch", "layer"):
        CASES.append(
            (
                f"resnet{_d}-{_n}",
                lambda d=_d, n=_n: ResNet(d, width=0.25, norm=n, init="he_normal"),
                (3, 8, 8),
            )
        )
for _n in ("batch", "layer", "none"):
    CASES.append(
        (f"tinyten-{_n}", lambda n=_n: TinyTen(width=0.25, norm=n, init="he_normal"), (3, 12, 12))
    )

PARAMS = [pytest.param(f, s, id=name) for name, f, s in CASES]


def build(
    factory: Factory, shape: tuple[int, ...], seed: int = 0
) -> tuple[nn.Module, list[torch.Tensor]]:
    """A seeded model made :func:`trained_like` and the data it was made on."""
    torch.manual_seed(seed)
    model = factory()
    data = batches(shape, seed=seed)
    return trained_like(model, data, seed), data


def batches(
    shape: tuple[int, ...], n: int = 2, size: int = 32, seed: int = 0
) -> list[torch.Tensor]:
    """``n`` seeded Gaussian batches of ``size`` inputs of ``shape``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((size, *shape), generator=g) for _ in range(n)]


@torch.no_grad()
def trained_like(model: nn.Module, data: list[torch.Tensor], seed: int = 0) -> nn.Module:
    """Perturb norm affine parameters, centre every ReLU input of ``features`` nets on ``data``
    (so no unit is dead) and estimate BatchNorm statistics on ``data``; returns ``model`` in eval."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
            m.weight.mul_(1 + 0.2 * torch.randn(m.weight.shape, generator=g).abs())
            m.bias.add_(0.1 * torch.randn(m.bias.shape, generator=g))

    # one pass: each activation's input is centred (and its bias shifted to match) before it
    # feeds the next layer, so later layers see the centred earlier ones
    def centre(bias: torch.Tensor):
        def hook(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            inp = args[0]
            mean = inp.mean([d for d in range(inp.ndim) if d != 1])
            bias.sub_(mean)
            return (inp - mean.view(1, -1, *([1] * (inp.ndim - 2))),)

        return hook

    handles = [
        act.register_forward_pre_hook(centre(bias)) for act, bias in _centering_targets(model)
    ]
    model.eval()
    model(torch.cat(data))
    for h in handles:
        h.remove()
    _calibrate(model, data)
    return model.eval()


def _centering_targets(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(activation module, bias that shifts its input) for MLP and ``features`` nets without
    BatchNorm (BatchNorm centres its output by itself once calibrated)."""
    out = []
    if isinstance(model, MLP):
        for layer, norm, act in zip(model.layers, model.norms, model.acts):
            bias = norm.bias if isinstance(norm, nn.LayerNorm) else layer.bias
            if not isinstance(norm, nn.BatchNorm1d) and bias is not None:
                out.append((act, bias))
    if isinstance(model, ResNet) and isinstance(model.bn1, nn.GroupNorm):
        out.append((model.act, model.bn1.bias))
        for stage in (model.layer1, model.layer2, model.layer3):
            for block in stage:
                out += [(block.act1, block.bn1.bias), (block.act2, block.bn2.bias)]
    features = getattr(model, "features", None)
    if isinstance(features, nn.Sequential):
        for j, m in enumerate(features):
            if isinstance(m, nn.ReLU) and isinstance(features[j - 1], nn.GroupNorm):
                out.append((m, features[j - 1].bias))
            elif isinstance(m, nn.ReLU) and isinstance(features[j - 1], nn.Identity):
                out.append((m, features[j - 2].bias))
    return out


@torch.no_grad()
def _calibrate(model: nn.Module, data: list[torch.Tensor]) -> None:
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    for x in data:
        model(x)
    model.eval()
