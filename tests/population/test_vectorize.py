"""Pure vectorisation pieces: the stacked forward equals each member's own forward, dropout
draws per member, stacked optimizer state slices back to each member's, BatchNorm members
train as their sequential twins."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmc.models import MLP, VGG, ResNet, TwoLayerReLU
from lmc.population import check_vectorizable, population_forward, stack_states
from lmc.population.vectorize import member_optimizer_state, member_state, population_losses


@pytest.mark.parametrize("make", [lambda: MLP(6, 3, width=8, depth=2), lambda: TwoLayerReLU(6, 5)])
def test_stacked_forward_equals_each_members_forward(make):
    nets = [make() for _ in range(3)]
    params, buffers = stack_states(nets)
    x = torch.randn(3, 4, 6)
    out = population_forward(nets[0], params, buffers, x)
    for k, net in enumerate(nets):
        torch.testing.assert_close(out[k], net(x[k]))
        assert member_state(params, buffers, k).keys() == net.state_dict().keys()
    shared = population_forward(nets[0], params, buffers, x[0], shared_input=True)
    torch.testing.assert_close(shared[2], nets[2](x[0]))


def test_dropout_masks_are_drawn_independently_per_member():
    net = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5))
    params, buffers = stack_states([net, net])  # identical members
    out = population_forward(net.train(), params, buffers, torch.ones(8, 4), shared_input=True)
    assert not torch.equal(out[0] == 0, out[1] == 0)


def test_stacked_adam_state_slices_to_each_members_own():
    nets = [TwoLayerReLU(4, 3, train_output=True) for _ in range(2)]
    params, _ = stack_states(nets)
    opt = torch.optim.Adam(list(params.values()), lr=0.1)
    x = torch.randn(2, 5, 4)
    population_forward(nets[0], params, {}, x).pow(2).sum().backward()
    opt.step()
    twin = torch.optim.Adam(nets[1].parameters(), lr=0.1)
    nets[1](x[1]).pow(2).sum().backward()
    twin.step()
    mine = member_optimizer_state(opt.state_dict(), list(params.values()), 1)
    for i, state in twin.state_dict()["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(mine["state"][i][key], value)


@pytest.mark.parametrize(
    "make", [lambda: ResNet(depth=8, width=0.25), lambda: VGG(depth=11, width=0.125)]
)
def test_batchnorm_members_train_exactly_as_their_sequential_twins_in_float64(make):
    """Each member's running statistics are its own slice, updated by its own batches; in
    float64 (no ReLU-edge flips from float32 rounding) member k is its sequential twin."""
    torch.manual_seed(0)
    nets = [make().double() for _ in range(3)]
    twins = [copy.deepcopy(n) for n in nets]
    params, buffers = stack_states(nets)
    net = make().double().train()
    opt = torch.optim.SGD(params.values(), lr=0.05, momentum=0.9)
    twin_opts = [torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9) for t in twins]
    for _ in range(3):
        x = torch.randn(3, 8, 3, 32, 32, dtype=torch.float64)
        y = torch.randint(0, 10, (3, 8))
        losses = population_losses(F.cross_entropy, population_forward(net, params, buffers, x), y)
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
        for k, (twin, twin_opt) in enumerate(zip(twins, twin_opts)):
            twin.train()
            twin_opt.zero_grad()
            F.cross_entropy(twin(x[k]), y[k]).backward()
            twin_opt.step()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    out = population_forward(net.eval(), params, buffers, x, shared_input=True)
    for k, twin in enumerate(twins):
        state = member_state(params, buffers, k)
        for name, value in twin.state_dict().items():  # running statistics and counts too
            torch.testing.assert_close(state[name], value, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out[k], twin.eval()(x), rtol=1e-10, atol=1e-12)


def test_a_batchnorm_with_a_cumulative_average_is_named():
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=None)).eval()
    with pytest.raises(ValueError, match=r"Sequential cannot be vectorised.*layer '1'.*separate"):
        check_vectorizable(net, torch.randn(2, 4))
    assert not net.training  # the probe ran it in training mode and gave its mode back
