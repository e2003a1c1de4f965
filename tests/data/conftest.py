"""Fixtures for the data tests: tiny fake datasets written in torchvision's on-disk formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmc.data import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    write_fake_cifar10,
    write_fake_cifar100,
    write_fake_mnist,
)

VISION = [MNISTDataModule, FashionMNISTDataModule, CIFAR10DataModule, CIFAR100DataModule]


def _write_fake(
    cls: type, root: Path, packed: bool = True, n_train: int | None = None, n_test: int = 32
) -> Path:
    """Write the fake dataset that data module ``cls`` reads, under ``root``.

    ``packed``: the original distribution form (MNIST ``.gz``, CIFAR ``.tar.gz``); otherwise the
    decompressed idx files / extracted CIFAR folder. ``n_train`` defaults to 64 (128 for
    CIFAR-100, so every class appears).
    """
    n_train = n_train or (128 if cls is CIFAR100DataModule else 64)
    if cls in (MNISTDataModule, FashionMNISTDataModule):
        return write_fake_mnist(root, cls.dataset_name, n_train, n_test, compress=packed)
    writer = write_fake_cifar10 if cls is CIFAR10DataModule else write_fake_cifar100
    return writer(root, n_train=n_train, n_test=n_test, archive=packed)


@pytest.fixture
def write_fake():
    """``write_fake(cls, root, packed=True, n_train=None, n_test=32)``: fake data for ``cls``."""
    return _write_fake


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A data_dir holding all four fake datasets in their original packed form."""
    root = tmp_path / "data"
    for cls in VISION:
        _write_fake(cls, root)
    return root
