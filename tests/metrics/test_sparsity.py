"""Known answers for the PQ index (003 Def. 7)."""

from __future__ import annotations

import math

import pytest
import torch

from lmc.metrics import layer_pq_indices, neuron_norms, pq_index
from lmc.models import MLP


@pytest.mark.parametrize(("p", "q"), [(1.0, 2.0), (0.5, 1.0), (1.0, 3.0)])
@pytest.mark.parametrize("d", [1, 7, 100])
def test_one_hot_and_constant_vectors(p, q, d):
    one_hot = torch.zeros(d)
    one_hot[d // 2] = -3.0
    assert pq_index(one_hot, p, q) == pytest.approx(1 - d ** (1 / q - 1 / p), abs=1e-12)
    assert pq_index(torch.full((d,), 0.7), p, q) == pytest.approx(0.0, abs=1e-12)


def test_scale_invariant_and_in_bounds():
    w = torch.randn(50, 20, generator=torch.Generator().manual_seed(0))
    value = pq_index(w)
    assert 0 < value < 1 - (1000 ** (-0.5))
    assert pq_index(1e-30 * w) == pytest.approx(value)
    assert pq_index(1e20 * w) == pytest.approx(value)


def test_zero_rows_are_counted_in_the_per_neuron_vector():
    w = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    norms = neuron_norms(w)
    assert norms.tolist() == [5.0, 0.0]
    assert pq_index(norms) == pytest.approx(1 - 2 ** (-0.5))
    assert math.isnan(pq_index(torch.zeros(4)))


def test_layer_pq_indices_flattened_and_per_neuron():
    net = MLP(6, 3, width=4, depth=1)
    with torch.no_grad():
        net.layers[0].weight.zero_()
        net.layers[0].weight[0, 0] = 1.0  # one-hot matrix, one non-zero neuron of four
    pq = layer_pq_indices(net)
    assert list(pq) == ["layers.0", "head"]
    flat, neuron = pq["layers.0"]
    assert flat == pytest.approx(1 - 24 ** (-0.5))
    assert neuron == pytest.approx(1 - 4 ** (-0.5))


def test_invalid_orders_raise():
    with pytest.raises(ValueError, match="0 < p < q"):
        pq_index(torch.ones(3), p=2.0, q=1.0)
