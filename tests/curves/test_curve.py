"""Known answers for curves: bases, exact endpoints (BatchNorm included), Bezier vs line."""

from __future__ import annotations

import copy

import pytest
import torch

from lmc.curves import (
    Curve,
    basis,
    basis_derivative,
    bezier_state,
    forward_at,
    interior_basis,
    prepare_point_,
)
from lmc.interpolation import lerp_state, reset_bn
from lmc.models import MLP, VGG, ResNet
from tests.curves.helpers import assert_close


def _trained_like(net: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy with fresh weights and non-trivial BatchNorm statistics."""
    torch.manual_seed(seed)
    net = copy.deepcopy(net)
    net.reset_parameters()
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(16, *_input_shape(net)))
    return net.eval()


def _input_shape(net: torch.nn.Module) -> tuple[int, ...]:
    return (784,) if isinstance(net, MLP) else (1, 28, 28) if isinstance(net, VGG) else (3, 16, 16)


NETS = {
    "mlp": lambda: MLP(784, 10, width=16, depth=2),
    "vgg_bn": lambda: VGG(11, 0.0625, in_channels=1),
    "resnet_bn": lambda: ResNet(8, 0.25),
}


@pytest.mark.parametrize("kind", ["bezier", "polychain"])
@pytest.mark.parametrize("order", [1, 2, 4])
def test_basis_partition_of_unity_endpoints_and_linear_precision(kind, order):
    assert torch.equal(basis(0.0, order, kind), torch.eye(order + 1, dtype=torch.float64)[0])
    assert torch.equal(basis(1.0, order, kind), torch.eye(order + 1, dtype=torch.float64)[-1])
    nodes = torch.arange(order + 1, dtype=torch.float64) / order
    for t in torch.linspace(0, 1, 13).tolist():
        c = basis(t, order, kind)
        assert (c >= 0).all() and c.sum() == pytest.approx(1.0)
        assert float(c @ nodes) == pytest.approx(t)  # linear precision
    h = 1e-6
    for t in (0.13, 0.37, 0.71):  # away from polychain bends
        fd = (basis(t + h, order, kind) - basis(t - h, order, kind)) / (2 * h)
        assert_close(basis_derivative(t, order, kind), fd, atol=1e-5, rtol=1e-5)
    assert interior_basis(0.5, order, kind).numel() == order - 1


def test_quadratic_bezier_is_002_eq7():
    t = 0.3
    assert_close(
        basis(t, 2), torch.tensor([(1 - t) ** 2, 2 * t * (1 - t), t**2], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="t must lie"):
        basis(1.5)


@pytest.mark.parametrize(
    ("name", "order", "kind"),
    [("vgg_bn", 2, "bezier"), ("mlp", 3, "bezier"), ("mlp", 2, "polychain")],
)
def test_curve_reproduces_endpoints_bit_for_bit(name, order, kind, device):
    net = NETS[name]()
    a, b = _trained_like(net, 0).to(device), _trained_like(net, 1).to(device)
    curve = Curve.from_module(net, a.state_dict(), b.state_dict(), order, kind)
    assert all(t.device.type == device for t in [*curve.parameters(), *curve.buffers()])
    with torch.no_grad():
        curve.offsets.normal_()  # a genuinely curved path
    for t, ref in ((0.0, a), (1.0, b)):
        point = curve.point(t)
        assert all(torch.equal(point[k], v) for k, v in ref.named_parameters())  # exact anywhere


@pytest.mark.parametrize("name", ["vgg_bn", "resnet_bn"])
def test_outputs_at_t0_t1_equal_the_endpoints_with_batchnorm(name):
    net = NETS[name]()
    a, b = _trained_like(net, 0), _trained_like(net, 1)
    curve = Curve.from_module(net, a.state_dict(), b.state_dict())
    with torch.no_grad():
        curve.offsets.normal_(0, 0.1)
    x = torch.randn(8, *_input_shape(net))
    bn_batches = [(torch.randn(16, *_input_shape(net)), torch.zeros(16, dtype=torch.long))]
    scratch = copy.deepcopy(net)
    for t, ref in ((0.0, a), (1.0, b)):
        # interpolated buffers: the endpoint's own statistics -> the endpoint itself
        prepare_point_(scratch, curve, t, bn_mode="interpolate")
        with torch.no_grad():
            assert torch.equal(scratch(x), ref(x))
        # re-estimated statistics: the endpoint with statistics re-estimated on the same data
        prepare_point_(scratch, curve, t, bn_batches, "recompute")
        expected = reset_bn(copy.deepcopy(ref), bn_batches)
        with torch.no_grad():
            assert torch.equal(scratch(x), expected(x))


def test_recompute_needs_data_for_batchnorm():
    net = NETS["vgg_bn"]()
    curve = Curve.from_module(net, net.state_dict(), net.state_dict())
    with pytest.raises(ValueError, match="bn_batches"):
        prepare_point_(net, curve, 0.5, None, "recompute")


def test_quadratic_bezier_with_midpoint_control_is_the_line():
    net = NETS["mlp"]()
    a, b = _trained_like(net, 0).state_dict(), _trained_like(net, 1).state_dict()
    mid = lerp_state(a, b, 0.5)
    curve = Curve.from_module(net, a, b)
    for t in (0.0, 0.1, 0.25, 0.5, 0.8, 1.0):
        line = lerp_state(a, b, t)
        explicit = bezier_state([a, mid, b], t)
        for k in dict(net.named_parameters()):
            assert_close(explicit[k], line[k], atol=1e-6, rtol=1e-6)
            assert_close(curve.point(t)[k], line[k], atol=1e-6, rtol=1e-6)
    curve.set_control_points_([mid])  # explicitly at the midpoint: offsets vanish
    assert curve.offsets.abs().max() < 1e-5


@pytest.mark.parametrize(("order", "kind"), [(2, "bezier"), (3, "bezier"), (3, "polychain")])
def test_offset_parameterisation_is_the_bezier_curve_through_the_control_points(order, kind):
    net = NETS["mlp"]()
    a, b = _trained_like(net, 0).state_dict(), _trained_like(net, 1).state_dict()
    ctrl = [_trained_like(net, 10 + i).state_dict() for i in range(order - 1)]
    curve = Curve.from_module(net, a, b, order, kind)
    curve.set_control_points_(ctrl)
    for got, want in zip(curve.control_points(), ctrl):
        assert_close(got, curve.flatten(want), atol=1e-6, rtol=1e-6)
    for t in (0.2, 0.5, 0.9):
        explicit = bezier_state([a, *ctrl, b], t, kind)
        for k, v in curve.point(t).items():
            assert_close(v, explicit[k], atol=1e-5, rtol=1e-5)


def test_forward_at_trains_only_the_offsets(device):
    net = NETS["mlp"]()
    a, b = _trained_like(net, 0), _trained_like(net, 1)
    net.to(device)
    curve = Curve.from_module(net, a.to(device).state_dict(), b.to(device).state_dict())
    x, y = torch.randn(4, 784).to(device), torch.tensor([0, 1, 2, 3], device=device)
    loss = torch.nn.functional.cross_entropy(forward_at(net, curve.point(0.3), x), y)
    loss.backward()
    assert curve.offsets.grad is not None and curve.offsets.grad.abs().sum() > 0
    assert curve.offsets.grad.device.type == device
    assert [n for n, p in curve.named_parameters()] == ["offsets"]
    assert {n for n, _ in curve.named_buffers()} >= {"start", "end"}
    # the point's forward equals loading the point into a network
    loaded = copy.deepcopy(net)
    curve.load_point_(loaded, 0.3)
    with torch.no_grad():
        assert_close(loaded(x), forward_at(net, curve.point(0.3), x))


def test_state_at_and_segment_lengths_of_the_line():
    net = NETS["mlp"]()
    a, b = _trained_like(net, 0).state_dict(), _trained_like(net, 1).state_dict()
    curve = Curve.from_module(net, a, b)
    lengths = curve.segment_lengths([0.0, 0.25, 0.5, 0.75, 1.0])
    total = float((curve.end - curve.start).double().norm())
    assert lengths == pytest.approx([total / 4] * 4, rel=1e-5)
    state = curve.state_at(1.0, a)
    assert all(torch.equal(state[k], b[k]) for k in a)
