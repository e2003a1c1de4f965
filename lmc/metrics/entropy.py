"""Neuron-distribution entropy (000 Def. 2.2, Remark 2.3, App. B) and closed forms.

A layer's neurons are treated as samples of one distribution P: neuron ``i`` is row ``i`` of
the weight matrix (for a convolution, output channel ``i`` flattened over input channels and
kernel), a vector of dimension d = fan-in. Biases are not part of a neuron here, so the first
layer of the 1-D polynomial tasks (000 §4.2) has 1-D neurons.

**Discretisation (Remark 2.3, App. B).** Each 1-D component is binned into ``2**bits`` equal
intervals over a *fixed* ``value_range`` (default ``(-1, 1)`` with ``bits=10``, bin width
Δ = 2/1024 ≈ 0.00195), the same for every layer, epoch and model so values are comparable.
Values outside the range are clipped into the first/last bin; keep the range wide enough (see
:func:`out_of_range_fraction`). The discrete entropy of the bin frequencies is H_Δ (nats).

**Bin-width correction.** For a smooth density, H_Δ ≈ H − ln Δ per component, i.e. the
differential entropy is H ≈ H_Δ + ln Δ (000 eq. 8 prints the sign of ln Δ flipped, and Remark
2.3 garbles the d-dimensional form H_Δ = H − d ln Δ). With ``differential=True`` the functions
return H_Δ + ln Δ, comparable with closed forms such as :func:`gaussian_entropy`; with
``differential=False`` they return the paper's discrete H_Δ, which stays finite for pruned
(point-mass) weights. Both differ by the constant ln Δ, so orderings agree.

**Per-element average H̃ = H / d.** A joint histogram in d dimensions cannot be filled by a few
hundred neurons, so H̃ is estimated from 1-D components. ``mode="pooled"`` (default) histograms
all n·d elements of the layer together: the entropy of one element when the elements are
i.i.d., which is how 000 A.1.1 computes H̃ ("the average entropy of a neuron is the entropy of
its element"). ``mode="marginal"`` averages over the d components the entropy of that component
across the n neurons: H / d when the components are independent (an upper bound otherwise),
without assuming they are identically distributed, but each plug-in estimate uses only n
samples and is biased low by about (K − 1) / (2n) nats for K occupied bins (≈ 0.15 nats for
n = 512 neurons of He-normal std 0.05 at the default bins). For d = 1 both modes are the exact
histogram entropy of the neurons.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch
from torch import Tensor, nn

from lmc.metrics.layers import effective_weight, weight_layers

EntropyMode = Literal["marginal", "pooled"]
DEFAULT_BITS = 10
DEFAULT_RANGE = (-1.0, 1.0)


def gaussian_entropy(std: float) -> float:
    """Differential entropy ½ ln(2πe σ²) of N(0, σ²) in nats (000 §4.1, A.1.1).

    000 A.1.1 prints this as ½ ln(2π σ²) + 1; the constant is ½, as here.
    """
    if std <= 0:
        raise ValueError(f"std must be positive, got {std}")
    return 0.5 * math.log(2 * math.pi * math.e * std**2)


def uniform_entropy(low: float, high: float) -> float:
    """Differential entropy ln(b − a) of U(a, b) in nats."""
    if high <= low:
        raise ValueError(f"need low < high, got ({low}, {high})")
    return math.log(high - low)


def bin_width(bits: int = DEFAULT_BITS, value_range: tuple[float, float] = DEFAULT_RANGE) -> float:
    """Δ = |range| / 2**bits, the length of one discretisation interval."""
    lo, hi = _check(bits, value_range)
    return (hi - lo) / 2**bits


def _check(bits: int, value_range: tuple[float, float]) -> tuple[float, float]:
    if not 1 <= bits <= 24:
        raise ValueError(f"bits must lie in [1, 24] (2**bits bins), got {bits}")
    lo, hi = float(value_range[0]), float(value_range[1])
    if not hi > lo:
        raise ValueError(f"value_range must be (low, high) with low < high, got {value_range}")
    return lo, hi


def _bin_index(x: Tensor, bits: int, lo: float, hi: float) -> Tensor:
    bins = 2**bits
    idx = torch.floor((x.double() - lo) * (bins / (hi - lo)))
    return idx.clamp_(0, bins - 1).long()


def _entropy_from_counts(counts: Tensor, n: int) -> Tensor:
    """Plug-in entropy along the last dim: ln n − Σ c ln c / n (nats)."""
    counts = counts.double()
    return math.log(n) - torch.special.xlogy(counts, counts).sum(-1) / n


def column_entropies(
    samples: Tensor,
    bits: int = DEFAULT_BITS,
    value_range: tuple[float, float] = DEFAULT_RANGE,
    differential: bool = False,
) -> Tensor:
    """Discrete entropy H_Δ of every column of ``samples`` (n samples × d components).

    Returns a float64 tensor of d entropies in nats, each from the 2**bits-bin histogram of
    one column over ``value_range``; plus ln Δ each when ``differential``.
    """
    if samples.ndim != 2 or samples.shape[0] == 0:
        raise ValueError(f"samples must be (n >= 1, d), got shape {tuple(samples.shape)}")
    lo, hi = _check(bits, value_range)
    n, d = samples.shape
    bins = 2**bits
    idx = _bin_index(samples.detach(), bits, lo, hi)
    idx = idx + torch.arange(d, device=idx.device) * bins  # one histogram per column
    counts = torch.bincount(idx.reshape(-1), minlength=d * bins).view(d, bins)
    h = _entropy_from_counts(counts, n)
    return h + math.log((hi - lo) / bins) if differential else h


def histogram_entropy(
    samples: Tensor,
    bits: int = DEFAULT_BITS,
    value_range: tuple[float, float] = DEFAULT_RANGE,
    differential: bool = False,
) -> float:
    """Entropy of 1-D ``samples`` (any shape, flattened) from a fixed 2**bits-bin histogram.

    Returns H_Δ in nats, or the differential estimate H_Δ + ln Δ when ``differential``
    (000 App. B, eq. 8, with the sign of ln Δ corrected).
    """
    return float(column_entropies(samples.reshape(-1, 1), bits, value_range, differential)[0])


def neuron_samples(weight: Tensor) -> Tensor:
    """The layer's neurons as rows: (out_features, fan_in); conv kernels are flattened."""
    if weight.ndim < 2:
        raise ValueError(f"a neuron weight needs >= 2 dims (out, in, ...), got {weight.ndim}")
    return weight.detach().reshape(weight.shape[0], -1)


