"""Shared LightningModule plumbing of the ``lmc`` tasks: the evaluation splits a task caches,
the default loss of a data module, hyper-parameter saving and the evaluation-only base class."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import Any, Literal

import lightning as L
from torch import Tensor, nn
from tqdm.auto import tqdm

from lmc.engine.seam import datamodule_of, given_hyperparameters, hparams_stores
from lmc.evaluation import LossName, cache_batches
from lmc.io import drop_unserializable
from lmc.permutation.source import check_spec_source, needs_example, resolve_spec
from lmc.permutation.spec import PermutationSpec

Split = Literal["train", "val", "test"]


def split_batches(
    datamodule: Any, splits: Sequence[str], max_batches: int | None, device: Any
) -> dict[str, list]:
    """Cached batches per split; ``train`` is the fixed, un-augmented alignment subset of train."""
    loaders = {
        "train": datamodule.alignment_dataloader,
        "val": datamodule.val_dataloader,
        "test": datamodule.test_dataloader,
    }
    out = {}
    for split in splits:
        batches = cache_batches(loaders[split](), device)
        out[split] = batches[:max_batches] if max_batches else batches
    return out


def eval_and_align_batches(
    datamodule: Any, splits: Sequence[str], max_batches: int | None, device: Any
) -> tuple[dict[str, list], list]:
    """The cached evaluation splits and the alignment subset (shared with ``train`` if asked)."""
    batches = split_batches(datamodule, splits, max_batches, device)
    align = (
        batches.get("train") or split_batches(datamodule, ["train"], max_batches, device)["train"]
    )
    return batches, align


class LazyBatches(Sequence):
    """Batches read (and cached) at first use: a split only a few methods need costs nothing to
    the others, e.g. the training split of a merge method that trains."""

    def __init__(self, load: Callable[[], list]) -> None:
        self._load = load
        self._batches: list | None = None

    @property
    def batches(self) -> list:
        if self._batches is None:
            self._batches = self._load()
        return self._batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: Any) -> Any:
        return self.batches[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def train_batches(datamodule: Any, device: Any) -> LazyBatches:
    """One pass of the data module's training loader on ``device``, read at first use."""
    return LazyBatches(
        lambda: [tuple(t.to(device) for t in b) for b in datamodule.train_dataloader()]
    )


def default_loss(datamodule: Any) -> LossName:
    """``mse`` for a regression data module (``task = "regression"``), else ``cross_entropy``."""
    return (
        "mse" if getattr(datamodule, "task", "classification") == "regression" else "cross_entropy"
    )


@contextmanager
def point_progress(trainer: L.Trainer, total: int, desc: str) -> Iterator[Callable[[], None]]:
    """A progress bar over ``total`` evaluation points (alphas, curve points), shown on rank 0
    when the trainer shows its own; yields the function to call after each point."""
    show = trainer.is_global_zero and trainer.progress_bar_callback is not None
    bar = tqdm(total=total, desc=desc, disable=not show, leave=False, dynamic_ncols=True)
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()


def example_inputs(datamodule: Any, n: int = 2) -> Tensor:
    """The first ``n`` inputs of the data module's alignment subset (shapes for ``torch.fx``)."""
    batch = next(iter(datamodule.alignment_dataloader()))
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return x[:n]


class SpecSource:
    """The ``spec`` option of every task that matches (see :mod:`lmc.permutation.source`).

    ``auto`` (default) takes a built-in network's hand-written spec and derives any other
    network's with ``torch.fx``; a spec that needs no data is resolved (and checked) when the
    task is built, a derived one on first use from the data module's alignment subset.
    """

    def __init__(self, source: str, net: nn.Module, field: str = "model.init_args.spec") -> None:
        self.source = check_spec_source(source, field)
        self.net = net
        self._spec = None if needs_example(source, net) else resolve_spec(source, net)

    @property
    def known(self) -> PermutationSpec | None:
        """The spec if it is already resolved (always, unless it is derived from data)."""
        return self._spec

    def require(self, why: str) -> PermutationSpec:
        """The spec now, without data: a clear error for a spec derived from data."""
        if self._spec is None:
            raise ValueError(
                f"{why} needs the permutation spec when it is built, but spec={self.source!r} "
                f"derives the spec of {type(self.net).__name__} from data; set spec to "
                "'package.module:function' (e.g. a function calling lmc.permutation.derive_spec "
                "with an example input)"
            )
        return self._spec

    def resolve(self, datamodule: Any | None = None, device: Any = None) -> PermutationSpec:
        """The spec, derived on first call from ``datamodule``'s inputs when needed."""
        if self._spec is None:
            example = None
            if datamodule is not None:

                def example() -> Tensor:
                    return example_inputs(datamodule).to(device)

            self._spec = resolve_spec(self.source, self.net, example)
        return self._spec


def save_task_hparams(module: L.LightningModule, ignore: Sequence[str] = ()) -> None:
    """``save_hyperparameters`` that keeps checkpoints loadable with ``weights_only=True``.

    Under LightningCLI the parsed config (class paths and plain values) is stored, so
    ``load_from_checkpoint`` rebuilds injected modules and callables. Built by hand, those
    objects cannot be stored safely: the ``ignore`` arguments are left out (pass them again
    when loading).
    """
    if given_hyperparameters() is None:
        frame = inspect.currentframe()
        assert frame is not None  # None only off CPython
        module.save_hyperparameters(ignore=list(ignore), frame=frame.f_back)
        # option groups given as dataclasses are stored as plain mappings (the CLI's already are)
        for key, value in list(module.hparams.items()):
            if is_dataclass(value) and not isinstance(value, type):
                module.hparams[key] = asdict(value)
    else:
        module.save_hyperparameters()
        # the CLI's dump of the config: a class default it could not write (a functools.partial)
        # is left out, so that a resume parses the checkpoint's hyperparameters back
        for store in hparams_stores(module):
            clean = drop_unserializable(dict(store))
            store.clear()
            store.update(clean)


class LMCTask(L.LightningModule):
    """The base of every ``lmc`` task: hyper-parameters saved with :func:`save_task_hparams`
    (checkpoints load with ``weights_only=True``), and the loss its data module asks for."""

    @property
    def loss_name(self) -> LossName:
        """``mse`` for a regression data module, else ``cross_entropy``."""
        return default_loss(datamodule_of(self.trainer))


class EvaluationTask(LMCTask, ABC):
    """A task run with ``lmc validate`` that trains nothing (anomalib's Padim pattern).

    It returns no optimizer, ignores the validation batches, and calls :meth:`evaluate` once
    when the validation epoch ends (not during the sanity check).
    """

    def configure_optimizers(self) -> None:
        return None

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.evaluate()

    @abstractmethod
    def evaluate(self) -> None:
        """The task's whole measurement and logging."""
