"""Pure vectorisation pieces: the stacked forward equals each member's own forward, dropout
draws per member, stacked optimizer state slices back to each member's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmc.models import MLP, TwoLayerReLU
from lmc.population import check_vectorizable, population_forward, stack_states
from lmc.population.vectorize import member_optimizer_state, member_state


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


def test_batchnorm_is_named():
    with pytest.raises(ValueError, match=r"'norms.0' of MLP is a BatchNorm1d"):
        check_vectorizable(MLP(4, 2, width=4, depth=2, norm="batch"))
