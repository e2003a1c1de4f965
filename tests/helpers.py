"""Test helpers: run the CLI in-process, find run directories, read W&B offline runs back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmc.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def run_cli(*args: str) -> None:
    """Run ``lmc`` in-process with ``args``."""
    main(list(args))


def run_dirs(root: Path) -> list[Path]:
    """Run directories (holding ``config.yaml``) under ``root``, oldest first."""
    return sorted((p.parent for p in root.rglob("config.yaml")), key=lambda p: p.stat().st_mtime)


def checkpoints(run: Path) -> list[Path]:
    """The run's epoch checkpoints (``last.ckpt``, the copy ``--ckpt_path last`` resumes from,
    left out)."""
    return sorted(p for p in (run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")


def wandb_run_dirs(root: Path) -> list[Path]:
    return sorted(root.rglob("offline-run-*"), key=lambda p: p.stat().st_mtime)


def _leet_inspect(run: Path, *flags: str) -> str:
    from lmc.loggers import inspect_offline

    return inspect_offline(run, *flags)


def read_wandb_summary(run: Path) -> dict[str, Any]:
    """The W&B run's state, config and latest metrics, read offline from its ``.wandb`` log."""
    return json.loads(_leet_inspect(run, "--summary"))


def read_wandb_records(run: Path) -> list[dict[str, Any]]:
    """Every record of the W&B offline run (history rows, tables, files, ...)."""
    return [json.loads(line) for line in _leet_inspect(run).splitlines() if line.strip()]


def lmc_data_dir(dataset: str) -> Path:
    """``$LMC_DATA_DIR`` if it holds ``<dataset>/raw``; otherwise the calling test is skipped."""
    root = os.environ.get("LMC_DATA_DIR")
    if not root or not (Path(root) / dataset / "raw").is_dir():
        pytest.skip(f"set LMC_DATA_DIR to a writable copy of the datasets with {dataset}/raw")
    return Path(root)


def shared_datasets() -> Path:
    """``$LMC_SHARED_DATASETS``, else ``shared/datasets`` next to the repository checkout."""
    env = os.environ.get("LMC_SHARED_DATASETS")
    return Path(env) if env else REPO.parent / "shared" / "datasets"


def copy_shared_mnist(root: Path) -> Path:
    """Copy the original MNIST ``.gz`` files into ``root/MNIST/raw`` (skip the test if there
    are none); returns ``root``."""
    source = shared_datasets() / "MNIST" / "raw"
    files = list(source.glob("*-ubyte.gz"))
    if not files:
        pytest.skip(
            f"no MNIST .gz files in {source} (set LMC_SHARED_DATASETS to the datasets folder)"
        )
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for gz in files:
        shutil.copyfile(gz, raw / gz.name)
    return root


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
