"""Activation matching and correlation alignment (002 Alg. 1, App. D): known answers, streaming."""

from __future__ import annotations

import copy

import pytest
import torch

from lmc.models import MLP, ResNet
from lmc.permutation import (
    CrossStatistics,
    PermutationSpec,
    SpecError,
    activation_matching,
    apply_permutation,
    correlation_alignment,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
)

from .helpers import PARAMS, build


@pytest.mark.parametrize("similarity", ["covariance", "correlation"])
@pytest.mark.parametrize(("factory", "shape"), PARAMS)
def test_recovers_known_permutation(factory, shape, similarity, device):
    model_a, data = build(factory, shape)  # built on the CPU (same weights), then moved
    model_a.to(device)
    data = [x.to(device) for x in data]
    spec = spec_for(model_a)
    state_a = model_a.state_dict()
    perm = random_permutation(spec.sizes(state_a), 1)
    model_b = copy.deepcopy(model_a)
    model_b.load_state_dict(apply_permutation(state_a, spec, perm))
    result = activation_matching(model_a, model_b, data, spec, similarity=similarity)
    assert all(p.device.type == device for p in result.perm.values())
    assert permutation_equal(result.perm, invert_permutation(perm))
    aligned = apply_permutation(model_b.state_dict(), spec, result.perm)
    assert all(torch.equal(aligned[k], state_a[k]) for k in state_a)  # a permutation is exact
    model_b.load_state_dict(aligned)
    with torch.no_grad():
        out_b, out_a = model_b(data[0]), model_a(data[0])
    # the same weights on the same device; CUDA kernels need not be bitwise reproducible
    assert (
        torch.equal(out_b, out_a) if device == "cpu" else torch.allclose(out_b, out_a, 1e-5, 1e-6)
    )
    if similarity == "correlation":
        assert all(v == pytest.approx(1.0, abs=1e-6) for v in result.similarity.values())


def test_statistics_are_streamed():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(500, 6, generator=g) + 3
    b = a[:, [2, 0, 1, 5, 4, 3]] * 2 + 0.1 * torch.randn(500, 6, generator=g)
    whole, parts = CrossStatistics(6), CrossStatistics(6)
    whole.update(a, b)
    for chunk_a, chunk_b in zip(a.split(37), b.split(37)):
        parts.update(chunk_a, chunk_b)
    assert parts.count == 500 and parts.cross.shape == (6, 6)  # O(n^2) state, whatever the data
    assert torch.allclose(parts.correlation(), whole.correlation(), atol=1e-12)
    ref = torch.corrcoef(torch.cat([a.T, b.T]).double())[:6, 6:]
    assert torch.allclose(whole.correlation(), ref, atol=1e-9)
    ref_cov = torch.cov(torch.cat([a.T, b.T]).double(), correction=0)[:6, 6:]
    assert torch.allclose(whole.covariance(), ref_cov, atol=1e-9)


def test_residual_stream_uses_summed_correlations_over_its_points():
    model_a, data = build(lambda: ResNet(20, width=0.25, norm="batch", init="he_normal"), (3, 8, 8))
    model_b, _ = build(
        lambda: ResNet(20, width=0.25, norm="batch", init="he_normal"), (3, 8, 8), seed=1
    )
    loader = [(x, torch.zeros(len(x))) for x in data]  # (x, y) batches
    res = correlation_alignment(model_a, model_b, loader, max_batches=1)
    positions = 32 * 8 * 8  # one batch of 32 inputs, stage 1 at 8x8
    assert res.samples["stream1"] == 4 * positions  # stem + 3 blocks
    assert res.samples["layer1.0.conv1"] == positions
    assert all(res.similarity[g] >= res.similarity_before[g] - 1e-9 for g in res.perm)


def test_missing_activation_points_is_an_error():
    model = MLP(10, 2, width=4, depth=1)
    spec = PermutationSpec(spec_for(model).axes)
    with pytest.raises(SpecError, match="activation points"):
        activation_matching(model, model, [torch.randn(4, 10)], spec)
