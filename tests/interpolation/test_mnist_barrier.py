"""Real-data check (slow): weight matching removes >= 80% of the MNIST MLP test loss barrier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, checkpoints, lmc_data_dir, run_cli, run_dirs

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir() -> Path:
    return lmc_data_dir("MNIST")


def test_weight_matching_reduces_mnist_barrier_by_80_percent(data_dir, tmp_path):
    ckpts = []
    for seed in (0, 1):
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "mnist" / "mlp.yaml"),
            f"--seed_everything={seed}",
            "--trainer.max_epochs=2",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path / f'fit{seed}'}",
        )
        ckpts += checkpoints(run_dirs(tmp_path / f"fit{seed}")[0])
    run_cli(
        "validate",
        "-c",
        str(CONFIGS / "mnist" / "mlp_barrier.yaml"),
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        f"--trainer.default_root_dir={tmp_path / 'barrier'}",
        "--trainer.enable_progress_bar=false",
    )
    [run] = run_dirs(tmp_path / "barrier")
    s = json.loads((run / "summary.json").read_text())["summary"]
    assert s["barrier_loss_naive"] > 0.1
    assert s["barrier_loss_matched"] <= 0.2 * s["barrier_loss_naive"]
    assert s["barrier_acc_matched"] < s["barrier_acc_naive"]
