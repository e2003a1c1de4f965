"""Shared by the benchmarks: MNIST MLP endpoints trained with configs/mnist/mlp.yaml, cached."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"


def mnist_mlp_checkpoints(seeds: list[int], epochs: int = 3) -> list[Path]:
    """Train (once) MNIST MLPs with ``configs/mnist/mlp.yaml`` for ``epochs`` epochs per seed.

    Needs ``LMC_DATA_DIR`` with ``MNIST/raw``; checkpoints are cached under
    ``benchmarks/.cache/mnist_mlp_e{epochs}_s{seed}.ckpt``.
    """
    if "LMC_DATA_DIR" not in os.environ:
        sys.exit("set LMC_DATA_DIR to a writable copy of the datasets (MNIST/raw/*.gz)")
    from lmc.cli import main

    out = []
    for seed in seeds:
        target = CACHE / f"mnist_mlp_e{epochs}_s{seed}.ckpt"
        if not target.exists():
            root = CACHE / f"fit_e{epochs}_s{seed}"
            main(
                [
                    "fit",
                    "-c",
                    str(ROOT / "configs" / "mnist" / "mlp.yaml"),
                    "-c",
                    str(ROOT / "configs" / "loggers" / "csv.yaml"),
                    f"--seed_everything={seed}",
                    f"--trainer.max_epochs={epochs}",
                    "--trainer.enable_progress_bar=false",
                    "--test_after_fit=false",
                    f"--trainer.logger.init_args.save_dir={root}",
                ]
            )
            [ckpt] = sorted(root.rglob("*.ckpt"))
            target.parent.mkdir(parents=True, exist_ok=True)
            ckpt.rename(target)
        out.append(target)
    return out
