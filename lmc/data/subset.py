"""One task of a disjoint-task split: the examples of some classes of another data module
(ZipIt!'s setting: models trained on disjoint label sets, e.g. MNIST 0-4 and 5-9).

:class:`ClassSubset` wraps any image-classification data module of ``lmc`` and keeps, in every
split (train, validation, the alignment subset, test), the examples whose label is one of
``classes``; labels keep their values, so models of two tasks share one output space and their
merge is evaluated on the union by the unwrapped module::

    data:
      class_path: lmc.data.ClassSubset
      init_args:
        classes: [0, 1, 2, 3, 4]
        data:
          class_path: lmc.data.MNISTDataModule
          init_args: {batch_size: 128, val_size: 5000, alignment_size: 5000}

The split into train/validation/alignment is the wrapped module's (same seed, same examples),
filtered afterwards: a task's alignment subset is the part of the full one in its classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from lmc.data.base import BaseDataModule
from lmc.data.memory import InMemoryImageDataset


class ClassSubset(BaseDataModule):
    """The examples of ``classes`` in every split of ``data``.

    Args:
        data: an image-classification data module of ``lmc`` (MNIST, Fashion-MNIST, CIFAR-10,
            CIFAR-100); its loader settings (batch sizes, workers, on-device) are used.
        classes: the labels kept (distinct, each below the dataset's number of classes).

    Raises:
        ValueError: an empty, repeated or out-of-range class list, or a data module that is not
            an image classification one (the message names the problem).
    """

    def __init__(self, data: BaseDataModule, classes: list[int]) -> None:
        if getattr(data, "task", None) != "classification" or not hasattr(data, "num_classes"):
            raise ValueError(
                f"data.init_args.data: ClassSubset keeps classes of a classification data "
                f"module, got {type(data).__name__}"
            )
        bad = [c for c in classes if not 0 <= c < data.num_classes]
        if not classes or bad or len(set(classes)) != len(classes):
            raise ValueError(
                f"data.init_args.classes must list distinct labels in [0, {data.num_classes}) "
                f"of {type(data).__name__}, got {classes}"
            )
        super().__init__(data.batch_size, data.eval_batch_size, data.num_workers, data.on_device)
        self.data = data
        self.classes = list(classes)

    def __getattr__(self, name: str) -> Any:
        # the wrapped module's attributes (num_classes, mean, std, train_augment, data_dir, ...)
        if name in ("data", "classes") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.data, name)

    def prepare_data(self) -> None:
        self.data.prepare_data()

    def _keep(self, dataset: Dataset | None) -> Dataset:
        if not isinstance(dataset, InMemoryImageDataset):
            raise ValueError(
                f"ClassSubset filters lmc's in-memory image datasets, got {type(dataset).__name__}"
            )
        labels = dataset.labels[dataset.indices]
        keep = torch.isin(labels, torch.tensor(self.classes, dtype=labels.dtype))
        return dataset.subset(keep)

    def _setup_fit(self) -> None:
        d = self.data
        d.setup("fit")
        self._train, self._val = self._keep(d.train_dataset), self._keep(d.val_dataset)
        self._alignment = self._keep(d.alignment_dataset)

    def _setup_test(self) -> None:
        self.data.setup("test")
        self._test = self._keep(self.data.test_dataset)


def class_counts(
    dataset: InMemoryImageDataset, classes: Sequence[int] | None = None
) -> dict[int, int]:
    """Examples per label of an in-memory image dataset (only ``classes`` if given)."""
    labels = dataset.labels[dataset.indices]
    values, counts = torch.unique(labels, return_counts=True)
    out = {int(v): int(c) for v, c in zip(values, counts)}
    return {c: out.get(c, 0) for c in classes} if classes is not None else out
