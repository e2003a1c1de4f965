"""derive_spec through normalisations a module calls as functions (issue 35 item 1), as timm
writes them (``BatchNormAct2d``: ``F.batch_norm`` then an activation; ``GroupNorm1``:
``F.group_norm``; instance norm): their parameters and running statistics are placed on the
channels' group exactly as the module forms', the spec passes ``check_spec``, and weight
matching recovers a permuted copy."""

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


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d in short: batch norm by the function, then ReLU."""

    def forward(self, x):
        x = F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias,
            self.training, self.momentum, self.eps,
        )  # fmt: skip
        return F.relu(x)


class GroupNorm1(nn.GroupNorm):
    def __init__(self, channels: int, groups: int = 1) -> None:
        super().__init__(groups, channels)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class InstanceNorm(nn.InstanceNorm2d):
    def forward(self, x):
        return F.instance_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias,
            not self.track_running_stats, self.momentum, self.eps,
        )  # fmt: skip


class Net(nn.Module):
    def __init__(self, norm, module_norm) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.n1 = norm(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.n2 = module_norm(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.n1(self.conv1(x)))
        x = x + F.relu(self.n2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


NORMS = {
    "batch_norm": (BatchNormAct, nn.BatchNorm2d),
    "group_norm_1": (GroupNorm1, lambda c: nn.GroupNorm(1, c)),
    "group_norm_4": (lambda c: GroupNorm1(c, 4), lambda c: nn.GroupNorm(4, c)),
    "instance_norm": (
        lambda c: InstanceNorm(c, affine=True, track_running_stats=True),
        lambda c: nn.InstanceNorm2d(c, affine=True, track_running_stats=True),
    ),
}


def _randomise(model: nn.Module) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("running_var"):
            out[k] = torch.rand(v.shape, generator=g) + 0.5
        elif v.is_floating_point():
            out[k] = torch.randn(v.shape, generator=g)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("kind", NORMS)
def test_a_functional_norm_is_its_module_form(kind):
    functional, module = NORMS[kind]
    torch.manual_seed(0)
    net, twin = Net(functional, module).eval(), Net(module, module).eval()
    x = torch.randn(2, 3, 6, 6)
    spec, twin_spec = derive_spec(net, x), derive_spec(twin, x)
    assert spec.axes == twin_spec.axes  # running stats included
    assert spec.activations == twin_spec.activations
    check_spec(net, spec, x)
    state = _randomise(net)
    perm = random_permutation(spec.sizes(state), 3)
    permuted = apply_permutation(state, spec, perm)
    found = weight_matching(permuted, state, spec, method="plain").perm
    assert {g for g in perm if not torch.equal(found[g], perm[g])} == set()
