"""Damaged or non-original files: every error names the file, what is wrong and the fix (the
original's md5 from torchvision's lists); read-only folders load without writing anything."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import datasets

from lmc.data import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    DatasetCorruptError,
    FashionMNISTDataModule,
    MNISTDataModule,
)
from lmc.data import formats as F

VISION = [MNISTDataModule, FashionMNISTDataModule, CIFAR10DataModule, CIFAR100DataModule]
MNIST_TRAIN_IMAGES_MD5 = "f68b3c2dcbeaaa9fbdd348bbdeb94873"  # torchvision's MNIST.resources
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"


def _truncate(path, n=100):
    path.write_bytes(path.read_bytes()[:-n])


@pytest.mark.parametrize("hook", ["prepare_data", "setup"])
def test_truncated_mnist_gz_names_the_file_and_the_original_md5(hook, tmp_path, write_fake):
    raw = write_fake(MNISTDataModule, tmp_path)
    _truncate(raw / "train-images-idx3-ubyte.gz")
    with pytest.raises(DatasetCorruptError) as err:
        getattr(MNISTDataModule(str(tmp_path), val_size=8, alignment_size=4), hook)()
    msg = str(err.value)
    assert str(raw / "train-images-idx3-ubyte.gz") in msg and "truncated or corrupt" in msg
    assert MNIST_TRAIN_IMAGES_MD5 in msg and "copy the original" in msg
    assert not (raw / "train-images-idx3-ubyte").exists()  # nothing half-written
    assert not [p for p in tmp_path.rglob(".*")]


def test_garbage_cifar_archive_names_the_file_and_the_original_md5(tmp_path, write_fake):
    archive = write_fake(CIFAR10DataModule, tmp_path)
    archive.write_bytes(b"not a tarball" * 50)
    with pytest.raises(DatasetCorruptError) as err:
        CIFAR10DataModule(str(tmp_path)).prepare_data()
    msg = str(err.value)
    assert str(archive) in msg and CIFAR10_ARCHIVE_MD5 in msg and "copy the original" in msg
    assert not (tmp_path / "cifar-10-batches-py").exists()


@pytest.mark.parametrize("bad", ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"])
def test_corrupt_decompressed_idx_file_is_named(bad, tmp_path, write_fake):
    raw = write_fake(MNISTDataModule, tmp_path, packed=False)
    _truncate(raw / bad, 5)
    with pytest.raises(DatasetCorruptError, match="truncated") as err:
        MNISTDataModule(str(tmp_path), val_size=8, alignment_size=4).setup("fit")
    assert f"{raw / bad} is truncated" in str(err.value) and f"{bad}.gz" in str(err.value)


def test_unreadable_cifar_batch_names_the_split_files_and_the_fix(tmp_path, write_fake):
    folder = write_fake(CIFAR100DataModule, tmp_path, packed=False)
    (folder / "test").write_bytes(b"garbage")
    dm = CIFAR100DataModule(str(tmp_path), val_size=8, alignment_size=4)
    dm.setup("fit")  # the train file is intact
    with pytest.raises(DatasetCorruptError) as err:
        dm.setup("test")
    msg = str(err.value)
    assert "test batches (test)" in msg and str(folder) in msg
    assert datasets.CIFAR100.tgz_md5 in msg and "copy the original" in msg


def test_checksum_mismatch_names_file_both_md5s_and_the_fix(tmp_path, write_fake):
    raw = write_fake(MNISTDataModule, tmp_path)
    with pytest.raises(DatasetCorruptError) as err:
        MNISTDataModule(str(tmp_path), verify_checksums=True).prepare_data()
    msg = str(err.value)
    gz = raw / "train-images-idx3-ubyte.gz"
    assert f"Checksum mismatch for {gz}" in msg and MNIST_TRAIN_IMAGES_MD5 in msg
    assert F.calculate_md5(gz) in msg and "verify_checksums=False" in msg


@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
def test_read_only_packed_data_loads_without_writing(cls, tmp_path, monkeypatch, write_fake):
    root = tmp_path / "data"
    write_fake(cls, root)
    before = sorted(root.rglob("*"))
    monkeypatch.setattr(F, "_writable", lambda folder: False)
    x, y = cls(str(root), val_size=8, alignment_size=4).test_dataset.tensors()
    assert len(x) == len(y) == 32 and sorted(root.rglob("*")) == before
    monkeypatch.undo()
    x2, _ = cls(str(root), val_size=8, alignment_size=4).test_dataset.tensors()  # unpacks
    assert torch.equal(x, x2) and sorted(root.rglob("*")) != before


@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
def test_data_modules_hold_what_torchvision_reads(cls, tmp_path, write_fake):
    write_fake(cls, tmp_path)
    dm = cls(str(tmp_path), val_size=8, alignment_size=4)
    dm.prepare_data()  # unpacked into the layout torchvision's download=False reads
    images, labels = dm.test_dataset.images, dm.test_dataset.labels
    if cls in (MNISTDataModule, FashionMNISTDataModule):
        reader = getattr(datasets, cls.dataset_name)
    else:  # torchvision's own class checks the originals' md5 on every load; fake files fail it
        reader = F._reader(cls.spec)
    tv = reader(str(tmp_path), train=False, download=False)
    for i in (0, 5, 31):  # torchvision's per-item PIL path
        img, label = tv[i]
        pixels = torch.from_numpy(np.array(img))  # (H, W) or (H, W, C)
        pixels = pixels.unsqueeze(-1) if pixels.ndim == 2 else pixels
        assert torch.equal(images[i], pixels.permute(2, 0, 1))
        assert int(labels[i]) == label
