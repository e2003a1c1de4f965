"""Contract tests over every built-in architecture and option: shapes, backward, init scale."""

from __future__ import annotations

import pytest
import torch

from lmc.models import MLP, VGG, ResNet, TinyTen, TwoLayerReLU, init_weights

CASES = [
    pytest.param(lambda: MLP(784, 10, width=32, depth=3), (4, 1, 28, 28), 10, id="mlp"),
    pytest.param(lambda: MLP(784, 10, width=16, depth=2, norm="batch"), (4, 784), 10, id="mlp-bn"),
    pytest.param(
        lambda: MLP(784, 10, width=16, depth=2, norm="layer", activation="gelu"),
        (4, 784),
        10,
        id="mlp-ln",
    ),
    pytest.param(lambda: MLP(1, 1, width=8, depth=2, bias=False), (4, 1), 1, id="mlp-poly-nobias"),
    pytest.param(lambda: TwoLayerReLU(10, 7), (4, 10), 1, id="two-layer-relu"),
]
for depth in (11, 16):
    for norm in ("batch", "layer", "none"):
        for ch, hw in ((3, 32), (1, 28)):
            CASES.append(
                pytest.param(
                    lambda d=depth, n=norm, c=ch: VGG(d, width=0.125, norm=n, in_channels=c),
                    (2, ch, hw, hw),
                    10,
                    id=f"vgg{depth}-{norm}-{ch}ch",
                )
            )
for depth in (20, 32):
    for norm in ("batch", "layer"):
        CASES.append(
            pytest.param(
                lambda d=depth, n=norm: ResNet(d, width=0.5, norm=n, num_classes=100),
                (2, 3, 32, 32),
                100,
                id=f"resnet{depth}-{norm}",
            )
        )
for norm in ("batch", "layer", "none"):
    CASES.append(
        pytest.param(lambda n=norm: TinyTen(norm=n), (2, 3, 32, 32), 10, id=f"tinyten-{norm}")
    )


@pytest.mark.parametrize(("factory", "shape", "out"), CASES)
def test_forward_backward(factory, shape, out):
    torch.manual_seed(0)
    model = factory()
    y = model(torch.randn(shape))
    assert y.shape == (shape[0], out)
    assert torch.isfinite(y).all()
    y.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_paper_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(MLP(784, 10, 512, 3)) == 784 * 512 + 512 + 2 * (512 * 512 + 512) + 512 * 10 + 10
    assert round(count(TinyTen()) / 1e6, 2) == 0.09  # 002 Table 1
    assert round(count(ResNet(32)) / 1e6, 2) == 0.47  # 002 Table 1
    wide = ResNet(20, width=16)
    assert wide.conv1.out_channels == 256 and wide.linear.in_features == 1024


def test_he_normal_scale_sets_std():
    torch.manual_seed(0)
    m = MLP(1000, 10, width=2000, depth=1, init="he_normal", init_scale=0.3)
    std = m.layers[0].weight.std().item()
    assert std == pytest.approx(0.3 * (2 / 1000) ** 0.5, rel=0.02)
    assert torch.all(m.layers[0].bias == 0)


def test_two_layer_output_fixed_to_one():
    m = TwoLayerReLU(5, 3)
    assert torch.equal(m.head.weight, torch.ones(1, 3)) and not m.head.weight.requires_grad
    x = torch.randn(8, 5)
    assert torch.allclose(m(x).squeeze(1), torch.relu(x @ m.hidden.weight.T).sum(1))


@pytest.mark.parametrize("bad", [dict(depth=13), dict(width=0)])
def test_vgg_rejects_bad_options(bad):
    with pytest.raises(ValueError, match="VGG"):
        VGG(**{"depth": 11, **bad})


def test_bad_names_are_reported():
    with pytest.raises(ValueError, match="activation"):
        MLP(activation="swishy")
    with pytest.raises(ValueError, match="6n\\+2"):
        ResNet(depth=21)
    with pytest.raises(ValueError, match="init scheme"):
        init_weights(MLP(), "orthogonal")


@pytest.mark.parametrize(("factory", "shape", "out"), CASES)
def test_reinitialize_is_seeded_and_keeps_the_scheme(factory, shape, out):
    from lmc.models import reinitialize

    a, b = factory(), factory()
    reinitialize(a, 7)
    reinitialize(b, 7)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    before = {k: v.clone() for k, v in sa.items()}
    reinitialize(b, 8)
    assert any(
        not torch.equal(before[k], v) for k, v in b.state_dict().items() if v.is_floating_point()
    )


def test_reinitialize_keeps_he_scale():
    from lmc.models import reinitialize

    m = reinitialize(MLP(1000, 10, width=2000, depth=1, init="he_normal", init_scale=0.3), 1)
    assert m.layers[0].weight.std().item() == pytest.approx(0.3 * (2 / 1000) ** 0.5, rel=0.02)
