"""Real-data check (slow): STE-MM merges MNIST MLPs within 1.5 accuracy points of the originals.

The full acceptance run (5 models, 10 STE-MM epochs, against the baselines) is
``benchmarks/ste_mm.py``; this is a shorter version through ``lmc fit``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, checkpoints, lmc_data_dir, run_cli, run_dirs

pytestmark = pytest.mark.slow
CSV = str(CONFIGS / "loggers" / "csv.yaml")


@pytest.fixture
def data_dir() -> Path:
    return lmc_data_dir("MNIST")


def test_stemm_merges_three_mnist_mlps_without_losing_accuracy(data_dir, tmp_path):
    ckpts = []
    for seed in range(3):
        out = tmp_path / f"fit{seed}"
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "mnist" / "mlp.yaml"),
            "-c",
            CSV,
            f"--seed_everything={seed}",
            "--trainer.max_epochs=3",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={out}",
        )
        ckpts += checkpoints(run_dirs(out)[0])
    out = tmp_path / "stemm"
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "merge" / "mnist_mlp_stemm.yaml"),
        "-c",
        CSV,
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        "--model.init_args.num_models=[3]",
        "--model.init_args.evaluation.sharpness_probes=0",
        "--trainer.max_epochs=3",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={out}",
    )
    [run] = run_dirs(out)
    s = json.loads((run / "summary.json").read_text())["summary"]
    assert s["stemm/n3/test/acc_gap"] > -0.015
    assert s["stemm/n3/test/acc"] > s["wm_ref/n3/test/acc"] - 0.005
