"""Real MNIST from a writable copy of the shared offline datasets (slow; run with -m slow)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from lmc.data import MNISTDataModule


def shared_datasets() -> Path:
    """``$LMC_SHARED_DATASETS``, else ``shared/datasets`` next to the repository checkout."""
    env = os.environ.get("LMC_SHARED_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "datasets"


@pytest.mark.slow
def test_real_mnist_loads_from_the_original_gz_files(tmp_path):
    source = shared_datasets() / "MNIST" / "raw"
    if not list(source.glob("*-ubyte.gz")):
        pytest.skip(
            f"no MNIST .gz files in {source} (set LMC_SHARED_DATASETS to the datasets folder)"
        )
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in source.glob("*-ubyte.gz"):
        shutil.copyfile(gz, raw / gz.name)
    dm = MNISTDataModule(str(tmp_path), batch_size=1000, verify_checksums=True)
    dm.prepare_data()
    assert (raw / "train-images-idx3-ubyte").stat().st_size == 47_040_016
    dm.setup()
    train_x, train_y = dm.train_dataset.images, dm.train_dataset.labels
    assert train_x.shape == (60000, 1, 28, 28) and len(dm.test_dataset) == 10000
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.alignment_dataset)) == (
        55000,
        5000,
        5000,
    )
    assert int(train_y[0]) == 5 and int(dm.test_dataset.labels[0]) == 7
    x, _ = dm.test_dataset.tensors()
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05  # (0.1307, 0.3081)
    assert sum(len(y) for _, y in dm.train_dataloader()) == 55000
    assert torch.bincount(train_y).min() > 5000
