"""Image-classification data modules: MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 (SPEC C1).

Each data module reads its files offline through ``torchvision.datasets`` (``download=False``;
see :mod:`lmc.data.formats`), keeps the whole dataset in memory as uint8 and carves, with its own
``seed``:

- a validation split out of the training set (checkpoints are never selected on test),
- the training split (the rest, optionally capped by ``limit_train``),
- a fixed alignment subset of the training split (un-augmented, fixed order) for weight /
  activation matching and BatchNorm re-estimation.

Augmentation follows the papers: CIFAR random 32x32 crop with 4-pixel zero padding and random
horizontal flips (004 App. B), optionally random rotation (002 §4); none on MNIST and
Fashion-MNIST (000 §4, 004 App. B.1).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor
from torchvision import datasets

from lmc.data.base import BaseDataModule, seeded_generator
from lmc.data.formats import (
    CifarSpec,
    cifar_source,
    load_cifar,
    load_mnist,
    mnist_raw_dir,
    prepare_cifar,
    prepare_mnist,
)
from lmc.data.memory import BatchAugment, InMemoryImageDataset

DATA_DIR_ENV = "LMC_DATA_DIR"


def resolve_data_dir(data_dir: str | None = None) -> Path:
    """``data_dir`` if given, else ``$LMC_DATA_DIR``, else ``./data``."""
    return Path(data_dir or os.environ.get(DATA_DIR_ENV) or "./data").expanduser()


def split_indices(
    n: int, val_size: int, alignment_size: int, seed: int, limit_train: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded split of ``n`` training samples into (train, val, alignment) index tensors.

    One permutation from ``seed`` puts its first ``val_size`` entries in validation and the
    rest (the first ``limit_train`` of them, if set) in train; a second seeded permutation of the
    train indices gives the alignment subset, a subset of train in a fixed random order.

    Raises:
        ValueError: a size is negative or larger than the data holds; the message names the option
            to lower.
    """
    if val_size < 0 or alignment_size < 0 or (limit_train is not None and limit_train < 1):
        raise ValueError(
            f"val_size and alignment_size must be >= 0 and limit_train >= 1, got "
            f"{val_size=}, {alignment_size=}, {limit_train=}"
        )
    if val_size >= n:
        raise ValueError(
            f"val_size={val_size} leaves no training samples: the training set holds only {n}. "
            f"Lower val_size (data.init_args.val_size) below {n}."
        )
    g = seeded_generator(seed)
    perm = torch.randperm(n, generator=g)
    val, train = perm[:val_size], perm[val_size:]
    if limit_train is not None:
        train = train[:limit_train]
    if alignment_size > len(train):
        raise ValueError(
            f"alignment_size={alignment_size} exceeds the {len(train)} training samples left "
            f"after carving val_size={val_size} out of {n}"
            + (f" and applying limit_train={limit_train}" if limit_train is not None else "")
            + f". Lower alignment_size (data.init_args.alignment_size) to at most {len(train)}."
        )
    alignment = train[torch.randperm(len(train), generator=g)[:alignment_size]]
    return train, val, alignment


class VisionDataModule(BaseDataModule):
    """Base data module for an image-classification dataset held in memory.

    Args:
        data_dir: folder holding the dataset in torchvision's layout (``None``: the environment
            variable ``LMC_DATA_DIR``, else ``./data``). Never downloaded.
        batch_size: training batch size.
        eval_batch_size: batch size for validation/test/predict/alignment (``None``: batch_size).
        val_size: images carved out of the training set for validation, with ``seed``.
        alignment_size: images of the (remaining) training split in the fixed alignment subset,
            used un-augmented for matching and BatchNorm re-estimation.
        augment: augment training images (CIFAR: random crop 32 with padding 4 and horizontal
            flip, 004 App. B; MNIST/Fashion-MNIST: nothing unless ``rotate`` > 0).
        rotate: maximum random rotation in degrees when ``augment`` (002 §4); 0 disables it.
        limit_train: keep only this many (seeded, random) training images, for quick runs.
        num_workers: ``DataLoader`` worker processes.
        on_device: hold the splits on the training device and draw batches there (``None``:
            where they fit; see :class:`lmc.data.base.BaseDataModule`).
        seed: seed of the train/val/alignment split, independent of the training seed
            (``seed_everything`` sets the data order and augmentation instead).
        verify_checksums: check files against the original distribution's md5 sums (torchvision's
            lists) in ``prepare_data`` (off by default so tiny fake datasets load).
    """

    dataset_name: ClassVar[str]
    num_classes: ClassVar[int]
    in_channels: ClassVar[int]
    image_size: ClassVar[int]
    mean: ClassVar[tuple[float, ...]]
    std: ClassVar[tuple[float, ...]]
    crop_flip: ClassVar[bool] = False
    task: ClassVar[str] = "classification"

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        val_size: int = 5000,
        alignment_size: int = 5000,
        augment: bool = True,
        rotate: float = 0.0,
        limit_train: int | None = None,
        num_workers: int = 0,
        on_device: bool | None = None,
        seed: int = 0,
        verify_checksums: bool = False,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, num_workers, on_device)
        if rotate < 0:
            raise ValueError(f"rotate must be >= 0 degrees, got {rotate}")
        self.data_dir = resolve_data_dir(data_dir)
        self.val_size = val_size
        self.alignment_size = alignment_size
        self.augment = augment
        self.rotate = rotate
        self.limit_train = limit_train
        self.seed = seed
        self.verify_checksums = verify_checksums

    @property
    def train_augment(self) -> BatchAugment | None:
        """The training-time augmentation, or ``None``."""
        if not self.augment:
            return None
        aug = BatchAugment(
            crop_padding=4 if self.crop_flip else 0, flip=self.crop_flip, rotate=self.rotate
        )
        return aug if aug.active else None

    @abstractmethod
    def _prepare(self) -> None:
        """Implemented by each concrete data module."""

    @abstractmethod
    def _load(self, split: str) -> tuple[Tensor, Tensor]:
        """Implemented by each concrete data module."""

    def prepare_data(self) -> None:
        """Make the on-disk dataset fast to read (decompress/extract); fails fast if missing."""
        self._prepare()

    def check_files(self) -> None:
        """That the dataset's files are where this module reads them, without reading them (a
        study checks this when it plans).

        Raises:
            DatasetNotFoundError: naming the folder searched and the files expected there.
        """

    def _dataset(
        self, images: Tensor, labels: Tensor, indices: Tensor | None = None, augment: bool = False
    ) -> InMemoryImageDataset:
        aug = self.train_augment if augment else None
        return InMemoryImageDataset(images, labels, self.mean, self.std, aug, indices)

    def _setup_fit(self) -> None:
        images, labels = self._load("train")
        train, val, alignment = split_indices(
            len(images), self.val_size, self.alignment_size, self.seed, self.limit_train
        )
        self._train = self._dataset(images, labels, train, augment=True)
        self._val = self._dataset(images, labels, val)
        self._alignment = self._dataset(images, labels, alignment)

    def _setup_test(self) -> None:
        self._test = self._dataset(*self._load("test"))


