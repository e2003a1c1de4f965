"""Weight matching (004 Alg. 2 and 3): known answers, plain == accelerated, warm starts, solvers."""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
import torch
from torch import nn

from lmc.models import MLP, VGG, ResNet
from lmc.permutation import (
    LapSolution,
    MatchingState,
    SpecError,
    align_weights,
    apply_permutation,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
    weight_matching,
)
from lmc.permutation.lap import sap_solver

from .helpers import PARAMS, build


def _permuted_copy(model: nn.Module, seed: int = 1) -> tuple[nn.Module, dict]:
    spec = spec_for(model)
    perm = random_permutation(spec.sizes(model.state_dict()), seed)
    other = copy.deepcopy(model)
    other.load_state_dict(apply_permutation(model.state_dict(), spec, perm))
    return other, perm


@pytest.mark.parametrize("method", ["plain", "accelerated"])
@pytest.mark.parametrize(("factory", "shape"), PARAMS)
def test_recovers_known_permutation(factory, shape, method):
    model_a, data = build(factory, shape)
    model_b, perm = _permuted_copy(model_a)
    aligned, result = align_weights(model_a, model_b, method=method)
    assert permutation_equal(result.perm, invert_permutation(perm))
    state_a = model_a.state_dict()
    # ||theta_a - pi(theta_b)|| = 0
    assert all(torch.equal(aligned[k], state_a[k]) for k in state_a)
    model_b.load_state_dict(aligned)
    x = torch.cat(data)
    with torch.no_grad():
        assert torch.equal(model_b(x), model_a(x))
    assert result.converged
    hist = result.history  # non-decreasing up to float32 rounding of the tracked objective
    assert all(y >= x - 1e-6 * abs(x) for x, y in zip(hist, hist[1:]))


def _random_pair(factory, seed=0):
    torch.manual_seed(seed)
    return factory(), factory()


@pytest.mark.parametrize(
    "factory",
    [
        lambda: MLP(30, 5, width=24, depth=3),
        lambda: VGG(11, width=1 / 8, norm="batch"),
        lambda: ResNet(20, width=0.5, norm="layer"),
    ],
    ids=["mlp", "vgg11", "resnet20"],
)
def test_accelerated_equals_plain_on_random_pairs(factory):
    a, b = _random_pair(factory)
    for seed in (0, 1):
        plain = weight_matching(a, b, method="plain", seed=seed)
        fast = weight_matching(a, b, method="accelerated", seed=seed)
        assert fast.objective == pytest.approx(plain.objective, rel=1e-6)
        assert fast.history[0] == pytest.approx(plain.history[0], rel=1e-6)  # summed apart
        assert fast.solves <= plain.solves and fast.sweeps <= plain.sweeps
        assert plain.history[-1] > plain.history[0]


