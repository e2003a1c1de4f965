"""The shipped callback configs through ``lmc fit``: pruning really happens, metrics are logged.

(Every config also runs one step in tests/test_cli.py.)
"""

from __future__ import annotations

import math

import pytest

from lmc.io import load_checkpoint
from tests.callbacks.conftest import read_metrics, series
from tests.helpers import CONFIGS, checkpoints, load_yaml, run_cli, run_dirs

CALLBACK_CONFIGS = sorted((CONFIGS / "callbacks").glob("*.yaml"))


@pytest.mark.parametrize("config", CALLBACK_CONFIGS, ids=lambda p: p.stem)
def test_configs_use_full_class_paths_and_a_seed(config):
    cfg = load_yaml(config)
    assert cfg["seed_everything"] == 0
    paths = [c["class_path"] for c in cfg["trainer"]["callbacks"]]
    assert paths and all(p.startswith("callbacks.") for p in paths)


def test_polynomial_prune_finetune_config_prunes_at_its_epoch(tmp_path):
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "callbacks" / "polynomial_prune_finetune_once.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.max_epochs=56",  # the config's prune_epoch 50 plus a few fine-tuning epochs
        "--data.init_args.n_train=100",
        "--data.init_args.n_val=20",
        "--data.init_args.n_test=20",
    )
    [run] = run_dirs(tmp_path)
    rows = read_metrics(run)
    rates = series(rows, "prune/rate")
    assert len(rates) == 56 and {v for _, v in rates[:50]} == {0.0} and rates[50][1] == 0.5
    entropy = dict(series(rows, "entropy/layers.1"))
    # one step per epoch: logged after epochs 50 (dense) and 55 (pruned at the start of epoch 51)
    assert entropy[55] < entropy[50]  # 000 Lemma 4.1: pruning lowers H_Δ
    [ckpt] = checkpoints(run)
    state = load_checkpoint(ckpt)["state_dict"]
    for name in ("layers.0", "layers.1", "head"):
        w = state[f"net.{name}.weight"]
        assert int((w == 0).sum()) == math.floor(0.5 * w.numel())
    assert not any(k.endswith(("_orig", "_mask")) for k in state)
    assert "test/mse" in {k for r in rows for k in r}
