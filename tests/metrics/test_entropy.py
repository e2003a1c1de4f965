"""Known answers for the neuron-distribution entropy estimator (000 Def. 2.2, Rem. 2.3, App. B)."""

from __future__ import annotations

import math

import pytest
import torch

from lmc.metrics import (
    bin_width,
    column_entropies,
    gaussian_entropy,
    gaussian_layer_entropies,
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
# A bin-width error of 0.1 % (Δ·1.001, or 2**bits + 1 bins in place of 2**bits) moves the
# differential estimate by ln(1.001) ≈ 1.0e-3 nats; every tolerance below is well under that.
BIN_WIDTH_ERROR = math.log(1.001)


def _gaussian_reference(x: torch.Tensor, std: float, bits: int, value_range) -> tuple[float, float]:
    """What ``histogram_entropy(x, bits, value_range, differential=True)`` must return for
    samples ``x`` of N(0, std²), and the tolerance, from the estimator's bias and variance.

    With q the bin frequencies, P the bin probabilities and ĥ = −(1/N) Σ ln p(x_i) the closed
    form's Monte Carlo estimate on the *same* samples, the estimate Ĥ = H_Δ + ln Δ is

        Ĥ − ĥ = −KL(q ‖ P) + Σ_k q_k (mean of ln p(x_i) over bin k − ln(P_k / Δ)).

    ĥ carries the sampling error sd sqrt(Var ln p(X) / N) = sqrt(1 / (2N)) (7e-4 at N = 10⁶, too
    big to see a 1e-3 error), shared with Ĥ: comparing with ĥ cancels it. What is left:

    * 2N·KL(q ‖ P) is asymptotically χ²(K − 1) for K occupied bins: mean (K − 1) / (2N) (the
      Miller–Madow bias of the plug-in entropy), sd sqrt(2(K − 1)) / (2N);
    * within a bin ln p is linear to first order with slope s = −x / σ², so the second term has
      mean Δ² E[s²] / 24 = Δ² / (24σ²) (the O(Δ²) discretisation bias of H_Δ + ln Δ) and sd
      sqrt(E[s²] Δ² / (12N)) = Δ / (σ sqrt(12N)).

    The expectation is ĥ + Δ² / (24σ²) − (K − 1) / (2N). The leading-order Miller–Madow term
    misses the sparse tail bins (measured over 100 seeds: the estimate sits 1-2 sd below it), so
    the tolerance allows another (K − 1) / (2N) on top of 5 sd.
    """
    n = x.numel()
    delta = bin_width(bits, value_range)
    mc = 0.5 * math.log(2 * math.pi * std**2) + float(x.double().square().mean()) / (2 * std**2)
    k = torch.unique(torch.floor((x.double() - value_range[0]) / delta)).numel()
    sd = math.sqrt(2 * (k - 1) / (2 * n) ** 2 + (delta / std) ** 2 / (12 * n))
    want = mc + delta**2 / (24 * std**2) - (k - 1) / (2 * n)
    tol = (k - 1) / (2 * n) + 5 * sd
    assert tol < BIN_WIDTH_ERROR / 2  # the test can see a 0.1 % bin-width error
    # and ĥ itself is the closed form up to its sampling error
    assert mc == pytest.approx(gaussian_entropy(std), abs=5 * math.sqrt(1 / (2 * n)))
    return want, tol


@pytest.mark.parametrize(
    ("std", "value_range"), [(0.05, (-1.0, 1.0)), (1.0, (-8.0, 8.0)), (0.3, (-2.0, 2.0))]
)
def test_gaussian_samples_match_closed_form(std, value_range):
    x = torch.randn(N, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * std
    est = histogram_entropy(x, bits=10, value_range=value_range, differential=True)
    want, tol = _gaussian_reference(x, std, 10, value_range)
    assert est == pytest.approx(want, abs=tol)  # tol is 2e-4 to 4e-4 here


def _binned_uniform(low: float, high: float, bits: int, value_range) -> torch.Tensor:
    """Closed form of the bin probabilities of U(low, high) on the fixed bins: bin k holds
    |bin k ∩ [low, high)| / (high − low), the edge bins only a fraction of Δ; the bins with
    positive probability, in order."""
    lo, delta = value_range[0], bin_width(bits, value_range)
    first, last = math.floor((low - lo) / delta), math.ceil((high - lo) / delta)
    probs = []
    for b in range(first, last):
        a, c = max(lo + b * delta, low), min(lo + (b + 1) * delta, high)
        if c > a:
            probs.append((c - a) / (high - low))
    return torch.tensor(probs, dtype=torch.float64)


@pytest.mark.parametrize(
    ("low", "high", "value_range"), [(-0.3, 0.5, (-1.0, 1.0)), (2.0, 4.0, (0.0, 8.0))]
)
def test_uniform_samples_match_closed_form(low, high, value_range):
    x = low + (high - low) * torch.rand(
        N, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    est = histogram_entropy(x, bits=10, value_range=value_range, differential=True)
    # Exact H_Δ = −Σ P ln P of the K bins the interval covers (partly covered edge bins
    # included). Ĥ − H_Δ = −Σ (q − P) ln P − KL(q ‖ P): the first term has mean 0 and sd
    # sqrt(Var ln P / N) (nonzero only through the partly covered edge bins), the second mean
    # (K − 1) / (2N) and sd sqrt(2(K − 1)) / (2N) (χ²(K − 1); no sparse bins, so the
    # Miller–Madow term is accurate). Tolerance: 5 sd, 6e-5 to 1.2e-4 here.
    probs = _binned_uniform(low, high, 10, value_range)
    k, log_p = probs.numel(), probs.log()
    h_delta = float(-(probs * log_p).sum())
    var_log_p = float((probs * log_p.square()).sum()) - h_delta**2
    delta = bin_width(10, value_range)
    want = h_delta + math.log(delta) - (k - 1) / (2 * N)
    tol = 5 * math.sqrt(var_log_p / N + 2 * (k - 1) / (2 * N) ** 2)
    assert tol < BIN_WIDTH_ERROR / 2
    assert est == pytest.approx(want, abs=tol)
    # H_Δ + ln Δ is the differential entropy up to the edge bins' share (≤ 2Δ/(e(b − a)))
    assert h_delta + math.log(delta) == pytest.approx(
        uniform_entropy(low, high), abs=2 * delta / (math.e * (high - low))
    )


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
    # 784 * 512 = 401k N(0, σ²) elements: the same error budget as the closed-form tests
    want, tol = _gaussian_reference(w.detach().reshape(-1), scale * he_std(w), 10, (-1.0, 1.0))
    assert neuron_entropy(w, mode="pooled") == pytest.approx(want, abs=tol)
    # per-component marginals: 512 samples each, so the plug-in estimate is biased low
    marginal = neuron_entropy(w, mode="marginal")
    assert expected - 0.25 < marginal < expected


@pytest.mark.parametrize("scale", [0.1, 0.9])
def test_gaussian_layer_entropies_of_a_he_normal_net_are_the_closed_form(scale):
    """000 A.1.1: every layer of a c_d·σ_He net has ½ ln(2πe (c_d σ_He)²), σ_He of its fan-in;
    σ̂ of n elements is off by ~1/sqrt(2n) relatively, so H by ~1/sqrt(2n) nats."""
    torch.manual_seed(0)
    net = MLP(784, 10, width=256, depth=2, init="he_normal", init_scale=scale)
    got = gaussian_layer_entropies(net)
    assert list(got) == ["layers.0", "layers.1", "head"]
    for name, module in (
        ("layers.0", net.layers[0]),
        ("layers.1", net.layers[1]),
        ("head", net.head),
    ):
        n = module.weight.numel()
        want = gaussian_entropy(scale * he_std(module.weight))
        assert got[name] == pytest.approx(want, abs=5 / math.sqrt(2 * n))
    assert gaussian_layer_entropies(net, ["head"]) == {"head": got["head"]}


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
