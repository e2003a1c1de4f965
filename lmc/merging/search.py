"""Merge methods that train (STE-MM, STE, Sinkhorn re-basin): one module interface, one loop.

A trained merge method is registered with ``trains=True`` (:data:`~lmc.merging.MERGE_METHODS`)
and builds a :class:`MergeSearch` from :class:`~lmc.merging.MergeInputs` and its keyword
options: an ``nn.Module`` whose parameters an optimizer trains, with

* :meth:`MergeSearch.step_loss`: one training step's loss on a batch (the caller
  back-propagates it and steps the optimizer);
* :meth:`MergeSearch.result`: the :class:`~lmc.merging.Merged` model once training ends;
* optionally :meth:`~MergeSearch.output` (the current merge's output, for validation),
  :meth:`~MergeSearch.step_logs` (values logged every step, e.g. a temperature) and
  :meth:`~MergeSearch.timers` (cumulative seconds, logged per epoch).

The same search runs in two places: ``lmc fit`` with :class:`lmc.tasks.TrainedMergeTask`
(Lightning's logs, checkpoints and resume; the task's optimizer) and :func:`train_search`, the
one plain loop (notebooks, benchmarks; :func:`~lmc.merging.ste_mm`,
:func:`~lmc.merging.sinkhorn_rebasin` and :func:`train_merge` run through it).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmc.evaluation import LossName
from lmc.merging.contract import MERGE_METHODS, Merged, MergeInputs

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Progress:
    """Where a training step stands: ``step`` (0-based optimizer step) of ``total`` (``None``
    when the length of the run is not known)."""

    step: int
    total: int | None


class MergeSearch(nn.Module, ABC):
    """What a trained merge method builds (see the module docstring).

    Attributes:
        lr: the learning rate of Adam, the optimizer used when none is given (the method's
            paper setting).
        n: the number of models merged.
    """

    lr: ClassVar[float] = 1e-3
    n: int

    @abstractmethod
    def step_loss(self, x: Tensor, y: Tensor, loss: LossName, progress: Progress) -> Tensor:
        """One training step's loss on the batch ``(x, y)``."""

    @abstractmethod
    def result(self) -> Merged:
        """The merged model once training ended (permutations included where the method
        permutes)."""

    def output(self, x: Tensor) -> Tensor | None:
        """The current merge's output on ``x`` (validation), or ``None`` where the search has
        none."""
        return None

    def step_logs(self) -> dict[str, float]:
        """Values of the last step to log (e.g. the temperature)."""
        return {}

    def timers(self) -> dict[str, float]:
        """Cumulative seconds of the search's own parts (e.g. ``wm_seconds``)."""
        return {}


@dataclass
class SearchRun:
    """Outcome of :func:`train_search`.

    Attributes:
        merged: the search's result.
        losses: the training batch losses in order.
        epoch_seconds: wall time of every epoch.
        timers: per epoch, the seconds of each of the search's timers spent in it.
        logs: per step, the search's step logs.
    """

    merged: Merged
    losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    timers: list[dict[str, float]] = field(default_factory=list)
    logs: list[dict[str, float]] = field(default_factory=list)


def adam(lr: float) -> OptimizerFactory:
    """Adam at ``lr`` (the default optimizer of a search, at its :attr:`MergeSearch.lr`)."""
    return lambda params: torch.optim.Adam(params, lr=lr)


def train_search(
    search: MergeSearch,
    batches: Iterable[Any],
    *,
    epochs: int = 1,
    optimizer: OptimizerFactory | None = None,
    max_steps: int | None = None,
    loss: LossName = "cross_entropy",
) -> SearchRun:
    """Train a search as a plain loop: ``epochs`` passes over ``batches``.

    Args:
        search: the search (on the device to run on).
        batches: a re-iterable of ``(x, y)`` batches (a DataLoader or a list).
        epochs: passes over ``batches``.
        optimizer: builds the optimizer from the search's parameters (default Adam at the
            search's :attr:`~MergeSearch.lr`).
        max_steps: stop after this many steps in total.
        loss: ``cross_entropy`` or ``mse``/``half_mse``.

    Returns:
        The search's result, with the losses, the epochs' seconds and the step logs.
    """
    device = next(iter(search.parameters())).device
    opt = (optimizer or adam(search.lr))(search.parameters())
    total = epochs * len(batches) if isinstance(batches, Sized) else None
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)
    losses: list[float] = []
    epoch_seconds: list[float] = []
    timers: list[dict[str, float]] = []
    logs: list[dict[str, float]] = []
    step = 0
    for _ in range(epochs):
        start, before = time.perf_counter(), search.timers()
        for x, y in batches:
            if total is not None and step >= total:
                break
            value = search.step_loss(x.to(device), y.to(device), loss, Progress(step, total))
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            losses.append(float(value.detach()))
            logs.append(search.step_logs())
            step += 1
        epoch_seconds.append(time.perf_counter() - start)
        timers.append({k: v - before.get(k, 0.0) for k, v in search.timers().items()})
    return SearchRun(search.result(), losses, epoch_seconds, timers, logs)


def build_search(inputs: MergeInputs, name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The search of the trained method ``name`` over ``inputs`` with its ``options``.

    Raises:
        ValueError: ``name`` is not registered or does not train.
    """
    entry = MERGE_METHODS.entry(name)
    if not entry.trains:
        raise ValueError(f"merge method {name!r} does not train: call it, it returns the merge")
    return entry.fn(inputs, **dict(options or {}))


def train_merge(
    inputs: MergeInputs,
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    epochs: int = 1,
    optimizer: OptimizerFactory | None = None,
    max_steps: int | None = None,
) -> SearchRun:
    """Build the trained method ``name``'s search over ``inputs`` and train it on the inputs'
    training batches with :func:`train_search` (the plain-loop twin of ``lmc fit`` with
    :class:`lmc.tasks.TrainedMergeTask`)."""
    search = build_search(inputs, name, options)
    return train_search(
        search,
        inputs.need("train_batches", name),
        epochs=epochs,
        optimizer=optimizer,
        max_steps=max_steps,
        loss=inputs.loss,
    )