class _MNISTFormat(VisionDataModule):
    """Reads ``<data_dir>/<dataset_name>/raw/*-ubyte[.gz]`` (LeCun's idx files)."""

    in_channels = 1
    image_size = 28
    num_classes = 10

    def _prepare(self) -> None:
        prepare_mnist(self.data_dir, self.dataset_name, self.verify_checksums)

    def check_files(self) -> None:
        mnist_raw_dir(self.data_dir, self.dataset_name)

    def _load(self, split: str) -> tuple[Tensor, Tensor]:
        return load_mnist(self.data_dir, self.dataset_name, split)


class MNISTDataModule(_MNISTFormat):
    """MNIST handwritten digits (000 §4, 003 §6, 004 App. B.1).

    Normalised with mean 0.1307 and std 0.3081; no augmentation. Files:
    ``<data_dir>/MNIST/raw/*-ubyte.gz`` (or decompressed ``*-ubyte``).
    """

    dataset_name = "MNIST"
    mean = (0.1307,)
    std = (0.3081,)


class FashionMNISTDataModule(_MNISTFormat):
    """Fashion-MNIST clothing images (004 App. B.1).

    Normalised with mean 0.2860 and std 0.3530; no augmentation. Files:
    ``<data_dir>/FashionMNIST/raw/*-ubyte.gz`` (or decompressed ``*-ubyte``).
    """

    dataset_name = "FashionMNIST"
    mean = (0.2860,)
    std = (0.3530,)


class _CIFARFormat(VisionDataModule):
    """Reads the python-pickle CIFAR distribution, extracted or as the ``.tar.gz`` archive.

    ``spec`` is the torchvision class that reads it (its file lists and md5 sums too).
    """

    spec: ClassVar[CifarSpec]
    in_channels = 3
    image_size = 32
    crop_flip = True

    def _prepare(self) -> None:
        prepare_cifar(self.data_dir, self.spec, self.verify_checksums)

    def check_files(self) -> None:
        cifar_source(self.data_dir, self.spec)

    def _load(self, split: str) -> tuple[Tensor, Tensor]:
        return load_cifar(self.data_dir, self.spec, split)


class CIFAR10DataModule(_CIFARFormat):
    """CIFAR-10 (000 §4, 002 §4, 004 App. B).

    Training images get random 32x32 crops of the 4-pixel zero-padded image and horizontal flips
    (optionally rotation). Files: ``<data_dir>/cifar-10-python.tar.gz`` or the extracted
    ``<data_dir>/cifar-10-batches-py/``.
    """

    dataset_name = "CIFAR-10"
    spec = datasets.CIFAR10
    num_classes = 10
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)


class CIFAR100DataModule(_CIFARFormat):
    """CIFAR-100 with its 100 fine labels (000 A.1.2, 002 §4).

    Training images get random 32x32 crops of the 4-pixel zero-padded image and horizontal flips
    (optionally rotation). Files: ``<data_dir>/cifar-100-python.tar.gz`` or the extracted
    ``<data_dir>/cifar-100-python/``.
    """

    dataset_name = "CIFAR-100"
    spec = datasets.CIFAR100
    num_classes = 100
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
