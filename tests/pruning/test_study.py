"""The offline only-prune sweep with a pluggable barrier (000 §4.3)."""

from __future__ import annotations

import torch

from lmc.metrics import weight_layers
from lmc.models import MLP
from lmc.pruning import barrier_vs_rate, prune_magnitude, pruned_copy


def _distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return float(sum((p - q).pow(2).sum() for p, q in zip(a.parameters(), b.parameters())))


def test_barrier_of_a_model_with_itself_is_zero_at_every_rate():
    torch.manual_seed(0)
    model = MLP(6, 3, width=8, depth=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = barrier_vs_rate(model, model, [0.0, 0.5, 0.9], _distance)
    assert out == {0.0: 0.0, 0.5: 0.0, 0.9: 0.0}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_align_fn_sees_pruned_plain_models_and_its_result_is_measured():
    torch.manual_seed(0)
    a, b = MLP(6, 3, width=8, depth=1), MLP(6, 3, width=8, depth=1)
    seen = []

    def align(x, y):
        seen.append((x, y))
        return x  # a perfect "alignment": the barrier is then 0

    out = barrier_vs_rate(a, b, [0.25], _distance, align_fn=align)
    assert out == {0.25: 0.0}
    x, y = seen[0]
    assert "layers.0.weight" in dict(y.named_parameters()) and not y.layers[0]._forward_pre_hooks
    assert int((y.layers[0].weight == 0).sum()) == 12


def test_pruned_copy_of_a_pruned_model_after_a_forward():
    torch.manual_seed(0)
    model = MLP(6, 3, width=8, depth=1)
    prune_magnitude(model, 0.25)
    model(torch.randn(2, 6)).sum().backward()
    copy = pruned_copy(model, 0.5)
    assert all(float((m.weight == 0).double().mean()) == 0.5 for m in weight_layers(copy).values())
