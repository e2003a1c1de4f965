"""Shared by the benchmarks: endpoints trained once with ``lmc fit`` and cached.

Checkpoints land in ``benchmarks/.cache/<tag>_s<seed>.ckpt`` (git-ignored); a second run of any
benchmark reuses them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"


def cached_checkpoints(
    config: Path, tag: str, seeds: list[int], overrides: list[str]
) -> list[Path]:
    """Train ``config`` once per seed (CSV logger, no test) with ``overrides``; cache the checkpoints.

    Needs ``LMC_DATA_DIR`` (a writable copy of the datasets).
    """
    if "LMC_DATA_DIR" not in os.environ:
        sys.exit("set LMC_DATA_DIR to a writable copy of the datasets (e.g. of ../shared/datasets)")
    from lmc.cli import main

    out = []
    for seed in seeds:
        target = CACHE / f"{tag}_s{seed}.ckpt"
        if not target.exists():
            root = CACHE / f"fit_{tag}_s{seed}"
            main(
                [
                    "fit",
                    "-c",
                    str(config),
                    "-c",
                    str(ROOT / "configs" / "loggers" / "csv.yaml"),
                    f"--seed_everything={seed}",
                    "--trainer.enable_progress_bar=false",
                    "--trainer.enable_model_summary=false",
                    "--test_after_fit=false",
                    f"--trainer.logger.init_args.save_dir={root}",
                    *overrides,
                ]
            )
            [ckpt] = sorted(root.rglob("*.ckpt"))
            target.parent.mkdir(parents=True, exist_ok=True)
            ckpt.rename(target)
        out.append(target)
    return out


def mnist_mlp_checkpoints(seeds: list[int], epochs: int = 3) -> list[Path]:
    """MNIST MLPs of ``configs/mnist/mlp.yaml`` trained ``epochs`` epochs, one per seed."""
    config = ROOT / "configs" / "mnist" / "mlp.yaml"
    return cached_checkpoints(
        config, f"mnist_mlp_e{epochs}", seeds, [f"--trainer.max_epochs={epochs}"]
    )


def fmnist_vgg_checkpoints(
    seeds: list[int], epochs: int = 3, limit_train: int = 12000
) -> list[Path]:
    """Fashion-MNIST VGG-11 x1/8 of ``configs/curves/fmnist_vgg11_endpoint.yaml``, shortened to
    ``epochs`` epochs (cosine decay over them) on ``limit_train`` training images."""
    config = ROOT / "configs" / "curves" / "fmnist_vgg11_endpoint.yaml"
    return cached_checkpoints(
        config,
        f"fmnist_vgg11_e{epochs}_n{limit_train}",
        seeds,
        [
            f"--trainer.max_epochs={epochs}",
            f"--model.init_args.lr_scheduler.init_args.T_max={epochs}",
            f"--data.init_args.limit_train={limit_train}",
        ],
    )
