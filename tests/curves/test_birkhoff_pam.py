"""Known answers for PAM's permutation pieces (002 App. E.2, E.4)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import mse_loss

from lmc.curves import (
    Curve,
    PAMOptions,
    birkhoff_decomposition,
    curve_objective,
    pam_candidates,
    permutation_matrices,
    permutation_matrix,
    project_doubly_stochastic,
    round_pam,
    round_to_permutation,
    sample_permutations,
    soft_permute,
    t_grid,
)
from lmc.models import MLP, VGG, ResNet
from lmc.permutation import (
    apply_permutation,
    identity_permutation,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
)
from tests.curves.helpers import assert_close


def _doubly_stochastic(d: torch.Tensor, atol: float) -> bool:
    ones = torch.ones(d.shape[0], dtype=d.dtype)
    return bool(
        (d >= 0).all()
        and torch.allclose(d.sum(0), ones, atol=atol)
        and torch.allclose(d.sum(1), ones, atol=atol)
    )


@pytest.mark.parametrize("method", ["alternating", "sinkhorn"])
@pytest.mark.parametrize("n", [1, 5, 32])
def test_projection_returns_doubly_stochastic_matrices(method, n):
    g = torch.Generator().manual_seed(n)
    for x in (torch.rand(n, n, generator=g), torch.randn(n, n, generator=g) * 3):
        d = project_doubly_stochastic(x.double(), iters=500, method=method)
        assert _doubly_stochastic(d, atol=1e-6)


def test_projection_of_a_perturbed_permutation_stays_close_and_fixes_the_polytope():
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    p = permutation_matrix(perm, torch.float64)
    assert torch.equal(project_doubly_stochastic(p, 20), p)  # already doubly stochastic
    noisy = p + 0.01 * torch.randn(16, 16, generator=torch.Generator().manual_seed(1)).double()
    d = project_doubly_stochastic(noisy, 20)  # 002 E.2's 20 rounds: close to the polytope
    assert _doubly_stochastic(d, atol=5e-3)
    assert _doubly_stochastic(project_doubly_stochastic(noisy, 200), atol=1e-6)
    assert torch.equal(round_to_permutation(d), perm)


def test_rounding_a_permutation_matrix_returns_it():
    for seed in range(5):
        perm = torch.randperm(12, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(round_to_permutation(permutation_matrix(perm)), perm)
        [(alpha, first)] = birkhoff_decomposition(permutation_matrix(perm))
        assert alpha == pytest.approx(1.0) and torch.equal(first, perm)


def test_bvn_of_a_convex_combination_of_permutations_recovers_them():
    n, g = 10, torch.Generator().manual_seed(0)
    q, r = torch.randperm(n, generator=g), torch.randperm(n, generator=g)
    # pairwise disjoint permutations (conjugated cyclic shifts): the decomposition is unique
    perms = [q[(torch.argsort(r) + k) % n] for k in range(3)]
    for i in range(3):
        for j in range(i):
            assert not (perms[i] == perms[j]).any()
    alphas = [0.5, 0.3, 0.2]
    d = sum(a * permutation_matrix(p, torch.float64) for a, p in zip(alphas, perms))
    terms = birkhoff_decomposition(d, max_terms=10)
    assert [a for a, _ in terms] == pytest.approx(alphas)
    assert all(torch.equal(p, want) for (_, p), want in zip(terms, perms))
    # any convex combination: the greedy terms rebuild the matrix
    rand = [torch.randperm(n, generator=g) for _ in range(4)]
    d = sum(a * permutation_matrix(p, torch.float64) for a, p in zip([0.4, 0.3, 0.2, 0.1], rand))
    terms = birkhoff_decomposition(d, max_terms=50)
    rebuilt = sum(a * permutation_matrix(p, torch.float64) for a, p in terms)
    assert_close(rebuilt, d)
    assert torch.equal(terms[0][1], round_to_permutation(d))


def test_sampling_follows_the_bvn_coefficients():
    terms = [(0.75, torch.tensor([0, 1, 2])), (0.25, torch.tensor([2, 0, 1]))]
    draws = sample_permutations(terms, 4000, torch.Generator().manual_seed(0))
    share = sum(bool(torch.equal(p, terms[0][1])) for p in draws) / len(draws)
    assert share == pytest.approx(0.75, abs=0.03)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MLP(20, 3, width=8, depth=2),
        lambda: VGG(11, 0.0625, in_channels=1),
        lambda: ResNet(8, 0.25),
    ],
)
def test_soft_permute_with_permutation_matrices_is_apply_permutation(make):
    net = make()
    spec = spec_for(net)
    state = net.state_dict()
    perm = random_permutation(spec.sizes(state), 0)
    keys = [k for k, _ in net.named_parameters()]
    soft = soft_permute(state, spec, permutation_matrices(perm), keys)
    hard = apply_permutation(state, spec, perm)
    for k in keys:
        assert_close(soft[k], hard[k])
    d = {g: m.clone().requires_grad_(True) for g, m in permutation_matrices(perm).items()}
    sum(v.square().sum() for v in soft_permute(state, spec, d, keys).values()).backward()
    assert all(m.grad is not None for m in d.values())


def test_candidates_and_rounding_never_increase_the_objective():
    prev = {"a": torch.arange(6), "b": torch.arange(4)}
    mats = permutation_matrices(prev)
    assert len(pam_candidates(mats, prev)) == 1  # nothing moved: only P^k
    target = {"a": torch.tensor([1, 0, 2, 3, 4, 5]), "b": torch.arange(4)}
    soft = {g: 0.4 * m + 0.6 * permutation_matrix(target[g]) for g, m in mats.items()}
    cands = pam_candidates(soft, prev, num_samples=32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cands[0]["a"], prev["a"]) and torch.equal(cands[1]["a"], target["a"])
    keys = {tuple(c["a"].tolist()) for c in cands}
    assert len(keys) == len(cands) == 2  # duplicates removed

    def distance_to(goal):
        return lambda p: float(sum((p[g] != goal[g]).sum() for g in p))

    won = round_pam(soft, prev, distance_to(target), generator=torch.Generator().manual_seed(0))
    assert won.chosen == 1 and torch.equal(won.perm["a"], target["a"])
    kept = round_pam(soft, prev, distance_to(prev))
    assert kept.chosen == 0 and min(kept.scores) == kept.scores[0] == 0.0


@pytest.mark.parametrize("depth", [1, 2])
def test_pam_permutation_step_from_the_identity_recovers_a_permuted_copy(depth):
    """Known answer for PAM's permutation step (002 App. E.2, E.4) on ``theta_2 = pi(theta_1)``.

    The pieces run as :class:`~lmc.tasks.PAMTask` chains them (projected SGD on one relaxed
    ``D_l`` per group from the identity, ``D theta_2`` by :func:`soft_permute`, projection after
    every step, then :func:`round_pam`), on the curve objective ``E_t L(w(t))`` with offsets zero
    for the loss ``L(w) = |w - theta_1|^2``: it is 0 (up to rounding) at the alignment
    ``P theta_2 = theta_1`` and, for one group, convex in ``D``, so projected gradient must get
    there. The rounding is then scored by the task's own :func:`curve_objective` (outputs
    regressed on ``theta_1``'s, again 0 only at the alignment) and must land on ``pi^-1``.
    """
    torch.manual_seed(0)
    net = MLP(4, 3, width=8, depth=depth)
    spec = spec_for(net)
    theta1 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    sizes = spec.sizes(theta1)
    pi = random_permutation(sizes, 1)
    theta2 = apply_permutation(theta1, spec, pi)
    want = invert_permutation(pi)
    assert not permutation_equal(want, identity_permutation(sizes))  # a real task
    curve = Curve.from_module(net, theta1, theta2)  # PAM's start: the straight line
    names = curve.names
    opts = PAMOptions(perm_lr=0.5)
    ts = t_grid(opts.select_ts + 2)[1:-1]  # the task's interior scoring ts

    def weight_objective(end: torch.Tensor) -> torch.Tensor:
        return torch.stack(
            [(curve.point_flat(t, end=end) - curve.start).square().sum() for t in ts]
        ).mean()

    start = identity_permutation(sizes)
    mats = {g: m.requires_grad_(True) for g, m in permutation_matrices(start).items()}
    for _ in range(60):
        soft = soft_permute(theta2, spec, mats, names)
        loss = weight_objective(torch.cat([soft[n].reshape(-1) for n in names]))
        grads = torch.autograd.grad(loss, list(mats.values()))
        with torch.no_grad():  # the task's step: plain SGD (torch.optim.SGD, no momentum) ...
            for d, grad in zip(mats.values(), grads):
                d -= opts.perm_lr * grad  # ... then back onto the Birkhoff polytope (E.2)
                d.copy_(project_doubly_stochastic(d, opts.projection_iters, opts.projection))
    relaxed = {g: d.detach() for g, d in mats.items()}
    # the relaxed solution is at the alignment: its Hungarian projection (eq. 52) is pi^-1
    assert all(torch.equal(round_to_permutation(relaxed[g]), want[g]) for g in want)

    def end_of(perm):
        return curve.flatten(apply_permutation(theta2, spec, perm))

    @torch.no_grad()
    def score(perm):
        return float(weight_objective(end_of(perm)))

    gen = torch.Generator().manual_seed(opts.seed)
    won = round_pam(relaxed, start, score, opts.bvn_samples, opts.bvn_terms, gen)
    assert permutation_equal(won.perm, want), (won.perm, want)
    assert won.scores[won.chosen] < 1e-12 < won.scores[0]  # the identity scored worse

    # the same rounding scored by the curve objective the task uses
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        batches = [(x, net(x))]

    def task_objective(perm):
        return curve_objective(net, curve, batches, ts, end=end_of(perm), loss_fn=mse_loss)

    gen = torch.Generator().manual_seed(opts.seed)
    won = round_pam(relaxed, start, task_objective, opts.bvn_samples, opts.bvn_terms, gen)
    assert permutation_equal(won.perm, want)
    assert won.scores[won.chosen] == task_objective(want) < 1e-12 < won.scores[0]

    # where the Hungarian projection is wrong, a permutation sampled from the BvN terms (E.4)
    # is pi^-1 and the rounding finds it: D = 0.55 P_wrong + 0.45 P_want per group
    wrong = {g: p.roll(1) for g, p in want.items()}
    assert not permutation_equal(wrong, start)
    mixed = {
        g: 0.55 * permutation_matrix(wrong[g]) + 0.45 * permutation_matrix(want[g]) for g in want
    }
    gen = torch.Generator().manual_seed(opts.seed)
    won = round_pam(mixed, start, task_objective, opts.bvn_samples, opts.bvn_terms, gen)
    assert won.chosen >= 2 and permutation_equal(won.perm, want)


def test_rounding_with_no_bvn_samples_scores_the_previous_and_hungarian_permutations():
    prev = {"a": torch.arange(4)}
    target = {"a": torch.tensor([1, 0, 3, 2])}
    soft = {"a": 0.4 * permutation_matrix(prev["a"]) + 0.6 * permutation_matrix(target["a"])}
    won = round_pam(soft, prev, lambda p: float((p["a"] != target["a"]).sum()), num_samples=0)
    assert won.chosen == 1 and len(won.scores) == 2
