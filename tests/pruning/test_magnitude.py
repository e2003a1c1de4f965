"""Magnitude pruning on torch.nn.utils.prune: exact counts, fixed masks, rewinds, permanence."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from lmc.metrics import weight_layers
from lmc.models import MLP
from lmc.pruning import (
    dense_snapshot,
    fold_masks,
    get_masks,
    layer_sparsity,
    magnitude_mask,
    make_permanent,
    num_pruned,
    prune_magnitude,
    rate_schedule,
    rewind,
)


def _mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP(12, 5, width=16, depth=2)


def _train(model: nn.Module, steps: int = 5, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    # weight decay and momentum keep moving masked entries of weight_orig: the mask must hold
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    for _ in range(steps):
        x, y = torch.randn(32, 12, generator=g), torch.randint(0, 5, (32,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.29, 0.5, 0.77, 0.9, 1.0])
def test_exactly_floor_rate_n_zeros_per_layer(rate):
    model = _mlp()
    prune_magnitude(model, rate)
    for name, module in weight_layers(model).items():
        n = module.weight.numel()
        assert int((module.weight_mask == 0).sum()) == math.floor(round(rate * n, 6)), name
        assert int((module.weight == 0).sum()) == num_pruned(rate, n)


def test_floor_is_robust_to_float_noise():
    assert num_pruned(0.29, 100) == 29 and num_pruned(0.7, 10) == 7 and num_pruned(0.5, 7) == 3


def test_ties_are_broken_to_the_exact_count():
    w = torch.ones(7, 9)
    for rate in (0.1, 0.5, 0.9):
        mask = magnitude_mask(w, rate)
        assert int((mask == 0).sum()) == math.floor(rate * 63)
    w = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -1.0])  # ties at zero and at |1|
    assert magnitude_mask(w, 0.5).tolist() == [0, 0, 0, 1, 1, 1]
    assert magnitude_mask(w, 5 / 6).tolist() == [0, 0, 0, 0, 0, 1]


def test_mask_equals_the_first_k_of_a_stable_sort_with_many_ties():
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-4, 5, (50, 37), generator=g).float()  # 9 values: ties everywhere
    for rate in (0.0, 0.13, 0.5, 0.77, 1.0):
        k = num_pruned(rate, w.numel())
        expected = torch.ones(w.numel())
        expected[torch.sort(w.abs().reshape(-1), stable=True).indices[:k]] = 0
        assert torch.equal(magnitude_mask(w, rate).reshape(-1), expected)


def test_smallest_magnitudes_are_pruned():
    w = torch.randn(40, 30, generator=torch.Generator().manual_seed(0))
    mask = magnitude_mask(w, 0.6)
    assert w[mask == 0].abs().max() <= w[mask == 1].abs().min()


def test_conv_layers_and_a_layer_subset():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 2))
    masks = prune_magnitude(model, 0.5, layers=["0"])
    assert list(masks) == ["0"] and int((masks["0"] == 0).sum()) == 8 * 27 // 2
    assert not hasattr(model[3], "weight_mask")


def test_masks_stay_fixed_while_fine_tuning():
    model = _mlp()
    optimizer_params = list(model.parameters())
    prune_magnitude(model, 0.6)
    masks = {k: v.clone() for k, v in get_masks(model).items()}
    # the optimizer made before pruning keeps updating weight_orig (the same Parameter object)
    assert {id(p) for p in model.parameters()} == {id(p) for p in optimizer_params}
    _train(model, steps=10)
    for name, module in weight_layers(model).items():
        assert torch.equal(module.weight_mask, masks[name])
        assert bool((module.weight_orig * module.weight_mask)[masks[name] == 0].eq(0).all())
    sparsity = layer_sparsity(model)
    assert all(
        s == pytest.approx(math.floor(0.6 * m.weight.numel()) / m.weight.numel())
        for s, m in zip(sparsity.values(), weight_layers(model).values())
    )


def test_pruning_again_grows_masks_and_never_shrinks_them():
    model = _mlp()
    rates = rate_schedule(0.8, 3)
    previous = None
    for rate in rates:
        prune_magnitude(model, rate)
        _train(model, steps=3)
        masks = {k: v.clone() for k, v in get_masks(model).items()}
        if previous is not None:
            assert all(bool((masks[k] <= previous[k]).all()) for k in masks)
        previous = masks
    with pytest.raises(ValueError, match="non-decreasing"):
        prune_magnitude(model, 0.5)


def test_make_permanent_gives_plain_parameters_and_dense_keys():
    model = _mlp()
    dense_keys = list(model.state_dict())
    prune_magnitude(model, 0.5)
    x = torch.randn(4, 12)
    before = model(x)
    make_permanent(model)
    assert list(model.state_dict()) == dense_keys
    for module in weight_layers(model).values():
        assert not module._forward_pre_hooks
        assert isinstance(module.weight, nn.Parameter)
    assert torch.equal(model(x), before)
    fresh = _mlp(seed=1)
    fresh.load_state_dict(model.state_dict())  # strict: loads into the dense model
    assert torch.equal(fresh(x), before)


def test_pruned_model_serialises_and_loads_like_the_dense_model():
    model = _mlp()
    dense_keys = list(model.state_dict())
    prune_magnitude(model, 0.3)
    state = model.state_dict()
    assert list(state) == dense_keys  # no weight_orig/weight_mask, dense order
    assert list(model.state_dict(keep_vars=True)) == dense_keys
    assert torch.equal(
        state["layers.0.weight"], model.layers[0].weight_orig * model.layers[0].weight_mask
    )
    dense = _mlp(seed=2)
    dense.load_state_dict(state)  # strict
    x = torch.randn(3, 12)
    assert torch.equal(dense(x), model(x))
    # a dense state loads into the pruned model: values into weight_orig, the mask is kept
    mask = model.layers[0].weight_mask.clone()
    model.load_state_dict(_mlp(seed=3).state_dict())
    assert torch.equal(model.layers[0].weight_mask, mask)
    assert torch.equal(model.layers[0].weight_orig, _mlp(seed=3).layers[0].weight)
    assert bool((effective(model)[mask == 0] == 0).all())


def effective(model: nn.Module) -> torch.Tensor:
    return model.layers[0].weight_orig * model.layers[0].weight_mask


def test_deep_copies_keep_their_own_hooks():
    model = _mlp()
    prune_magnitude(model, 0.5)
    clone = make_permanent(copy.deepcopy(model))
    assert not clone.layers[0]._state_dict_hooks and not clone.layers[0]._load_state_dict_pre_hooks
    assert list(model.state_dict()) == list(clone.state_dict())  # the original still folds
    other = copy.deepcopy(model)
    other.load_state_dict(_mlp(seed=4).state_dict())
    assert not torch.equal(other.layers[0].weight_orig, model.layers[0].weight_orig)


def test_fold_masks_for_plain_torch_pruning():
    model = _mlp()
    prune.l1_unstructured(model.layers[0], "weight", amount=0.5)
    state = model.state_dict()
    assert "layers.0.weight_mask" in state
    folded = fold_masks(state)
    dense = _mlp(seed=2)
    assert list(folded) == list(dense.state_dict())  # same keys, same order
    dense.load_state_dict(folded)
    x = torch.randn(3, 12)
    assert torch.equal(dense(x), model(x))


def test_lottery_ticket_survivors_equal_init_bit_for_bit_after_several_rounds():
    model = _mlp()
    init = dense_snapshot(model)
    for rate in rate_schedule(0.9, 4):
        _train(model, steps=5)
        prune_magnitude(model, rate)
        rewind(model, init)
        for name, module in weight_layers(model).items():
            mask = module.weight_mask.bool()
            w = module.weight  # the effective weight the next forward would use
            assert torch.equal(w[mask], init[f"{name}.weight"][mask])
            assert bool((w[~mask] == 0).all())
            assert torch.equal(module.bias, init[f"{name}.bias"])
