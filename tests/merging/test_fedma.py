"""Known-answer and bad-input tests of FedMA (issue 17, item 2; 000 §5) and of the Dirichlet
client split, on tiny models and in-memory data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmc.data.federated import client_batches, client_class_counts, dirichlet_split
from lmc.merging import MERGE_METHODS
from lmc.merging.fedma import fedma, match_layer
from lmc.merging.otfusion import Pruning, materialize
from lmc.models import MLP, ResNet
from lmc.permutation import apply_permutation, random_permutation, spec_for


def _mlp(seed: int) -> MLP:
    torch.manual_seed(seed)
    return MLP(20, 5, width=16, depth=2)


def _max_diff(a, b) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


def test_permuted_copy_is_recovered_with_one_round_and_no_retraining():
    net = _mlp(0)
    spec = spec_for(net)
    state = net.state_dict()
    perm = apply_permutation(state, spec, random_permutation(spec.sizes(state), 1))
    res = fedma([state, perm, perm], spec, rounds=1, epochs=0)
    assert res.widths == spec.sizes(state)
    assert _max_diff(res.state, state) < 1e-6
    assert "fedma" in MERGE_METHODS


def test_unmatched_units_open_new_global_units_up_to_the_cap():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 3))
    far = a + 100.0  # nothing alike: every unit of client 1 opens a new global unit
    glob, assign = match_layer([a, far], max_width=8)
    assert glob.shape == (8, 3)
    assert sorted(assign[1].tolist()) == [4, 5, 6, 7]
    glob, assign = match_layer([a, far], max_width=4)
    assert glob.shape == (4, 3)
    with pytest.raises(ValueError, match="max_width"):
        match_layer([a, far], max_width=3)


def test_rounds_retraining_and_pruning_run_on_clients():
    net = _mlp(0)
    spec = spec_for(net)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, 20, generator=gen), torch.arange(120) % 5
    parts = dirichlet_split(y, 3, alpha=1.0, seed=0)
    batches = client_batches(x, y, parts, 16)
    states = [_mlp(s).state_dict() for s in range(3)]
    res = fedma(
        states,
        spec,
        net=net,
        client_batches=batches,
        rounds=2,
        epochs=1,
        class_counts=client_class_counts(y, parts, 5),
        max_width=1.25,
        pruning=Pruning(0.2),
    )
    assert all(16 <= w <= 20 for w in res.widths.values())
    out = materialize(net, res.state)(x)
    assert out.shape == (120, 5) and torch.isfinite(out).all()


def test_dirichlet_split_is_seeded_and_complete():
    y = np.repeat(np.arange(4), 50)
    a = dirichlet_split(y, 5, alpha=0.3, seed=7)
    b = dirichlet_split(y, 5, alpha=0.3, seed=7)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(200))
    assert client_class_counts(y, a, 4).sum() == 200


def test_bad_input():
    y = np.repeat(np.arange(3), 4)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        dirichlet_split(y, 2, alpha=0.0)
    with pytest.raises(ValueError, match="only 4 examples"):
        dirichlet_split(y, 5, alpha=1.0)
    net = _mlp(0)
    spec = spec_for(net)
    with pytest.raises(ValueError, match="at least 2 models"):
        fedma([net.state_dict()], spec)
    with pytest.raises(ValueError, match="batches"):
        fedma([net.state_dict(), _mlp(1).state_dict()], spec, net=net, epochs=1)
    res = ResNet(depth=8, width=0.25)
    with pytest.raises(ValueError, match="sequential"):
        fedma([res.state_dict(), res.state_dict()], spec_for(res))
