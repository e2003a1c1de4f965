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


class Linear(nn.Linear):
    """timm's Linear: the weight cast to the input's dtype, then the function."""

    def forward(self, x):
        bias = self.bias.to(dtype=x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(dtype=x.dtype), bias)


class MLP(nn.Module):
    def __init__(self, linear) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = linear(6, 16), linear(16, 16, bias=False), linear(16, 3)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.relu(self.fc1(x)))))


def test_f_linear_on_a_modules_parameters_is_its_module_form():
    torch.manual_seed(0)
    net, twin = MLP(Linear).eval(), MLP(nn.Linear).eval()
    x = torch.randn(4, 5, 6)  # tokens: the features on the last axis
    spec, twin_spec = derive_spec(net, x), derive_spec(twin, x)
    assert spec.axes == twin_spec.axes and spec.activations == twin_spec.activations
    check_spec(net, spec, x)
    state = _randomise(net)
    perm = random_permutation(spec.sizes(state), 1)
    found = weight_matching(apply_permutation(state, spec, perm), state, spec).perm
    assert {g for g in perm if not torch.equal(found[g], perm[g])} == set()


def test_f_linear_with_a_computed_weight_is_refused_with_the_reason():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return self.fc(F.linear(x, torch.ones(6, 6)))  # a weight made in forward

    with pytest.raises(Exception, match="F.linear with a weight that is not a parameter"):
        derive_spec(Tied(), torch.randn(2, 6))


class LayerScaleBlock(nn.Module):
    """ConvNeXt / MetaFormer style: a residual branch scaled per channel by ``gamma``, used
    through a reshape (``gamma.reshape(1, -1, 1, 1)``) or a view of a (C, 1, 1) copy."""

    def __init__(self, c: int, how: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gamma = nn.Parameter(torch.randn(c))
        self.how = how

    def forward(self, x):
        if self.how == "reshape":
            g = self.gamma.reshape(1, -1, 1, 1)
        else:
            g = self.gamma.view(-1, 1, 1)  # broadcast from the right: channels on axis 1
        return x + self.conv(x) * g


class ScaledNet(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = LayerScaleBlock(8, how)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.block(F.relu(self.stem(x))).mean((2, 3)))


@pytest.mark.parametrize("how", ["reshape", "view"])
def test_a_layer_scale_used_through_a_reshape_is_permuted_with_its_channels(how):
    torch.manual_seed(0)
    net = ScaledNet(how).eval()
    x = torch.randn(2, 3, 6, 6)
    spec = derive_spec(net, x)
    assert spec.axes["block.gamma"] == (spec.axes["stem.weight"][0],)  # the residual stream
    check_spec(net, spec, x)
    state = _randomise(net)
    perm = random_permutation(spec.sizes(state), 2)
    found = weight_matching(apply_permutation(state, spec, perm), state, spec).perm
    assert {g for g in perm if not torch.equal(found[g], perm[g])} == set()


def test_a_parameter_reshaped_across_its_axes_is_refused_naming_it():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1)
            self.table = nn.Parameter(torch.randn(2, 4))

        def forward(self, x):
            return self.conv(x) * self.table.reshape(1, 8, 1, 1)

    with pytest.raises(Exception, match="parameter 'table' is reshaped from"):
        derive_spec(Mixed(), torch.randn(2, 3, 4, 4))


class Padded(nn.Module):
    """Spatial padding by the function (timm's same-padding and window partitions), and a
    reshape_as back to a stored shape (LeViT)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = self.conv1(F.pad(x, (1, 1, 1, 1)))
        z = F.pad(F.relu(y), (0, 2, 0, 2))  # bottom/right, as window partitions pad
        z = self.conv2(z)[:, :, :6, :6]
        z = z.flatten(2).reshape_as(y.flatten(2))
        return self.head(z.mean(2))


def test_spatial_padding_and_reshape_as_pass_the_channels_through():
    torch.manual_seed(0)
    net = Padded().eval()
    x = torch.randn(2, 3, 6, 6)
    spec = derive_spec(net, x)
    assert spec.axes["conv1.weight"][0] == spec.axes["conv2.weight"][1]
    check_spec(net, spec, x)


def test_padding_the_channels_is_refused():
    class ChannelPad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1)

        def forward(self, x):
            return F.pad(self.conv(x), (0, 0, 0, 0, 0, 2))

    with pytest.raises(Exception, match="F.pad pads axis 1, the permuted features' axis"):
        derive_spec(ChannelPad(), torch.randn(2, 3, 4, 4))


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        y = self.conv(x)
        if y.sum() > 0:  # control flow on a tensor's value: fx cannot trace it
            y = -y
        return y


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        return torch.cumsum(self.conv(x), dim=1)  # mixes the channels


class Outer(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.body = inner

    def forward(self, x):
        return self.body(x)


def test_an_untraceable_forward_is_named_with_its_module_and_line():
    with pytest.raises(Exception) as err:
        derive_spec(Outer(Gate()), torch.randn(2, 3, 4, 4))
    msg = str(err.value)
    assert "torch.fx could not trace Outer at module 'body'" in msg
    assert "test_derive_functional.py:" in msg and "`if y.sum() > 0:" in msg
    assert "Write the spec by hand" in msg


def test_an_unknown_operation_is_named_with_its_module_line_and_the_way_out():
    with pytest.raises(Exception) as err:
        derive_spec(Outer(Mixer()), torch.randn(2, 3, 4, 4))
    msg = str(err.value)
    assert "node 'cumsum' (call_function cumsum) in module 'body'" in msg
    assert "`return torch.cumsum(self.conv(x), dim=1)" in msg
    assert "write the spec by hand for this model" in msg


class DropHead(nn.Module):
    """A classifier head that drops the pooled features by the function (timm's heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(F.dropout(x, p=0.5, training=self.training))


def test_check_spec_in_train_mode_keeps_functional_dropout_off():
    net = DropHead()
    x = torch.randn(4, 3, 6, 6)
    spec = derive_spec(net, x)
    check_spec(net, spec, x)  # train mode: batch statistics, dropout off (module or function)
    assert F.dropout(torch.ones(1000), 0.5, True).eq(0).any()  # restored afterwards
