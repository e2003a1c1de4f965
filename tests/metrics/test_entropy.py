"""Known answers for the neuron-distribution entropy estimator (000 Def. 2.2, Rem. 2.3, App. B)."""

from __future__ import annotations

import math

import pytest
import torch

from lmc.metrics import (
    bin_width,
    column_entropies,
    gaussian_entropy,
    histogram_entropy,
    layer_entropies,
    neuron_entropy,
    out_of_range_fraction,
    uniform_entropy,
)
from lmc.models import MLP, init_weights
from lmc.models.init import he_std
from lmc.pruning import prune_magnitude

N = 1_000_000


@pytest.mark.parametrize(
    ("std", "value_range"), [(0.05, (-1.0, 1.0)), (1.0, (-8.0, 8.0)), (0.3, (-2.0, 2.0))]
)
def test_gaussian_samples_match_closed_form(std, value_range):
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)) * std
    est = histogram_entropy(x, bits=10, value_range=value_range, differential=True)
    assert est == pytest.approx(gaussian_entropy(std), abs=0.02)


@pytest.mark.parametrize(
    ("low", "high", "value_range"), [(-0.3, 0.5, (-1.0, 1.0)), (2.0, 4.0, (0.0, 8.0))]
)
def test_uniform_samples_match_closed_form(low, high, value_range):
    x = low + (high - low) * torch.rand(N, generator=torch.Generator().manual_seed(1))
    est = histogram_entropy(x, bits=10, value_range=value_range, differential=True)
    assert est == pytest.approx(uniform_entropy(low, high), abs=0.02)


def test_bin_width_correction_is_ln_delta():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 0.1
    discrete = histogram_entropy(x, bits=8)
    assert histogram_entropy(x, bits=8, differential=True) == pytest.approx(
        discrete + math.log(bin_width(8, (-1.0, 1.0)))
    )
    assert bin_width(10, (-1.0, 1.0)) == 2 / 1024


def test_one_dimensional_neurons_give_the_exact_histogram_entropy():
    # 1-D neurons (the polynomial tasks' first layer): bins [0, .5) and [.5, 1] with 2 + 2 counts.
    w = torch.tensor([[0.1], [0.2], [0.6], [0.9]])
    assert neuron_entropy(w, bits=1, value_range=(0, 1), differential=False) == pytest.approx(
        math.log(2)
    )
    # counts 3, 1 of 4 samples
    w = torch.tensor([[0.1], [0.2], [0.3], [0.9]])
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    for mode in ("marginal", "pooled"):
        h = neuron_entropy(w, bits=1, value_range=(0, 1), differential=False, mode=mode)
        assert h == pytest.approx(expected)


def test_point_mass_has_zero_discrete_entropy_and_constant_columns_count_zero():
    assert histogram_entropy(torch.zeros(100)) == 0.0
    w = torch.randn(500, 3, generator=torch.Generator().manual_seed(3)) * 0.1
    w[:, 1] = 0.25
    h = column_entropies(w)
    assert h[1] == 0 and h[0] > 0 and h[2] > 0
    assert neuron_entropy(w, differential=False, mode="marginal") == pytest.approx(float(h.mean()))


def test_values_outside_the_range_are_clipped_into_edge_bins():
    x = torch.tensor([-5.0, -1.0, 0.999, 3.0])
    assert out_of_range_fraction(x) == 0.5
    # two bins: {-5, -1} and {0.999, 3} -> ln 2
    assert histogram_entropy(x, bits=1) == pytest.approx(math.log(2))


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_he_normal_init_layer_matches_gaussian_closed_form(scale):
    """The init-scale study (000 §4.1): a c_d·σ_He layer has H̃ ≈ ½ ln(2πe (c_d σ_He)²)."""
    torch.manual_seed(0)
    net = MLP(784, 10, width=512, depth=1, init="he_normal", init_scale=scale)
    w = net.layers[0].weight
    expected = gaussian_entropy(scale * he_std(w))
    assert neuron_entropy(w, mode="pooled") == pytest.approx(expected, abs=0.02)
    # per-component marginals: 512 samples each, so the plug-in estimate is biased low
    marginal = neuron_entropy(w, mode="marginal")
    assert expected - 0.25 < marginal < expected


def test_pruning_lowers_the_discrete_entropy():
    """000 Lemma 4.1: zeroing the smallest weights lowers H_Δ."""
    torch.manual_seed(0)
    net = MLP(20, 5, width=64, depth=2)
    before = layer_entropies(net, differential=False)
    prune_magnitude(net, 0.5)
    after = layer_entropies(net, differential=False)
    assert list(before) == ["layers.0", "layers.1", "head"]
    assert all(after[k] < before[k] for k in before)


def test_entropy_of_conv_neurons_uses_flattened_kernels():
    w = torch.randn(8, 3, 3, 3)
    assert neuron_entropy(w) == pytest.approx(neuron_entropy(w.reshape(8, 27)))


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="bits"):
        histogram_entropy(torch.zeros(3), bits=0)
    with pytest.raises(ValueError, match="value_range"):
        histogram_entropy(torch.zeros(3), value_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="mode"):
        neuron_entropy(torch.zeros(3, 3), mode="joint")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="std"):
        gaussian_entropy(0.0)
    with pytest.raises(KeyError, match="available"):
        layer_entropies(MLP(4, 2, width=4, depth=1), layers=["nope"])
    init_weights(MLP(4, 2, width=4, depth=1))
