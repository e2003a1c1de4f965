"""Known answers for Hutchinson sharpness tr(H ⊙ θθᵀ) and tr(H) (004 §6.2, eq. 6, App. D.2)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from lmc.metrics import (
    exact_hessian_trace,
    hessian_matrix,
    hutchinson_trace,
    hutchinson_traces,
    rademacher_probe,
)
from lmc.models import MLP
from lmc.pruning import make_permanent, prune_magnitude


class Quadratic(nn.Module):
    """A model whose 'output' is its parameter vector, for losses ½ θᵀAθ with Hessian A."""

    def __init__(self, theta: Tensor) -> None:
        super().__init__()
        self.theta = nn.Parameter(theta.clone())

    def forward(self, x: Tensor) -> Tensor:
        return self.theta


def _quadratic(dim: int = 30, seed: int = 0) -> tuple[Quadratic, Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    a = (b + b.T) / 2 + dim * torch.eye(dim, dtype=torch.float64)  # symmetric, not diagonal
    return Quadratic(torch.randn(dim, generator=g, dtype=torch.float64)), a


def _data(n: int = 24, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (n,), generator=g)
    return [(x[:10], y[:10]), (x[10:], y[10:])]  # unequal batches: size-weighted mean loss


def _tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return MLP(3, 2, width=5, depth=2, activation="tanh").double()


@pytest.mark.parametrize("weighted", [True, False])
def test_quadratic_with_known_hessian_within_three_standard_errors(weighted):
    model, a = _quadratic()
    theta = model.theta.detach()
    exact = float((a.diagonal() * theta**2).sum()) if weighted else float(a.trace())
    est = hutchinson_trace(
        model, lambda out, _: 0.5 * out @ a @ out, [(torch.zeros(1), None)], 200, 0, weighted
    )
    assert est.num_probes == 200 and est.stderr > 0
    assert abs(est.mean - exact) <= 3 * est.stderr


def test_each_probe_equals_the_exact_quadratic_form_on_a_tiny_mlp():
    model, batches = _tiny_mlp(), _data()
    loss = nn.functional.cross_entropy
    hess, theta = hessian_matrix(model, loss, batches)
    est = hutchinson_traces(model, loss, batches, num_probes=8, seed=3)
    gen = torch.Generator().manual_seed(3)
    for j in range(8):
        z = rademacher_probe(theta.numel(), gen).double()
        v = z * theta
        assert est["weighted"].values[j] == pytest.approx(float(v @ hess @ v), rel=1e-9, abs=1e-12)
        assert est["plain"].values[j] == pytest.approx(float(z @ hess @ z), rel=1e-9, abs=1e-12)


def test_many_probes_match_the_exact_hessian_trace():
    model, batches = _tiny_mlp(), _data()
    loss = nn.functional.cross_entropy
    est = hutchinson_traces(model, loss, batches, num_probes=100, seed=1)
    for kind, weighted in (("weighted", True), ("plain", False)):
        exact = exact_hessian_trace(model, loss, batches, weighted)
        assert abs(est[kind].mean - exact) <= 3 * est[kind].stderr


def test_pruned_model_has_the_weighted_trace_of_its_permanent_copy():
    model, batches = _tiny_mlp(), _data()
    loss = nn.functional.cross_entropy
    prune_magnitude(model, 0.5)
    pruned = exact_hessian_trace(model, loss, batches)
    assert exact_hessian_trace(make_permanent(model), loss, batches) == pytest.approx(pruned)


def test_mode_is_restored_and_single_probe_has_no_standard_error():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model.train()
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    est = hutchinson_trace(model, nn.functional.cross_entropy, [(x, y)], num_probes=1)
    assert model.training and math.isnan(est.stderr)
    with torch.no_grad():  # works from evaluation contexts too
        hutchinson_trace(model, nn.functional.cross_entropy, [(x, y)], num_probes=2)


def test_invalid_arguments_raise():
    model, batches = _tiny_mlp(), _data()
    with pytest.raises(ValueError, match="num_probes"):
        hutchinson_traces(model, nn.functional.cross_entropy, batches, num_probes=0)
    with pytest.raises(ValueError, match="kinds"):
        hutchinson_traces(model, nn.functional.cross_entropy, batches, kinds=("diag",))
    with pytest.raises(ValueError, match="batch"):
        hutchinson_traces(model, nn.functional.cross_entropy, [])
    with pytest.raises(ValueError, match="max_params"):
        hessian_matrix(MLP(100, 10, width=100, depth=1), nn.functional.cross_entropy, batches)
