"""STE / STE-MM core: mixing weights, straight-through gradients, known answers, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

from lmc.interpolation.states import weighted_average
from lmc.merging import (
    STEMM,
    ModelBank,
    mix_states,
    sample_mixing_weights,
    ste,
    ste_mm,
    straight_through,
)
from lmc.models import MLP, ResNet
from lmc.permutation import (
    SpecError,
    apply_permutation,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
)


def _permuted_copies(net, n, seed=0):
    spec = spec_for(net)
    base = {k: v.clone() for k, v in net.state_dict().items()}
    sizes = spec.sizes(base)
    perms = [random_permutation(sizes, seed + i) for i in range(1, n)]
    return base, [base] + [apply_permutation(base, spec, p) for p in perms], perms


def _batches(in_shape, classes, n_batches=3, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, *in_shape, generator=g), torch.randint(0, classes, (size,), generator=g))
        for _ in range(n_batches)
    ]


def _assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("mixing", ["dirichlet", "uniform", "midpoint"])
def test_mixing_weights_lie_on_the_simplex(mixing):
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5):
        w = sample_mixing_weights(n, mixing, g)
        assert w.shape == (n,) and bool((w > 0).all())
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-6)
    if mixing == "midpoint":
        assert torch.equal(sample_mixing_weights(4, mixing), torch.full((4,), 0.25))


def test_dirichlet_is_uniform_on_the_simplex():
    g = torch.Generator().manual_seed(1)
    first = torch.stack([sample_mixing_weights(2, "dirichlet", g)[0] for _ in range(4000)])
    assert float(first.mean()) == pytest.approx(0.5, abs=0.02)  # U(0, 1): mean 1/2
    assert float(first.var()) == pytest.approx(1 / 12, abs=0.006)  # and variance 1/12
    three = torch.stack([sample_mixing_weights(3, "dirichlet", g) for _ in range(4000)])
    assert three.mean(0).tolist() == pytest.approx([1 / 3] * 3, abs=0.02)
    assert float(three[:, 0].var()) == pytest.approx(1 / 18, abs=0.005)  # Beta(1, 2)
    with pytest.raises(ValueError, match="mixing must be"):
        sample_mixing_weights(3, "gauss")  # type: ignore[arg-type]


def test_straight_through_forward_value_backward_proxy():
    proxy = torch.randn(5, requires_grad=True)
    value = torch.randn(5)
    out = straight_through(proxy, value)
    torch.testing.assert_close(out, value)
    (out * torch.arange(5.0)).sum().backward()
    torch.testing.assert_close(proxy.grad, torch.arange(5.0))


def test_mix_states_clones_integer_buffers():
    a = {"w": torch.ones(2), "n": torch.tensor(3)}
    b = {"w": torch.zeros(2), "n": torch.tensor(7)}
    out = mix_states([a, b], [0.25, 0.75])
    torch.testing.assert_close(out["w"], torch.full((2,), 0.25))
    out["n"] += 1
    assert int(a["n"]) == 3


def test_proxy_gradient_is_lambda_times_the_merged_gradient():
    torch.manual_seed(0)
    net = MLP(12, 4, width=8, depth=2)
    _, models, _ = _permuted_copies(net, 3)
    models[1] = {k: v + 0.05 * torch.randn_like(v) for k, v in models[1].items()}
    search = STEMM(net, models)
    search.match()
    (x, y) = _batches((12,), 4, 1)[0]
    w = [0.2, 0.3, 0.5]
    search.loss(x, y, w).backward()
    merged = {
        k: v.detach().clone().requires_grad_(True)
        for k, v in mix_states(search.permuted_states(), w).items()
    }
    out = functional_call(net.train(), merged, (x,))
    torch.nn.functional.cross_entropy(out, y).backward()
    for j, i in enumerate(search.others):
        proxy = search.proxies[j].as_dict()
        for k in search.param_keys:
            torch.testing.assert_close(proxy[k].grad, w[i] * merged[k].grad, msg=k)


def _on(device, perms):
    """Whether every permutation of every model is on ``device`` (a type: "cpu", "cuda")."""
    return all(p.device.type == device for perm in perms for p in perm.values())


@pytest.mark.parametrize("method", ["accelerated", "plain"])
def test_stemm_recovers_permuted_copies(method, device):
    torch.manual_seed(0)
    net = MLP(12, 4, width=10, depth=3).to(device)  # the models on the device; batches moved
    base, models, perms = _permuted_copies(net, 4)
    result = ste_mm(net, models, _batches((12,), 4), epochs=2, method=method)
    assert _on(device, result.perms)  # the reference's identity included
    assert all(t.device.type == device for s in result.aligned for t in s.values())
    for aligned in result.aligned:
        _assert_states_equal(aligned, base)  # exact: a permutation of an exact copy
    for p, found in zip(perms, result.perms[1:]):
        assert permutation_equal(found, invert_permutation(p))
    _assert_states_equal(weighted_average(result.aligned), weighted_average([base] * 4))
    assert len(result.losses) == 6 and len(result.epoch_seconds) == 2


def test_stemm_with_batchnorm_recovers_and_leaves_models_untouched(device):
    torch.manual_seed(0)
    net = ResNet(20, width=0.25, norm="batch", init="he_normal")
    with torch.no_grad():  # non-trivial running statistics
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    net.to(device)  # drawn on the CPU (the same models on every device), run on the device
    base, models, _ = _permuted_copies(net, 3, seed=5)
    frozen = [{k: v.clone() for k, v in m.items()} for m in models]
    result = ste_mm(net, models, _batches((3, 8, 8), 10, 2, 8), epochs=1, mixing="uniform")
    for m, f in zip(models, frozen):
        _assert_states_equal(m, f)
    assert _on(device, result.perms)
    for aligned in result.aligned:
        assert all(t.device.type == device for t in aligned.values())
        _assert_states_equal(aligned, base)


def test_ste_two_models_recovers_and_keeps_best():
    torch.manual_seed(0)
    net = MLP(12, 4, width=10, depth=2)
    base, (a, b), (p,) = _permuted_copies(net, 2, seed=3)
    perm, matched, result = ste(net, a, b, _batches((12,), 4), epochs=2)
    _assert_states_equal(matched, base)
    assert permutation_equal(perm, invert_permutation(p))
    assert len(result.losses) == 6


def test_keep_best_returns_the_permutations_of_the_lowest_loss():
    net = MLP(12, 4, width=6, depth=2)
    _, models, _ = _permuted_copies(net, 2)
    search = STEMM(net, models, keep_best=True)
    sizes = search.spec.sizes(models[0])
    first, second = random_permutation(sizes, 11), random_permutation(sizes, 12)
    search.perms[1] = first
    search.observe(0.5)
    search.perms[1] = second
    search.observe(0.7)  # worse: not kept
    assert permutation_equal(search.best_perms[1], first)
    search.match = lambda: []  # the final matching would land elsewhere
    assert permutation_equal(search.finalize()[1], first)


def test_shared_bank_and_prefixes():
    net = MLP(12, 4, width=6, depth=2)
    _, models, _ = _permuted_copies(net, 4)
    bank = ModelBank(models)
    two, four = STEMM(net, bank, num_models=2), STEMM(net, bank, num_models=4)
    assert two.n == 2 and four.n == 4 and len(list(two.parameters())) == 6  # one proxy
    assert not list(two.buffers())  # the bank belongs to its owner
    with pytest.raises(ValueError, match="bank holds 4"):
        STEMM(net, bank, num_models=5)


def test_errors_before_work():
    net = MLP(12, 4, width=6, depth=2)
    _, models, _ = _permuted_copies(net, 3)
    with pytest.raises(ValueError, match="at least 2 models"):
        STEMM(net, models[:1])
    wide = MLP(12, 4, width=7, depth=2).state_dict()
    with pytest.raises(ValueError, match="model 2.*layers.0.weight|layers.0.weight.*model 2"):
        STEMM(net, [models[0], models[1], wide])
    other_spec = spec_for(MLP(12, 4, width=6, depth=3))
    with pytest.raises(SpecError, match="does not fit the permutation spec"):
        STEMM(net, models, other_spec)
    with pytest.raises(ValueError, match="reference=3"):
        STEMM(net, models, reference=3)
    with pytest.raises(ValueError, match="method must be"):
        STEMM(net, models, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixing must be"):
        STEMM(net, models, mixing="beta")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["accelerated", "plain"])
def test_stemm_resumed_from_its_state_dict_continues_exactly(method, tmp_path):
    """Proxies, optimizer and the search's extra state (permutations, duals, RNGs) are enough
    to continue bit for bit, through a weights_only checkpoint file."""
    torch.manual_seed(0)
    models = [MLP(12, 4, width=10, depth=2).state_dict() for _ in range(3)]
    batches = _batches((12,), 4, n_batches=6)
    net = MLP(12, 4, width=10, depth=2)

    def start():
        search = STEMM(net, models, method=method, keep_best=True, seed=3)
        return search, torch.optim.Adam(search.proxy_parameters(), lr=1e-2)

    def steps(search, opt, part):
        for x, y in part:
            search.match()
            value = search.loss(x, y, search.sample_weights().tolist())
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            search.observe(float(value))

    whole, opt = start()
    steps(whole, opt, batches)
    first, opt = start()
    steps(first, opt, batches[:3])
    torch.save({"search": first.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed, opt = start()
    resumed.load_state_dict(saved["search"])
    opt.load_state_dict(saved["opt"])
    steps(resumed, opt, batches[3:])

    for a, b in zip(whole.perms, resumed.perms):
        assert permutation_equal(a, b)
    for a, b in zip(whole.matching, resumed.matching):
        assert (a is None) == (b is None)  # the reference is never matched
        if a is not None and method == "accelerated":
            assert a.duals and all(np.array_equal(a.duals[g][1], b.duals[g][1]) for g in a.duals)
    for a, b in zip(whole.proxies, resumed.proxies):
        _assert_states_equal(a.as_dict(), b.as_dict())
    assert whole.best_loss == resumed.best_loss
    assert whole.wm_stats["calls"] == resumed.wm_stats["calls"] == 12
    assert torch.equal(whole.sample_weights(), resumed.sample_weights())


@pytest.mark.parametrize("cache_source", [True, False])
def test_stemm_keeps_the_prepared_models_only_when_asked(cache_source):
    torch.manual_seed(0)
    models = [MLP(12, 4, width=10, depth=2).state_dict() for _ in range(3)]
    search = STEMM(MLP(12, 4, width=10, depth=2), models, cache_source=cache_source)
    search.match()
    kept = [m.cache is not None for m in search.matching if m is not None]
    assert kept == [cache_source] * 2
