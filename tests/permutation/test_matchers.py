"""The matcher registry: every registered matcher recovers a permuted copy, unknown names list
the registered ones, and a newly registered matcher is used by name (the merge methods' contract
is tested in ``tests/merging/test_contract.py``)."""

from __future__ import annotations

import pytest
import torch

from lmc.interpolation import interpolation_study
from lmc.models import MLP
from lmc.permutation import (
    MATCHERS,
    Matching,
    apply_permutation,
    identity_permutation,
    match,
    random_permutation,
    spec_for,
)
from lmc.registry import Registry
from tests.permutation.helpers import build


def _pair():
    model, data = build(lambda: MLP(20, 5, width=12, depth=2), (20,))
    spec = spec_for(model)
    state = model.state_dict()
    perm = random_permutation(spec.sizes(state), 3)
    return model, data, spec, state, apply_permutation(state, spec, perm)


@pytest.mark.parametrize("name", [n for n in MATCHERS.names() if n != "none"])
def test_every_data_or_weight_matcher_recovers_a_permuted_copy(name):
    """Every registered matcher (but the identity): a new one is tested by registering it."""
    model, data, spec, state, permuted = _pair()
    loader = [(x, torch.zeros(len(x), dtype=torch.long)) for x in data]
    result = match(name, model, [state, permuted], spec, batches=loader)
    aligned = result.apply([state, permuted], spec)
    for k, v in state.items():
        assert torch.equal(aligned[1][k], v), k
        assert torch.equal(aligned[0][k], v), k


def test_none_matcher_is_the_identity():
    model, _, spec, state, permuted = _pair()
    result = match("none", model, [state, permuted], spec)
    ident = identity_permutation(spec.sizes(state))
    assert all(torch.equal(p[g], ident[g]) for p in result.perms for g in ident)


def test_unknown_matcher_lists_the_registered_names():
    model, _, spec, state, permuted = _pair()
    with pytest.raises(ValueError, match="none, weight, activation, correlation"):
        match("sinkhorn-typo", model, [state, permuted], spec)
    with pytest.raises(ValueError, match="model.init_args.matcher: unknown matcher 'x'"):
        MATCHERS.check("x", "model.init_args.matcher")


def test_a_registered_matcher_is_used_by_name_in_a_study(monkeypatch):
    calls = []

    def swap_back(net, states, spec, *, batches=None, seed=0):
        calls.append(len(states))
        return Matching([identity_permutation(spec.sizes(states[0]))] * len(states))

    monkeypatch.setitem(MATCHERS._entries, "my_matcher", swap_back)
    model, data, _, state, _ = _pair()
    splits = {"test": [(x, torch.zeros(len(x), dtype=torch.long)) for x in data]}
    result = interpolation_study(model, [state, state], splits, matcher="my_matcher", num_alphas=3)
    assert calls == [2]
    assert result.summary["barrier_loss_matched"] == pytest.approx(0.0, abs=1e-6)


def test_registering_a_name_twice_is_refused():
    reg: Registry = Registry("thing")
    reg.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(abs)
