"""Shared by the curve benchmark: Fashion-MNIST VGG-11 x1/8 endpoints, trained once and cached.

Trained with ``configs/curves/fmnist_vgg11_endpoint.yaml`` through ``lmc fit``, shortened to a
CPU budget (``epochs`` epochs with cosine decay over them, ``limit_train`` training images).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"
CONFIG = ROOT / "configs" / "curves" / "fmnist_vgg11_endpoint.yaml"


def fmnist_vgg_checkpoints(
    seeds: list[int], epochs: int = 3, limit_train: int = 12000
) -> list[Path]:
    """Train (once) Fashion-MNIST VGG-11 x1/8 models, one per seed; return their checkpoints.

    Needs ``LMC_DATA_DIR`` with ``FashionMNIST/raw``; checkpoints are cached under
    ``benchmarks/.cache/fmnist_vgg11_e{epochs}_n{limit_train}_s{seed}.ckpt``.
    """
    if "LMC_DATA_DIR" not in os.environ:
        sys.exit("set LMC_DATA_DIR to a writable copy of the datasets (FashionMNIST/raw/*.gz)")
    from lmc.cli import main

    out = []
    for seed in seeds:
        tag = f"fmnist_vgg11_e{epochs}_n{limit_train}_s{seed}"
        target = CACHE / f"{tag}.ckpt"
        if not target.exists():
            root = CACHE / f"fit_{tag}"
            main(
                [
                    "fit",
                    "-c",
                    str(CONFIG),
                    "-c",
                    str(ROOT / "configs" / "loggers" / "csv.yaml"),
                    f"--seed_everything={seed}",
                    f"--trainer.max_epochs={epochs}",
                    f"--model.init_args.lr_scheduler.init_args.T_max={epochs}",
                    f"--data.init_args.limit_train={limit_train}",
                    "--trainer.enable_progress_bar=false",
                    "--trainer.enable_model_summary=false",
                    "--test_after_fit=false",
                    f"--trainer.logger.init_args.save_dir={root}",
                ]
            )
            [ckpt] = sorted(root.rglob("*.ckpt"))
            target.parent.mkdir(parents=True, exist_ok=True)
            ckpt.rename(target)
        out.append(target)
    return out
