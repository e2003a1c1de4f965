"""apply/invert/compose and the functional-equivalence check (C2)."""

from __future__ import annotations

import pytest
import torch

from lmc.models import VGG, ResNet
from lmc.permutation import (
    PermutationSpec,
    SpecCheckError,
    SpecError,
    apply_permutation,
    check_spec,
    compose_permutations,
    invert_permutation,
    random_permutation,
    spec_for,
)

from .helpers import PARAMS


@pytest.mark.parametrize(("factory", "shape"), PARAMS)
def test_random_permutation_preserves_function(factory, shape):
    """Contract test: every built-in spec passes the check in train and eval mode."""
    torch.manual_seed(0)
    model = factory()
    report = check_spec(model, None, torch.randn(4, *shape))
    assert report.ok and report.checked_groups == len(spec_for(model).groups)


def test_apply_invert_compose_roundtrip():
    model = ResNet(20, width=0.25)
    spec, state = spec_for(model), model.state_dict()
    sizes = spec.sizes(state)
    p, q = random_permutation(sizes, 1), random_permutation(sizes, 2)
    back = apply_permutation(apply_permutation(state, spec, p), spec, invert_permutation(p))
    assert all(torch.equal(back[k], state[k]) for k in state)
    two = apply_permutation(apply_permutation(state, spec, q), spec, p)
    one = apply_permutation(state, spec, compose_permutations(p, q))
    assert all(torch.equal(two[k], one[k]) for k in state)
    assert apply_permutation(state, spec, p)["linear.bias"] is state["linear.bias"]  # no copy


def test_check_spec_names_group_missing_a_bn_buffer():
    torch.manual_seed(0)
    model = VGG(11, width=1 / 16, norm="batch")
    spec = spec_for(model)
    broken = PermutationSpec({**spec.axes, "features.5.running_var": (None,)}, spec.activations)
    x = torch.randn(4, 3, 32, 32)
    report = check_spec(model, broken, x, raise_on_failure=False)
    assert report.broken_groups == ["features.4", "<all groups>"]
    assert {f.mode for f in report.failures} == {"eval"}  # train mode uses batch statistics
    with pytest.raises(SpecCheckError, match="'features.4' \\(eval mode\\)"):
        check_spec(model, broken, x)


def test_check_spec_names_group_of_a_misplaced_shortcut():
    torch.manual_seed(0)
    model = ResNet(20, width=0.25, norm="layer")
    spec = spec_for(model)
    broken = PermutationSpec({**spec.axes, "layer3.0.shortcut.1.bias": (None,)}, spec.activations)
    report = check_spec(model, broken, torch.randn(4, 3, 8, 8), raise_on_failure=False)
    assert report.broken_groups == ["stream3", "<all groups>"]


def test_errors_name_the_key():
    model = VGG(11, width=1 / 16, norm="batch")
    spec, state = spec_for(model), model.state_dict()
    bad = dict(state)
    bad["features.4.weight"] = bad["features.4.weight"].clone()
    bad["features.4.weight"][0, 0, 0, 0] = float("nan")
    model.load_state_dict(bad)
    with pytest.raises(SpecError, match="features.4.weight"):
        check_spec(model, spec, torch.randn(2, 3, 8, 8))
    sizes = spec.sizes(state)
    perm = random_permutation(sizes, 0)
    perm["features.0"] = torch.zeros(sizes["features.0"], dtype=torch.long)
    with pytest.raises(SpecError, match="features.0"):
        apply_permutation(state, spec, perm)
    del perm["features.4"]
    with pytest.raises(SpecError, match="features.4"):
        apply_permutation(state, spec, perm)
