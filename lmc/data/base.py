"""Dataloader plumbing shared by every ``lmc`` data module (vision and synthetic).

A subclass builds its datasets in ``_setup_fit`` (train, validation, alignment subset) and
``_setup_test``; this base turns them into loaders. Every dataset property builds what it needs
on first use, so the loaders work with or without ``setup`` (e.g. from a notebook).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sized
from typing import ClassVar, cast

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from lmc.data.memory import InMemoryImageDataset, collate


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
        on_device: hold the train/val/test splits as tensors on the training device and draw
            their batches there (:class:`DeviceBatches`: same order, augmentation and batches
            as the ``DataLoader``, without one). ``None`` (default): on where it fits - the
            split is in memory, ``num_workers == 0``, one process, and on a GPU it takes at
            most a quarter of the free memory; ``False``: always a ``DataLoader``.
    """

    task: ClassVar[str] = "classification"
    #: the init arguments that define the data a model learns (a synthetic task's teacher and
    #: seed); a barrier or merge of trained models must read the data with the same values
    #: (:func:`lmc.data.base.data_differences`). The class itself always counts.
    model_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        on_device: bool | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1 or (eval_batch_size is not None and eval_batch_size < 1):
            raise ValueError(f"batch sizes must be >= 1, got {batch_size=}, {eval_batch_size=}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if on_device and num_workers:
            raise ValueError(
                f"on_device=true draws batches on the training device, without DataLoader "
                f"workers, but num_workers={num_workers}: set num_workers=0 or on_device=false"
            )
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.on_device = on_device
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
        assert self._train is not None  # _setup_fit sets it
        return self._train

    @property
    def val_dataset(self) -> Dataset:
        """Validation split: held out of training, never the test set; not augmented."""
        if self._val is None:
            self._setup_fit()
        assert self._val is not None  # _setup_fit sets it
        return self._val

    @property
    def alignment_dataset(self) -> Dataset:
        """Fixed, seeded subset of the training split, not augmented, in a fixed order."""
        if self._alignment is None:
            self._setup_fit()
        assert self._alignment is not None  # _setup_fit sets it
        return self._alignment

    @property
    def test_dataset(self) -> Dataset:
        """Test split; not augmented."""
        if self._test is None:
            self._setup_test()
        assert self._test is not None  # _setup_test sets it
        return self._test

    def batch_device(self, dataset: Dataset) -> torch.device | None:
        """The device :class:`DeviceBatches` draws ``dataset``'s batches on, or ``None`` for a
        ``DataLoader`` (see ``on_device``); ``on_device=true`` that cannot hold raises why."""
        trainer = self._trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        if self.on_device is False:
            return None
        why = None
        if self.num_workers:
            why = f"num_workers={self.num_workers} asks for DataLoader workers"
        elif trainer is not None and trainer.world_size > 1:
            why = f"{trainer.world_size} processes each need their shard of the data"
        elif not isinstance(dataset, (InMemoryImageDataset, TensorDataset)):
            why = f"the split is a {type(dataset).__name__}, not tensors in memory"
        elif device.type == "cuda":
            need = held_bytes(dataset)
            free = torch.cuda.mem_get_info(device)[0]
            if need > free // 4:
                why = f"the split takes {need / 2**30:.2f} GiB, over a quarter of the GPU's free "
                why += f"{free / 2**30:.2f} GiB"
        if why is None:
            return device
        if self.on_device:
            raise ValueError(
                f"data.init_args.on_device=true cannot hold the split on {device}: {why}; set "
                "on_device=false (or leave it unset: on where it fits)"
            )
        return None

    @property
    def _trainer(self):  # noqa: ANN202 (Lightning's Trainer, None when not attached)
        return getattr(self, "trainer", None)

    def _loader(
        self, dataset: Dataset, batch_size: int, shuffle: bool, on_device: bool = True
    ) -> DataLoader | DeviceBatches:
        seed = data_order_seed()
        # every split here is sized (torch's Dataset declares no __len__)
        sampler = EpochShuffle(len(cast(Sized, dataset)), seed) if shuffle else None
        device = self.batch_device(dataset) if on_device else None
        if device is not None:
            # batch_device gives a device only for these two
            held = cast(InMemoryImageDataset | TensorDataset, dataset)
            return DeviceBatches(held, batch_size, sampler, device)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=collate,
            # the loader's own seed draws (worker seeds) leave the global random state alone
            generator=seeded_generator(seed, stream=999),
        )

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        """Shuffled training batches: epoch ``e`` in the order :class:`EpochShuffle` draws from
        ``seed_everything`` and ``e`` (augmentation draws from torch's global RNG)."""
        return self._loader(self.train_dataset, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader | DeviceBatches:
        """Validation batches in a fixed order."""
        return self._loader(self.val_dataset, self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader | DeviceBatches:
        """Test batches in a fixed order."""
        return self._loader(self.test_dataset, self.eval_batch_size, shuffle=False)

    def predict_dataloader(self) -> DataLoader | DeviceBatches:
        """The test split, for ``predict``."""
        return self.test_dataloader()

    def alignment_dataloader(self, batch_size: int | None = None) -> DataLoader:
        """Alignment subset in a fixed order, every sample kept (no shuffle, no drop_last).

        Args:
            batch_size: batch size (``None``: ``eval_batch_size``).
        """
        loader = self._loader(
            self.alignment_dataset, batch_size or self.eval_batch_size, False, on_device=False
        )
        return cast(DataLoader, loader)  # on_device=False: never DeviceBatches


def seeded_generator(seed: int, stream: int = 0) -> torch.Generator:
    """A CPU generator for one independent random stream of a data module's ``seed``.

    Streams keep e.g. the validation split fixed when only the test size changes.
    """
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + stream)


def held_bytes(dataset: InMemoryImageDataset | TensorDataset) -> int:
    """Bytes of the tensors an in-memory split holds (images, labels, indices; without
    augmentation also its normalised float32 copy)."""
    if not isinstance(dataset, InMemoryImageDataset):
        return sum(t.numel() * t.element_size() for t in dataset.tensors)
    held = sum(
        t.numel() * t.element_size() for t in (dataset.images, dataset.labels, dataset.indices)
    )
    if dataset.augment is None:  # the normalised copy of the subset and its labels
        held += 4 * len(dataset) * math.prod(dataset.images.shape[1:])
        held += dataset.labels.element_size() * len(dataset)
    return held


class DeviceBatches:
    """The batches a ``DataLoader`` over ``dataset`` (no workers, no ``drop_last``) would give,
    drawn from the split held on ``device``: one index op per batch, no collation, no copy.

    The order is ``sampler``'s (:class:`EpochShuffle`, whose epoch Lightning sets through
    ``.sampler.set_epoch`` as for a ``DataLoader``; ``None``: in order) and the augmentation of
    an :class:`InMemoryImageDataset` draws its parameters from the same global random stream, so
    a run on the CPU is bitwise the run with a ``DataLoader``.

    Args:
        dataset: an :class:`InMemoryImageDataset` or a ``TensorDataset``.
        batch_size: samples per batch (the last one may be smaller).
        sampler: the per-epoch order, or ``None``.
        device: where the split is held and the batches are drawn.
    """

    def __init__(
        self,
        dataset: InMemoryImageDataset | TensorDataset,
        batch_size: int,
        sampler: EpochShuffle | None,
        device: torch.device | str,
    ) -> None:
        self.dataset, self.batch_size, self.sampler = dataset, batch_size, sampler
        self.batch_sampler = None  # Lightning looks for a DataLoader's attributes
        self.device = torch.device(device)
        self._held: InMemoryImageDataset | tuple[torch.Tensor, ...] | None = None

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def _source(self) -> InMemoryImageDataset | tuple[torch.Tensor, ...]:
        if self._held is None:  # moved once, on the first epoch
            ds = self.dataset
            if isinstance(ds, InMemoryImageDataset):
                self._held = ds.to(self.device)
            else:
                self._held = tuple(t.to(self.device) for t in ds.tensors)
        return self._held

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        src, n = self._source(), len(self.dataset)
        if self.sampler is not None:
            s = self.sampler
            order = epoch_order(s.n, s.seed, s.epoch).to(self.device)
        else:
            order = torch.arange(n, device=self.device)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            if isinstance(src, InMemoryImageDataset):
                yield src.batch(idx)
            else:
                yield tuple(t.index_select(0, idx) for t in src)


def _identity(data: object) -> tuple[str | None, dict]:
    """A data config's (class path, init args) with a class subset unwrapped (a model of some
    classes is evaluated on its dataset's others too)."""
    if not isinstance(data, dict) or not isinstance(data.get("class_path"), str):
        return None, {}
    path, args = data["class_path"], dict(data.get("init_args") or {})
    if path.rsplit(".", 1)[-1] == "ClassSubset" and isinstance(args.get("data"), dict):
        return _identity(args["data"])
    return path, args


def data_differences(trained: object, evaluated: object) -> list[str]:
    """How the data config ``evaluated`` (a barrier's, a merge's) differs from ``trained`` (the
    models' training config) in what defines the data a model learns: the data module class
    and its :attr:`BaseDataModule.model_keys`, one line each (empty: the same data). A
    ``ClassSubset`` counts as the dataset it keeps classes of."""
    import importlib

    (a_path, a), (b_path, b) = _identity(trained), _identity(evaluated)
    if a_path is None or b_path is None:
        return []
    a_name, b_name = a_path.rsplit(".", 1)[-1], b_path.rsplit(".", 1)[-1]
    if a_name != b_name:
        return [f"data {b_name} here, {a_name} in training"]
    try:
        module, _, name = b_path.rpartition(".")
        keys = getattr(getattr(importlib.import_module(module), name), "model_keys", ())
    except Exception:  # noqa: BLE001 - a class we cannot import: the class name alone
        keys = ()
    return [
        f"data.init_args.{k}: {b[k]!r} here, {a[k]!r} in training"
        for k in keys
        if k in a and k in b and a[k] != b[k]
    ]
