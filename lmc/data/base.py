"""Dataloader plumbing shared by every ``lmc`` data module (vision and synthetic).

A subclass builds its datasets in ``_setup_fit`` (train, validation, alignment subset) and
``_setup_test``; this base turns them into loaders. Every dataset property builds what it needs
on first use, so the loaders work with or without ``setup`` (e.g. from a notebook).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lmc.data.memory import collate


def data_order_seed() -> int:
    """The seed of the training data order: ``seed_everything``'s (``PL_GLOBAL_SEED``), else
    torch's initial seed."""
    return int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed())) % 2**32


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The order of ``range(n)`` in ``epoch`` of a run whose data-order seed is ``seed``."""
    return torch.randperm(n, generator=seeded_generator(seed, stream=1_000 + epoch))


class EpochShuffle(Sampler[int]):
    """A random order of ``range(n)`` that depends only on ``seed`` and the epoch.

    Lightning calls :meth:`set_epoch` before every epoch, so the order of epoch ``e`` is the
    same in a run that was never interrupted and in one resumed from a checkpoint, whatever the
    global random state (this is what makes ``--ckpt_path last`` exact).
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        yield from epoch_order(self.n, self.seed, self.epoch).tolist()

    def __len__(self) -> int:
        return self.n


class BaseDataModule(L.LightningDataModule, ABC):
    """Train/val/test/predict loaders plus the fixed alignment subset used for matching and
    BatchNorm re-estimation (SPEC C1).

    Args:
        batch_size: training batch size.
        eval_batch_size: batch size of the validation, test, predict and alignment loaders
            (``None``: same as ``batch_size``).
        num_workers: ``DataLoader`` worker processes (0 loads in the main process).
    """

    task: ClassVar[str] = "classification"

    def __init__(
        self, batch_size: int = 128, eval_batch_size: int | None = None, num_workers: int = 0
    ) -> None:
        super().__init__()
        if batch_size < 1 or (eval_batch_size is not None and eval_batch_size < 1):
            raise ValueError(f"batch sizes must be >= 1, got {batch_size=}, {eval_batch_size=}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self._train: Dataset | None = None
        self._val: Dataset | None = None
        self._alignment: Dataset | None = None
        self._test: Dataset | None = None

    # subclasses fill these in ------------------------------------------------------------
    @abstractmethod
    def _setup_fit(self) -> None:
        """Set ``self._train``, ``self._val`` and ``self._alignment``."""

    @abstractmethod
    def _setup_test(self) -> None:
        """Set ``self._test``."""

    # Lightning hooks ---------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """Build the datasets a stage needs (idempotent: built datasets are kept)."""
        if stage in (None, "fit", "validate") and self._train is None:
            self._setup_fit()
        if stage in (None, "test", "predict") and self._test is None:
            self._setup_test()

    @property
    def train_dataset(self) -> Dataset:
        """Training split (augmented where the data module augments)."""
        if self._train is None:
            self._setup_fit()
        return self._train

    @property
    def val_dataset(self) -> Dataset:
        """Validation split: held out of training, never the test set; not augmented."""
        if self._val is None:
            self._setup_fit()
        return self._val

    @property
    def alignment_dataset(self) -> Dataset:
        """Fixed, seeded subset of the training split, not augmented, in a fixed order."""
        if self._alignment is None:
            self._setup_fit()
        return self._alignment

    @property
    def test_dataset(self) -> Dataset:
        """Test split; not augmented."""
        if self._test is None:
            self._setup_test()
        return self._test

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        seed = data_order_seed()
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=EpochShuffle(len(dataset), seed) if shuffle else None,  # type: ignore[arg-type]
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=collate,
            # the loader's own seed draws (worker seeds) leave the global random state alone
            generator=seeded_generator(seed, stream=999),
        )

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches: epoch ``e`` in the order :class:`EpochShuffle` draws from
        ``seed_everything`` and ``e`` (augmentation draws from torch's global RNG)."""
        return self._loader(self.train_dataset, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        return self._loader(self.val_dataset, self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches in a fixed order."""
        return self._loader(self.test_dataset, self.eval_batch_size, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """The test split, for ``predict``."""
        return self.test_dataloader()

    def alignment_dataloader(self, batch_size: int | None = None) -> DataLoader:
        """Alignment subset in a fixed order, every sample kept (no shuffle, no drop_last).

        Args:
            batch_size: batch size (``None``: ``eval_batch_size``).
        """
        return self._loader(
            self.alignment_dataset, batch_size or self.eval_batch_size, shuffle=False
        )


def seeded_generator(seed: int, stream: int = 0) -> torch.Generator:
    """A CPU generator for one independent random stream of a data module's ``seed``.

    Streams keep e.g. the validation split fixed when only the test size changes.
    """
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + stream)
