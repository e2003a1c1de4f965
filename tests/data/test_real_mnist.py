"""Real MNIST / Fashion-MNIST from writable copies of the shared offline datasets, read through
torchvision (slow; run with -m slow)."""

from __future__ import annotations

import shutil

import pytest
import torch

from lmc.data import DatasetCorruptError, FashionMNISTDataModule, MNISTDataModule
from tests.helpers import copy_shared_mnist, shared_datasets


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


@pytest.mark.slow
def test_truncated_real_gz_names_the_file_and_the_original_md5(tmp_path):
    raw = copy_shared_mnist(tmp_path) / "MNIST" / "raw"
    gz = raw / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-1000])
    with pytest.raises(DatasetCorruptError, match="f68b3c2dcbeaaa9fbdd348bbdeb94873") as err:
        MNISTDataModule(str(tmp_path)).prepare_data()
    assert f"{gz} is truncated or corrupt" in str(err.value)
    assert not (raw / "train-images-idx3-ubyte").exists()


@pytest.mark.slow
def test_real_fashion_mnist_reads_through_torchvision(tmp_path):
    source = shared_datasets() / "FashionMNIST" / "raw"
    files = list(source.glob("*-ubyte.gz"))
    if not files:
        pytest.skip(f"no Fashion-MNIST .gz files in {source}")
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in files:  # plain copies: writable, unlike the read-only originals
        shutil.copyfile(gz, raw / gz.name)
    dm = FashionMNISTDataModule(str(tmp_path), verify_checksums=True)
    dm.prepare_data()
    dm.setup()
    assert dm.train_dataset.images.shape == (60000, 1, 28, 28) and len(dm.test_dataset) == 10000
    assert int(dm.train_dataset.labels[0]) == 9 and int(dm.test_dataset.labels[0]) == 9
