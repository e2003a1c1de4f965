"""PQIndexMonitor and SharpnessMonitor log what the pure functions compute."""

from __future__ import annotations

import math

import pytest

from callbacks import PQIndexMonitor, SharpnessMonitor
from lmc.metrics import hutchinson_traces, layer_pq_indices
from tests.callbacks.conftest import TinyData, series


def test_pq_index_monitor_logs_flat_and_per_neuron_per_layer(fit):
    trainer, task, rows = fit([PQIndexMonitor(p=0.5, q=1.0)], max_epochs=2)
    assert [s for s, _ in series(rows, "pq/flat/layers.0")][0] == 0  # the initialization
    final = layer_pq_indices(task.net, 0.5, 1.0)
    for name, (flat, neuron) in final.items():
        assert series(rows, f"pq/flat/{name}")[-1][1] == pytest.approx(flat)
        assert series(rows, f"pq/neuron/{name}")[-1][1] == pytest.approx(neuron)
        assert 0 <= flat < 1 and 0 <= neuron < 1


def test_sharpness_monitor_logs_estimates_on_a_fixed_subset(fit):
    monitor = SharpnessMonitor(num_probes=4, num_samples=24, batch_size=10, seed=7)
    trainer, task, rows = fit([monitor], max_epochs=2)
    steps = [s for s, _ in series(rows, "sharpness/weighted_trace")]
    assert steps == [trainer.num_training_batches, 2 * trainer.num_training_batches]
    loader = TinyData().alignment_dataloader(10)
    batches = [b for _, b in zip(range(3), loader)]
    batches[-1] = (batches[-1][0][:4], batches[-1][1][:4])  # 10 + 10 + 4 = 24 samples
    est = hutchinson_traces(task.net, task.loss, batches, num_probes=4, seed=7)
    assert series(rows, "sharpness/weighted_trace")[-1][1] == pytest.approx(est["weighted"].mean)
    assert series(rows, "sharpness/trace")[-1][1] == pytest.approx(est["plain"].mean)
    assert series(rows, "sharpness/trace_se")[-1][1] == pytest.approx(est["plain"].stderr)
    assert all(math.isfinite(v) for _, v in series(rows, "sharpness/weighted_trace_se"))


def test_sharpness_monitor_at_fit_start_and_plain_only(fit):
    monitor = SharpnessMonitor(num_probes=2, num_samples=8, weighted=False, at_fit_start=True)
    _, _, rows = fit([monitor], max_epochs=1, limit_train_batches=1)
    assert [s for s, _ in series(rows, "sharpness/trace")] == [0, 1]
    assert not series(rows, "sharpness/weighted_trace")


def test_sharpness_monitor_without_alignment_data_says_what_to_do(fit, monkeypatch):
    monkeypatch.delattr(TinyData, "alignment_dataloader")
    with pytest.raises(RuntimeError, match="alignment_dataloader"):
        fit([SharpnessMonitor(num_probes=2, num_samples=8)], max_epochs=1, limit_train_batches=1)
