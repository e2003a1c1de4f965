"""MergeMany: permuted copies merge back exactly; the total distance falls monotonically."""

from __future__ import annotations

import pytest
import torch

from lmc.models import MLP, VGG
from lmc.permutation import apply_permutation, merge_many, random_permutation, spec_for


def test_permuted_copies_merge_to_the_model(device):
    torch.manual_seed(0)
    model = VGG(11, width=1 / 16, norm="batch").to(device)
    spec, state = spec_for(model), model.state_dict()
    sizes = spec.sizes(state)
    copies = [apply_permutation(state, spec, random_permutation(sizes, s)) for s in range(4)]
    res = merge_many(copies, spec)
    assert res.history[-1] == pytest.approx(0.0, abs=1e-9) and res.history[0] > 0
    assert all(p.device.type == device for perm in res.perms for p in perm.values())
    assert all(t.device.type == device for t in res.merged.values())
    for s, p in zip(copies, res.perms):
        aligned = apply_permutation(s, spec, p)
        # the mean of four equal tensors is exact on any device
        assert all(torch.equal(aligned[k], res.merged[k]) for k in state)


def test_distance_falls_and_methods_agree():
    torch.manual_seed(0)
    models = [MLP(20, 4, width=16, depth=2) for _ in range(3)]
    fast = merge_many(models)
    plain = merge_many(models, method="plain")
    assert all(y <= x * (1 + 1e-9) for x, y in zip(fast.history, fast.history[1:]))
    assert fast.history[-1] < fast.history[0]
    assert fast.history[-1] == pytest.approx(plain.history[-1], rel=1e-6)
    with pytest.raises(ValueError, match="at least two"):
        merge_many(models[:1])
