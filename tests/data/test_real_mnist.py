"""Real MNIST from a writable copy of the shared offline datasets (slow; run with -m slow)."""

from __future__ import annotations

import pytest
import torch

from lmc.data import MNISTDataModule
from tests.helpers import copy_shared_mnist


@pytest.mark.slow
def test_real_mnist_loads_from_the_original_gz_files(tmp_path):
    raw = copy_shared_mnist(tmp_path) / "MNIST" / "raw"
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
