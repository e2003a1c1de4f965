"""NeuronEntropyMonitor logs per-layer and max entropy at init and every N epochs."""

from __future__ import annotations

import copy

import pytest

from callbacks import NeuronEntropyMonitor
from lmc.metrics import layer_entropies
from tests.callbacks.conftest import series, tiny_task


def test_logs_init_and_every_epoch(fit):
    task = tiny_task()
    init = layer_entropies(copy.deepcopy(task.net), bits=8)
    trainer, task, rows = fit([NeuronEntropyMonitor(bits=8)], max_epochs=2, task=task)
    steps_per_epoch = trainer.num_training_batches
    logged = series(rows, "entropy/layers.0")
    assert [s for s, _ in logged] == [0, steps_per_epoch, 2 * steps_per_epoch]
    assert logged[0][1] == pytest.approx(init["layers.0"])
    final = layer_entropies(task.net, bits=8)
    for name in ("layers.0", "layers.1", "head"):
        assert series(rows, f"entropy/{name}")[-1][1] == pytest.approx(final[name])
    assert series(rows, "entropy/max")[-1][1] == pytest.approx(max(final.values()))
    assert series(rows, "entropy/out_of_range")[-1][1] == 0.0


def test_every_n_epochs_and_the_last_epoch(fit):
    trainer, _, rows = fit([NeuronEntropyMonitor(every_n_epochs=2, layers=["head"])], max_epochs=3)
    steps = [s for s, _ in series(rows, "entropy/head")]
    assert steps == [0, 2 * trainer.num_training_batches, 3 * trainer.num_training_batches]
    assert not series(rows, "entropy/layers.0")


def test_histograms_reach_an_offline_wandb_run(fit, tmp_path):
    from lmc.loggers import WandbLogger
    from tests.helpers import read_wandb_records, wandb_run_dirs

    logger = WandbLogger(save_dir=str(tmp_path / "wb"), offline=True)
    fit([NeuronEntropyMonitor(log_histograms=True)], max_epochs=1, logger=logger)
    logger.experiment.finish()
    [run] = wandb_run_dirs(tmp_path / "wb")
    history = [r for r in read_wandb_records(run) if "history" in str(r.get("type", ""))]
    text = str(history)
    assert "entropy/max" in text and "weights/layers.0" in text
