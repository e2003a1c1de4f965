"""The batched device auction (issue 48 item 1): eps-optimal within Bertsekas' bound n * eps,
optimal on integer costs with eps < 1 / n, exact after the host kernel's warm finish, and
refusing what it cannot solve. Each test also runs on CUDA (``pytest -m gpu``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lmc.permutation.lap import LapInputError
from lmc.permutation.lap_device import auction, auction_solve


def _cost(c: np.ndarray, perm: np.ndarray) -> float:
    return float(c[np.arange(len(perm)), perm].sum())


def _optimum(c: np.ndarray) -> float:
    rows, cols = linear_sum_assignment(c)
    return float(c[rows, cols].sum())


@pytest.mark.parametrize("n", [2, 7, 64])
def test_the_auction_is_within_n_eps_of_the_optimum(n, device):
    """Flat costs (every entry in [0, 1e-2] above a shared offset, as trained VGGs' are) and
    spread ones, three problems at once: each assignment is a permutation whose cost is within
    n * eps of scipy's optimum, at a coarse and at the default last epsilon."""
    rng = np.random.default_rng(n)
    costs = np.stack(
        [rng.standard_normal((n, n)), -3 + 1e-2 * rng.random((n, n)), rng.random((n, n))]
    )
    for eps_end in (1e-2, None):
        result = auction(torch.tensor(costs, device=device), eps_end=eps_end)
        assert result.perm.device.type == torch.device(device).type
        for c, perm in zip(costs, result.perm.cpu().numpy()):
            assert sorted(perm) == list(range(n))
            gap = _cost(c, perm) - _optimum(c)
            assert -1e-9 <= gap <= n * result.eps + 1e-9


def test_integer_costs_with_eps_below_one_over_n_are_solved_exactly(device):
    rng = np.random.default_rng(1)
    n = 40
    costs = rng.integers(0, 1000, size=(4, n, n)).astype(np.float64)
    result = auction(torch.tensor(costs, device=device), eps_end=0.9 / n)
    for c, perm in zip(costs, result.perm.cpu().numpy()):
        assert _cost(c, perm) == _optimum(c)


def test_a_hidden_permutation_is_recovered(device):
    """Costs that are 0 on a random permutation and 1 elsewhere: the unique optimum is it."""
    gen = torch.Generator().manual_seed(0)
    truth = torch.stack([torch.randperm(50, generator=gen) for _ in range(3)])
    costs = torch.ones(3, 50, 50, dtype=torch.float64)
    costs.scatter_(2, truth.unsqueeze(2), 0.0)
    result = auction(costs.to(device))
    assert torch.equal(result.perm.cpu(), truth)


def test_the_host_finish_gives_the_exact_optimum_and_duals(device):
    """auction_solve: the assignments optimal to the last bit (the host kernel's warm finish),
    the duals feasible and tight on them (eq. 3-4 of 004 §2.4)."""
    rng = np.random.default_rng(2)
    costs = rng.standard_normal((3, 30, 30))
    for c, sol in zip(costs, auction_solve(torch.tensor(costs, device=device))):
        assert _cost(c, sol.perm) == pytest.approx(_optimum(c), abs=1e-12)
        reduced = c - sol.u[:, None] - sol.v[None, :]
        assert reduced.min() >= -1e-9
        np.testing.assert_allclose(reduced[np.arange(30), sol.perm], 0.0, atol=1e-9)


def test_constant_and_single_column_costs_need_no_bids(device):
    for costs in (torch.zeros(2, 5, 5), torch.ones(1, 1, 1)):
        result = auction(costs.to(device))
        assert result.bids == 0 and sorted(result.perm[0].tolist()) == list(range(costs.shape[1]))


@pytest.mark.parametrize(
    ("costs", "match"),
    [
        (torch.zeros(3, 4), "square costs"),
        (torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), "NaN/inf"),
    ],
)
def test_what_the_auction_cannot_solve_is_refused(costs, match):
    with pytest.raises(LapInputError, match=match):
        auction(costs)


def test_a_step_bound_reached_says_what_to_do():
    costs = torch.tensor(np.random.default_rng(3).standard_normal((1, 30, 30)))
    with pytest.raises(RuntimeError, match="raise max_steps or solve on the host"):
        auction(costs, max_steps=3)