def _train(model: nn.Module, seed: int, steps: int = 60) -> nn.Module:
    """A few SGD steps on a fixed synthetic regression task (different data order per seed)."""
    g = torch.Generator().manual_seed(123)
    x, w = torch.randn(256, 30, generator=g), torch.randn(30, 5, generator=g)
    y = torch.tanh(x @ w)
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        idx = torch.randint(0, 256, (32,))
        loss = ((model(x[idx]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_accelerated_equals_plain_on_trained_pairs():
    torch.manual_seed(0)
    a = _train(MLP(30, 5, width=32, depth=3), 1)
    b = _train(MLP(30, 5, width=32, depth=3), 2)
    plain = weight_matching(a, b, method="plain")
    fast = weight_matching(a, b, method="accelerated")
    assert fast.objective == pytest.approx(plain.objective, rel=1e-6)
    assert permutation_equal(fast.perm, plain.perm)


def test_warm_start_carries_permutation_and_duals():
    torch.manual_seed(0)
    a, b = VGG(11, width=1 / 8), VGG(11, width=1 / 8)
    first = weight_matching(a, b, method="accelerated")
    assert isinstance(first.state, MatchingState) and set(first.state.duals) == set(first.perm)
    again = weight_matching(a, b, method="accelerated", init=first.state)
    assert again.sweeps == 1 and again.solves == len(first.perm) and again.converged
    assert permutation_equal(again.perm, first.perm)
    assert again.objective == pytest.approx(first.objective, rel=1e-6)
    # the reference moves a little: warm accelerated == plain started from the same permutation
    sa = {
        k: v + 1e-3 * torch.randn_like(v) if v.is_floating_point() else v
        for k, v in a.state_dict().items()
    }
    warm = weight_matching(sa, b.state_dict(), spec_for(a), method="accelerated", init=first.state)
    plain = weight_matching(sa, b.state_dict(), spec_for(a), method="plain", init=first.perm)
    assert warm.objective == pytest.approx(plain.objective, rel=1e-6)


def test_source_cache_is_reused_across_calls_and_rebuilt_when_the_source_changes():
    torch.manual_seed(0)
    a, b = ResNet(20, width=0.5), ResNet(20, width=0.5)
    spec, sb = spec_for(a), b.state_dict()
    first = weight_matching(a.state_dict(), sb, spec, method="accelerated")
    cache = first.state.cache
    assert cache is not None and cache.nbytes() > 0
    kept = dict(cache.members)
    g = torch.Generator().manual_seed(1)
    moved = {
        k: v + 1e-2 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
        for k, v in a.state_dict().items()
    }
    warm = weight_matching(moved, sb, spec, method="accelerated", init=first.state)
    assert warm.state.cache is cache and all(cache.members[k] is m for k, m in kept.items())
    bare = MatchingState(first.state.perm, first.state.duals)  # same start, nothing kept
    cold = weight_matching(moved, sb, spec, method="accelerated", init=bare, cache_source=False)
    assert cold.state.cache is None
    assert permutation_equal(warm.perm, cold.perm)
    assert warm.objective == pytest.approx(cold.objective, rel=1e-6)
    assert warm.history[0] == pytest.approx(cold.history[0], rel=1e-6)
    # an in-place edit of the source invalidates its members: the result is that of a fresh call
    key = "layer3.0.conv1.weight"
    sb[key].mul_(-1.0)
    edited = weight_matching(moved, sb, spec, method="accelerated", init=warm.state)
    fresh = weight_matching(moved, sb, spec, method="accelerated", init=bare, cache_source=False)
    assert edited.objective == pytest.approx(fresh.objective, rel=1e-6)
    assert permutation_equal(edited.perm, fresh.perm)
    assert all(cache.members[k] is not m for k, m in kept.items() if k[0] == key)


def test_source_cache_sees_edits_that_bypass_the_version_counter():
    """``.data`` edits (old-style training loops) keep the pointer and the version counter: the
    cache compares contents, so the next call is that of a fresh matching."""
    torch.manual_seed(0)
    a, b = MLP(20, 5, width=16, depth=2), MLP(20, 5, width=16, depth=2)
    first = weight_matching(a, b, method="accelerated")
    version = b.layers[1].weight._version
    with torch.no_grad():
        b.layers[1].weight.data.copy_(a.layers[1].weight.data.flip(0))
    assert b.layers[1].weight._version == version
    warm = weight_matching(a, b, method="accelerated", init=first.state)
    bare = MatchingState(first.state.perm, first.state.duals)
    fresh = weight_matching(a, b, method="accelerated", init=bare, cache_source=False)
    assert permutation_equal(warm.perm, fresh.perm)
    assert warm.history == pytest.approx(fresh.history, rel=1e-6)


def test_kept_gather_is_patched_where_a_permutation_moved():
    from lmc.permutation._costs import Member

    torch.manual_seed(0)
    b = torch.randn(6, 8, 3, 3)
    m = Member("w", 0, b, ("out", "in"))
    m.set_target(torch.randn(6, 8, 3, 3))
    p = {"out": torch.randperm(6), "in": torch.randperm(8)}
    first = m.gathered(p)
    assert torch.equal(first, b.index_select(1, p["in"]))
    q = dict(p, **{"in": p["in"].clone()})
    q["in"][[2, 5]] = q["in"][[5, 2]]  # two units swap: patched in place
    assert m.gathered(q) is first and torch.equal(first, b.index_select(1, q["in"]))
    r = dict(q, **{"in": torch.randperm(8, generator=torch.Generator().manual_seed(3))})
    assert torch.equal(m.gathered(r), b.index_select(1, r["in"]))  # many moved: gathered afresh
    assert torch.allclose(m.product(r, cached=True), m.product(r))


@pytest.mark.parametrize("name", ["sap", "lapjv", "lapjv64"])
def test_default_and_legacy_solver_names_give_the_same_result(name):
    torch.manual_seed(0)
    a, b = MLP(20, 4, width=16, depth=2), MLP(20, 4, width=16, depth=2)
    ref = weight_matching(a, b, method="accelerated")
    res = weight_matching(a, b, method="accelerated", solver=name)
    assert res.objective == pytest.approx(ref.objective, rel=1e-9)


def test_solver_is_pluggable_and_timed():
    torch.manual_seed(0)
    a, b = MLP(20, 4, width=10, depth=2), MLP(20, 4, width=10, depth=2)
    calls = []

    def my_solver(cost: np.ndarray) -> LapSolution:
        calls.append(cost.shape)
        return sap_solver(cost)

    res = weight_matching(a, b, method="accelerated", solver=my_solver)
    ref = weight_matching(a, b, method="plain", solver="scipy")
    assert len(calls) == res.solves > 0 and res.solve_seconds > 0
    assert 0 < res.solve_share < 1 and res.objective == pytest.approx(ref.objective)
    with pytest.raises(ValueError, match="duals"):
        weight_matching(a, b, method="accelerated", solver="scipy")
    with pytest.raises(ValueError, match="unknown LAP solver"):
        weight_matching(a, b, solver="nope")


@pytest.mark.parametrize("method", ["plain", "accelerated"])
def test_independent_groups_solved_at_once_follow_the_one_by_one_trajectory(method):
    """ResNet-20's block-internal groups of one stage are not neighbours: their LAPs run at once
    in threads, and every figure equals the one-by-one run exactly (same solves, same order of
    outcomes), including a warm-started second call."""
    torch.manual_seed(0)
    a, b = ResNet(20, width=1), ResNet(20, width=1)
    g = torch.Generator().manual_seed(1)
    moved = {  # the target after a small step, as STE-MM's next call sees it
        k: t + 0.01 * t.std() * torch.randn(t.shape, generator=g) if t.is_floating_point() else t
        for k, t in a.state_dict().items()
    }
    runs = {}
    for workers in (1, 4):
        first = weight_matching(a, b, method=method, seed=3, workers=workers)
        init = first.state if method == "accelerated" else first.perm
        again = weight_matching(moved, b, method=method, seed=4, init=init, workers=workers)
        runs[workers] = (first, again)
    for one, many in zip(runs[1], runs[4]):
        assert permutation_equal(one.perm, many.perm)
        assert one.history == many.history  # bitwise: the same products, solves and refreshes
        assert (one.sweeps, one.solves, one.converged) == (many.sweeps, many.solves, many.converged)


def test_a_callable_solver_runs_one_at_a_time_unless_told_otherwise(monkeypatch):
    """Up to ``workers`` LAPs are in flight at once; a callable solver gets one at a time by
    default (it may not be thread-safe), and ``workers=1`` is serial for the built-ins too."""
    import threading
    import time

    torch.manual_seed(0)
    a, b = ResNet(20, width=1), ResNet(20, width=1)
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def slow(cost: np.ndarray, warm: LapSolution | None = None) -> LapSolution:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.002)
        with lock:
            state["now"] -= 1
        return sap_solver(cost, warm=warm)

    serial = weight_matching(a, b, method="accelerated", solver=slow)
    assert state["most"] == 1
    many = weight_matching(a, b, method="accelerated", solver=slow, workers=3)
    assert state["most"] == 3  # the stage's three block-internal groups at once
    assert permutation_equal(serial.perm, many.perm) and serial.history == many.history
    # matrices solved at once share the cache: a budget of cost entries bounds them too
    wm = importlib.import_module("lmc.permutation.weight_matching")  # the name is the function
    monkeypatch.setattr(wm, "CONCURRENT_LAP_CELLS", 15**2)  # below any group's 16 x 16
    state["most"] = 0
    capped = weight_matching(a, b, method="accelerated", solver=slow, workers=3)
    assert state["most"] == 1 and capped.history == serial.history
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        weight_matching(a, b, workers=0)


def test_warm_solver_gets_the_permutation_and_duals_of_the_last_solve():
    torch.manual_seed(0)
    a, b = MLP(20, 4, width=10, depth=2), MLP(20, 4, width=10, depth=2)
    warms = []

    def my_solver(cost: np.ndarray, warm: LapSolution | None = None) -> LapSolution:
        warms.append(warm)
        return sap_solver(cost, warm=warm)

    first = weight_matching(a, b, method="accelerated", solver=my_solver)
    assert warms[0] is None
    warms.clear()
    again = weight_matching(a, b, method="accelerated", solver=my_solver, init=first.state)
    assert all(w is not None and w.v is not None for w in warms)
    assert permutation_equal(again.perm, first.perm)


def test_nonfinite_cost_matrix_names_group_and_layer():
    """Finite float32 weights whose products overflow: the error names the group and layer."""
    a, b = MLP(20, 4, width=10, depth=2), MLP(20, 4, width=10, depth=2)
    sa = {k: v.clone() for k, v in a.state_dict().items()}
    sa["layers.0.weight"].fill_(3e38)
    for method in ("plain", "accelerated"):
        with pytest.raises(SpecError, match=r"group 'layers\.0.*layers\.0\.weight"):
            weight_matching(sa, b.state_dict(), spec_for(a), method=method)


def test_init_duals_of_the_wrong_length_or_dtype_are_rejected():
    torch.manual_seed(0)
    a, b = MLP(20, 4, width=10, depth=2), MLP(20, 4, width=10, depth=2)
    state = weight_matching(a, b, method="accelerated").state
    g = next(iter(state.duals))
    u, v = state.duals[g]
    short = MatchingState(state.perm, {**state.duals, g: (u[:-1], v)})
    with pytest.raises(SpecError, match=f"init.duals\\['{g}'\\].*length 10"):
        weight_matching(a, b, method="accelerated", init=short)
    ints = MatchingState(state.perm, {**state.duals, g: (u.astype(np.int64), v)})
    with pytest.raises(SpecError, match="float arrays"):
        weight_matching(a, b, method="accelerated", init=ints)


def test_max_sweeps_and_keys():
    torch.manual_seed(0)
    a, b = ResNet(20, width=0.5), ResNet(20, width=0.5)
    res = weight_matching(a, b, max_sweeps=1)
    assert res.sweeps == 1 and not res.converged and len(res.history) == 2
    weights = [k for k in a.state_dict() if k.endswith("weight")]
    only_w = weight_matching(a, b, keys=weights)
    assert only_w.converged


def test_input_errors_name_the_key():
    a, b = MLP(20, 4, width=10, depth=2), MLP(20, 4, width=12, depth=2)
    with pytest.raises(SpecError, match="layers.0.weight"):
        weight_matching(a, b)
    b = MLP(20, 4, width=10, depth=2)
    state = dict(b.state_dict())
    state["layers.1.bias"] = torch.full_like(state["layers.1.bias"], float("inf"))
    with pytest.raises(SpecError, match="layers.1.bias"):
        weight_matching(a.state_dict(), state, spec_for(a))
    with pytest.raises(ValueError, match="spec is required"):
        weight_matching(a.state_dict(), b.state_dict())
    state = dict(b.state_dict())
    state["layers.0.weight"] = state["layers.0.weight"].long()
    with pytest.raises(SpecError, match="layers.0.weight.*dtype"):
        weight_matching(a.state_dict(), state, spec_for(a))


@pytest.mark.parametrize("method", ["plain", "accelerated"])
def test_history_is_the_objective(method):
    torch.manual_seed(0)
    a, b = VGG(11, width=1 / 8, norm="batch"), VGG(11, width=1 / 8, norm="batch")
    spec, sa, sb = spec_for(a), a.state_dict(), b.state_dict()
    init = random_permutation(spec.sizes(sa), 3)

    def exact(perm):
        pb = apply_permutation(sb, spec, perm)
        return sum(
            float((sa[k].double() * pb[k].double()).sum())
            for k in sa
            if k in pb and sa[k].is_floating_point()
        )

    res = weight_matching(sa, sb, spec, method=method, init=init)
    assert res.history[0] == pytest.approx(exact(init), rel=1e-6)
    assert res.history[-1] == pytest.approx(exact(res.perm), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cost_matrices_reach_the_lap_exactly(dtype, device):
    """The LAP's inputs ``K`` on the host in their own dtype (bfloat16 widened to float32,
    exactly) and ``max |K|``, from any device (from a GPU through page-locked memory)."""
    from lmc.permutation._search import _to_host

    gen = torch.Generator().manual_seed(0)
    costs = [torch.randn(n, n, generator=gen).to(dtype) * 1e3 for n in (5, 64, 1, 0)]
    costs.append(torch.randn(3, 3, generator=gen, dtype=torch.float64))  # mixed dtypes
    hosts, scales = _to_host([c.to(device) for c in costs])
    for c, k, scale in zip(costs, hosts, scales):
        want = c.float() if c.dtype == torch.bfloat16 else c
        assert k.dtype == want.numpy().dtype and np.array_equal(k, want.numpy())
        assert scale == np.abs(c.double().numpy()).max(initial=0.0)
    assert _to_host([]) == ([], [])