def neuron_entropy(
    weight: Tensor,
    bits: int = DEFAULT_BITS,
    value_range: tuple[float, float] = DEFAULT_RANGE,
    differential: bool = True,
    mode: EntropyMode = "pooled",
) -> float:
    """Per-element average neuron-distribution entropy H̃ of one layer (000 Def. 2.2, Rem. 2.3).

    Args:
        weight: the layer weight (out, in) or (out, in, *kernel); row i is neuron i.
        bits: N, giving 2**N bins per component.
        value_range: fixed (low, high) of the bins; values outside are clipped into the edge bins.
        differential: add the bin-width correction ln Δ (comparable to closed forms).
        mode: ``pooled`` histograms all elements, ``marginal`` averages per-component entropies.

    Returns:
        H̃ in nats. For 1-D neurons this is the exact histogram entropy of the neurons.
    """
    x = neuron_samples(weight)
    if mode == "pooled":
        return histogram_entropy(x, bits, value_range, differential)
    if mode != "marginal":
        raise ValueError(f"mode must be 'marginal' or 'pooled', got {mode!r}")
    return float(column_entropies(x, bits, value_range, differential).mean())


def out_of_range_fraction(
    weight: Tensor, value_range: tuple[float, float] = DEFAULT_RANGE
) -> float:
    """Fraction of elements outside ``value_range`` (clipped into edge bins by the estimator)."""
    lo, hi = float(value_range[0]), float(value_range[1])
    w = weight.detach()
    return float(((w < lo) | (w > hi)).double().mean())


def layer_entropies(
    model: nn.Module,
    bits: int = DEFAULT_BITS,
    value_range: tuple[float, float] = DEFAULT_RANGE,
    differential: bool = True,
    mode: EntropyMode = "pooled",
    layers: Iterable[str] | None = None,
) -> dict[str, float]:
    """:func:`neuron_entropy` of every Linear/Conv layer of ``model`` (pruned weights masked).

    The maximum over layers is the quantity 000 §4.1 relates to the barrier.
    """
    return {
        name: neuron_entropy(effective_weight(m), bits, value_range, differential, mode)
        for name, m in weight_layers(model, layers).items()
    }


def gaussian_layer_entropies(
    model: nn.Module, layers: Iterable[str] | None = None
) -> dict[str, float]:
    """The Gaussian closed form ½ ln(2πe σ̂²) of every Linear/Conv layer of ``model``, σ̂ the
    standard deviation of the layer's weight elements (pruned weights masked).

    000 A.1.1 computes the init-scale study's entropy this way: H̃ of weights drawn i.i.d. from
    N(0, (c_d σ_He)²) is ½ ln(2πe (c_d σ_He)²), and σ̂ is that std up to sampling noise. For any
    other distribution of the same variance it is an upper bound (the Gaussian maximises
    entropy), so for trained weights use :func:`layer_entropies`.
    """
    return {
        name: gaussian_entropy(float(effective_weight(m).detach().double().std()))
        for name, m in weight_layers(model, layers).items()
    }
