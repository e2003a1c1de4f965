"""Real-data check (slow): MLPs trained briefly on MNIST from ``$LMC_DATA_DIR/MNIST/raw``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmc.models import MLP
from lmc.permutation import (
    apply_permutation,
    correlation_alignment,
    spec_for,
    weight_matching,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mnist() -> tuple[torch.Tensor, torch.Tensor]:
    from benchmarks.weight_matching import mnist_tensors

    train = mnist_tensors("train")
    if train is None:
        pytest.skip("MNIST idx files not found under $LMC_DATA_DIR/MNIST/raw")
    return train


def _train(seed: int, x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    torch.manual_seed(seed)
    model = MLP(784, 10, width=128, depth=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for idx in torch.randperm(len(x))[:20000].split(128):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_trained_pair_plain_equals_accelerated_and_alignment_helps(mnist):
    x, y = mnist
    a, b = _train(0, x, y), _train(1, x, y)
    plain = weight_matching(a, b, method="plain")
    fast = weight_matching(a, b, method="accelerated")
    assert fast.objective == pytest.approx(plain.objective, rel=1e-6)
    assert plain.history[-1] > plain.history[0]
    corr = correlation_alignment(a, b, [x[i : i + 500] for i in range(0, 2000, 500)])
    assert all(corr.similarity[g] > corr.similarity_before[g] for g in corr.perm)
    # the aligned midpoint is far better than the naive one
    spec = spec_for(a)
    sa, sb = a.state_dict(), apply_permutation(b.state_dict(), spec, plain.perm)
    mid, naive = MLP(784, 10, width=128, depth=3), MLP(784, 10, width=128, depth=3)
    mid.load_state_dict({k: (sa[k] + sb[k]) / 2 for k in sa})
    naive.load_state_dict({k: (sa[k] + b.state_dict()[k]) / 2 for k in sa})
    with torch.no_grad():
        loss = {m: nn.functional.cross_entropy(m(x[:5000]), y[:5000]).item() for m in (mid, naive)}
    assert loss[mid] < loss[naive]
