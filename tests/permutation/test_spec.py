"""Permutation specs: built-ins fit every model option, derivation reproduces them, errors name keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmc.models import MLP, ResNet, TwoLayerReLU
from lmc.permutation import (
    PermutationSpec,
    SpecDerivationError,
    SpecError,
    check_spec,
    derive_spec,
    spec_for,
)

from .helpers import PARAMS


def _points(spec: PermutationSpec) -> dict[frozenset, set[str]]:
    return {frozenset(spec.groups[g]): set(p) for g, p in spec.activations.items()}


@pytest.mark.parametrize(("factory", "shape"), PARAMS)
def test_builtin_spec_covers_every_entry(factory, shape):
    model = factory()
    spec = spec_for(model)
    state = model.state_dict()
    sizes = spec.sizes(state)
    assert set(spec.axes) == set(state)
    assert set(sizes) == set(spec.activations)  # every group has activation points
    for key, axes in spec.axes.items():
        if key.endswith("num_batches_tracked"):
            assert axes == ()
        if key.endswith(("running_mean", "running_var")):
            assert axes[0] is not None, key


@pytest.mark.parametrize(("factory", "shape"), PARAMS)
def test_derived_spec_equals_builtin(factory, shape):
    model = factory()
    built, derived = spec_for(model), derive_spec(model, torch.randn(2, *shape))
    assert set(derived.axes) == set(built.axes)
    assert derived.partition() == built.partition()
    assert _points(derived) == _points(built)


def test_resnet_stream_is_one_group_per_stage():
    spec = spec_for(ResNet(20, width=0.25))
    stream2 = set(spec.groups["stream2"])
    expected = {("layer2.0.shortcut.0.weight", 0), ("layer2.0.shortcut.1.running_var", 0)}
    expected |= {(f"layer2.{b}.bn2.running_mean", 0) for b in range(3)}
    expected |= {(f"layer2.{b}.conv2.weight", 0) for b in range(3)}
    expected |= {(f"layer2.{b}.conv1.weight", 1) for b in (1, 2)}
    expected |= {("layer3.0.conv1.weight", 1), ("layer3.0.shortcut.0.weight", 1)}
    assert expected <= stream2
    assert ("conv1.weight", 0) in spec.groups["stream1"]
    assert ("linear.weight", 1) in spec.groups["stream3"]
    assert spec.activations["stream1"] == ("act", "layer1.0.act2", "layer1.1.act2", "layer1.2.act2")
    gn = spec_for(ResNet(20, width=0.25, norm="layer"))
    assert ("layer2.0.shortcut.1.weight", 0) in gn.groups["stream2"]


def test_frozen_output_weights_are_permuted():
    spec = spec_for(TwoLayerReLU(10, 7))
    assert spec.axes["head.weight"] == (None, "hidden")


class _ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = h + self.block(h)
        return self.out(torch.tanh(self.norm(h)))


def test_derived_spec_of_user_model_preserves_function():
    model = _ResidualMLP()
    x = torch.randn(5, 6)
    spec = derive_spec(model, x)
    assert len(spec.groups) == 2  # residual stream and block-internal units
    stream = spec.axes["inp.weight"][0]
    assert spec.axes["block.2.weight"] == (stream, spec.axes["block.0.weight"][0])
    assert spec.axes["norm.weight"] == (stream,)
    assert check_spec(model, spec, x).ok


class _Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1)


class _Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.norm(self.conv(x)).mean((2, 3))


@pytest.mark.parametrize(
    ("model", "x", "needle"),
    [
        (
            nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 2)),
            torch.zeros(2, 2, dtype=torch.long),
            "Embedding",
        ),
    ],
    ids=["embedding"],
)
def test_derive_error_names_the_operation(model, x, needle):
    with pytest.raises(SpecDerivationError, match=needle):
        derive_spec(model, x)


def test_spec_for_unknown_model_asks_for_example_input():
    with pytest.raises(TypeError, match="example_input"):
        spec_for(_ResidualMLP())
    assert spec_for(_ResidualMLP(), torch.randn(2, 6)).partition()


def test_spec_validation_names_the_key():
    model = MLP(6, 3, width=5, depth=2)
    spec, state = spec_for(model), model.state_dict()
    axes = dict(spec.axes)
    del axes["layers.1.bias"]
    with pytest.raises(SpecError, match="layers.1.bias"):
        PermutationSpec(axes).sizes(state)
    with pytest.raises(SpecError, match="extra.weight"):
        PermutationSpec({**spec.axes, "extra.weight": (None,)}).sizes(state)
    with pytest.raises(SpecError, match="head.bias"):
        PermutationSpec({**spec.axes, "head.bias": ("layers.0",)}).sizes(state)  # 3 vs 5 units
    with pytest.raises(SpecError, match="layers.0.bias"):
        PermutationSpec({**spec.axes, "layers.0.bias": ("layers.0", None)}).sizes(state)
    with pytest.raises(SpecError, match="unknown groups"):
        PermutationSpec(spec.axes, {"nope": ("acts.0",)})


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:  # Python control flow on a tensor value: torch.fx cannot trace it
            h = h.relu()
        return self.b(h)


def test_data_dependent_control_flow_says_so_and_how_to_write_a_spec():
    with pytest.raises(SpecDerivationError, match=r"could not trace _DataDependent.*by hand"):
        derive_spec(_DataDependent(), torch.randn(2, 4))


def test_an_input_of_the_wrong_shape_gives_the_models_own_error_prefixed():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(SpecDerivationError) as err:
        derive_spec(net, torch.randn(2, 5))
    msg = str(err.value)
    assert msg.startswith("derive_spec: running Sequential on the example input of shape [(2, 5)]")
    assert msg.endswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 4x8)")


@pytest.mark.parametrize(
    ("perm", "needle"),
    [
        ({"a": torch.tensor([0, 1, 2]), "b": torch.tensor([1, 0])}, None),
        ({"a": torch.tensor([0, 1, 2])}, "missing groups \\['b'\\]"),
        ({"a": torch.tensor([0, 1]), "b": torch.tensor([1, 0])}, "group 'a' has shape \\(2,\\)"),
        ({"a": torch.tensor([0.0, 1, 2]), "b": torch.tensor([1, 0])}, "integer indices"),
        ({"a": torch.tensor([0, 1, 2]), "b": torch.tensor([1, 2])}, "'b' has indices outside"),
        ({"a": torch.tensor([0, 1, 2]), "b": torch.tensor([-1, 0])}, "'b' has indices outside"),
        ({"a": torch.tensor([0, 0, 2]), "b": torch.tensor([1, 0])}, "'a' repeats an index"),
    ],
)
def test_check_permutation_names_the_group_at_fault(perm, needle):
    """All groups are checked with one read-back; a bad one is named with what is wrong."""
    from lmc.permutation.spec import check_permutation

    sizes = {"a": 3, "b": 2}
    if needle is None:
        check_permutation(perm, sizes)
    else:
        with pytest.raises(SpecError, match=needle):
            check_permutation(perm, sizes)


def test_check_finite_names_the_entry_and_lets_overflowing_finite_weights_pass():
    from lmc.permutation.spec import check_finite

    good = {"w": torch.ones(3), "big": torch.full((4,), 3e38), "n": torch.tensor([1, 2])}
    check_finite(good)  # <big, big> overflows float32, yet every value is finite
    bad = {**good, "v": torch.tensor([1.0, float("nan"), float("inf")])}
    with pytest.raises(SpecError, match="target entry 'v' has 2 NaN/inf values"):
        check_finite(bad, "target")
