"""CCMM (cycle-consistent multi-model matching, C2M3): known answers, cycle consistency, errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from lmc.interpolation.states import weighted_average
from lmc.merging import (
    MERGE_METHODS,
    MergeInputs,
    align_states,
    ccmm,
    ccmm_merge,
    merge_many_perms,
    merge_sweep,
    pairwise_permutation,
)
from lmc.models import MLP, ResNet
from lmc.permutation import (
    SpecError,
    apply_permutation,
    compose_permutations,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
)


def _perms(states, spec, name, num_models, **settings):
    """Each n's permutations of method ``name`` (``settings``: the MergeInputs' own)."""
    sweep = merge_sweep(MergeInputs(states, spec, **settings), name, num_models)
    return {n: merged.perms for n, merged in sweep.items()}


def _copies(net, n, seed=0):
    spec = spec_for(net)
    base = {k: v.clone() for k, v in net.state_dict().items()}
    perms = [random_permutation(spec.sizes(base), seed + i) for i in range(1, n)]
    return spec, base, [base] + [apply_permutation(base, spec, p) for p in perms], perms


def _random_models(n, width=8, seed=0):
    out = []
    for i in range(n):
        torch.manual_seed(seed + i)
        out.append(MLP(12, 4, width=width, depth=3).state_dict())
    return out


@pytest.mark.parametrize(
    ("make", "n"),
    [(lambda: MLP(10, 3, width=12, depth=3), 3), (lambda: ResNet(20, width=0.125), 2)],
)
def test_permuted_copies_merge_back_to_the_model(make, n, device):
    """Known answer: a model fused with randomly permuted copies of itself is the model, and
    every copy's permutation is the inverse of the one applied (ResNet: residual streams and
    BatchNorm statistics included)."""
    torch.manual_seed(0)
    spec, base, states, perms = _copies(make().to(device), n)
    res = ccmm(states, spec)
    assert res.converged
    assert all(p.device.type == device for perm in res.perms for p in perm.values())
    assert all(t.device.type == device for t in res.merged.values())
    for i, p in enumerate(perms, start=1):
        assert permutation_equal(res.perms[i], invert_permutation(p))
    for k, v in base.items():
        if v.is_floating_point():
            torch.testing.assert_close(res.merged[k], v, rtol=0, atol=1e-6, msg=k)
        else:
            assert torch.equal(res.merged[k], v), k
    assert res.objective == pytest.approx(res.history[-1], rel=1e-6)


def test_pairwise_permutations_compose_around_every_cycle():
    states = _random_models(4)
    spec = spec_for(MLP(12, 4, width=8, depth=3))
    res = ccmm(states, spec)
    n = len(states)
    for i, j, k in itertools.product(range(n), repeat=3):
        p_ik = pairwise_permutation(res.perms, i, k)
        p_ij_jk = compose_permutations(
            pairwise_permutation(res.perms, i, j), pairwise_permutation(res.perms, j, k)
        )
        assert permutation_equal(p_ij_jk, p_ik), (i, j, k)
    for i in range(n):  # P_ii is the identity, P_ji is the inverse of P_ij
        assert all(torch.equal(p, torch.arange(p.numel())) for p in res.perms[0].values())
        for j in range(n):
            assert permutation_equal(
                pairwise_permutation(res.perms, j, i),
                invert_permutation(pairwise_permutation(res.perms, i, j)),
            )
    # the pairwise map aligns model k to model i: both land on the same universe point
    a = apply_permutation(states[2], spec, pairwise_permutation(res.perms, 1, 2))
    u1 = apply_permutation(a, spec, res.perms[1])
    u2 = apply_permutation(states[2], spec, res.perms[2])
    assert all(torch.equal(u1[key], u2[key]) for key in u1)


def test_frank_wolfe_improves_and_rivals_mergemany():
    """The objective rises monotonically and the rounded solution scores at least as well as
    the identity; on random nets CCMM's distance to the merged mean is close to MergeMany's."""
    states = _random_models(3, width=16)
    spec = spec_for(MLP(12, 4, width=16, depth=3))
    res = ccmm(states, spec)
    hist = res.history
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(hist, hist[1:]))
    assert res.objective > hist[0]
    again = ccmm_merge(states, spec)  # deterministic
    assert all(torch.equal(again[k], v) for k, v in res.merged.items())

    def spread(perms):
        aligned = align_states(states, spec, perms)
        mean = weighted_average(aligned)
        return sum(float(((s[k] - mean[k]) ** 2).sum()) for s in aligned for k in mean)

    mm = spread(merge_many_perms(states, spec))
    assert spread(res.perms) <= 1.1 * mm


def test_registered_as_a_merge_method_with_the_reference_fixed():
    states = _random_models(3)
    spec = spec_for(MLP(12, 4, width=8, depth=3))
    assert "ccmm" in MERGE_METHODS
    sweep = _perms(states, spec, "ccmm", [2, 3], reference=1)
    assert len(sweep[2]) == 2 and len(sweep[3]) == 3
    assert all(torch.equal(p, torch.arange(p.numel())) for p in sweep[3][1].values())


def test_bad_inputs_fail_clearly():
    net = MLP(12, 4, width=8, depth=3)
    spec = spec_for(net)
    state = net.state_dict()
    with pytest.raises(ValueError, match="N >= 2 models, got 1"):
        ccmm([state], spec)
    deeper = MLP(12, 4, width=8, depth=4).state_dict()
    with pytest.raises(ValueError, match="keys only in"):
        ccmm([state, deeper], spec)
    wider = MLP(12, 4, width=10, depth=3).state_dict()
    with pytest.raises(ValueError, match="model 1 and model 0 differ at 'layers.0.weight'"):
        ccmm([state, wider], spec)
    other = spec_for(MLP(12, 4, width=8, depth=2))
    with pytest.raises(SpecError, match="model 0 does not fit"):
        ccmm([state, state], other)
    with pytest.raises(ValueError, match="reference=5"):
        ccmm([state, state], spec, reference=5)
    with pytest.raises(ValueError, match="spec is required"):
        ccmm([state, state])
