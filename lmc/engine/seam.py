"""Every use of a private Lightning name, in one place (issue 49 item 3).

lmc leans on a few of Lightning's private steps and attributes where no public API does the
job. Each is reached only through this module, under a public name, and listed in
:data:`PRIVATE_NAMES` with the signature it is used with; ``tests/engine/test_seam.py`` fails
when the installed Lightning no longer has one of them as used here, and a scan of ``lmc/``
and ``callbacks/`` fails when a private Lightning name is used anywhere else. CI runs the fast
subset of the suite against the lowest Lightning the pin allows (``.ci/run``) as well as the
newest, so a release that changes one of them is seen before a user meets it.

This module imports Lightning alone (no other part of lmc), so every floor may import it
(``tests/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.core.mixins import hparams_mixin

#: ``(owner, name)`` -> the parameters each private function or method is called with here, or
#: ``None`` for an attribute (of instances, or of a module). The owner is a class or a module.
PRIVATE_NAMES: dict[tuple[str, str], tuple[str, ...] | None] = {
    ("lightning.pytorch.cli.LightningCLI", "_parse_ckpt_path"): ("self",),
    ("lightning.pytorch.cli.LightningCLI", "_set_seed"): ("self",),
    ("lightning.pytorch.cli.LightningCLI", "_instantiate_trainer"): ("self", "config", "callbacks"),
    ("lightning.pytorch.cli.LightningCLI", "_prepare_subcommand_kwargs"): ("self", "subcommand"),
    ("lightning.pytorch.cli.LightningCLI", "_run_subcommand"): ("self", "subcommand"),
    ("lightning.pytorch.cli.LightningCLI", "_parser"): ("self", "subcommand"),
    ("lightning.pytorch.callbacks.TQDMProgressBar", "_should_update"): ("self", "current", "total"),
    ("lightning.pytorch.core.optimizer.LightningOptimizer", "_on_before_step"): None,
    ("lightning.pytorch.core.optimizer.LightningOptimizer", "_on_after_step"): None,
    ("lightning.pytorch.loggers.WandbLogger", "_wandb_init"): None,
    ("lightning.pytorch.loggers.WandbLogger", "_offline"): None,
    ("lightning.pytorch.loggers.WandbLogger", "_experiment"): None,
    ("lightning.pytorch.loggers.CSVLogger", "_experiment"): None,
    ("lightning.pytorch.core.LightningModule", "_hparams"): None,
    ("lightning.pytorch.core.LightningModule", "_hparams_initial"): None,
    ("lightning.pytorch.core.mixins.hparams_mixin", "_given_hyperparameters"): None,
    ("lightning.pytorch.core.mixins.hparams_mixin", "_given_hyperparameters_context"): (
        "hparams",
        "instantiator",
    ),
    ("lightning.pytorch.core.LightningModule", "_log_hyperparams"): None,
    ("lightning.pytorch.core.LightningDataModule", "_log_hyperparams"): None,
}


class SeamCLI(LightningCLI):
    """``LightningCLI`` with the private steps lmc changes under public names.

    A subclass overrides the public name and calls ``super()`` for Lightning's own step:
    :meth:`parse_checkpoint_path` (the checkpoint's hyper-parameters replace the given
    ones), :meth:`set_seed`, :meth:`build_trainer` (the Trainer from its config and the
    callbacks), :meth:`subcommand_kwargs` (the arguments of ``trainer.fit(...)``),
    :meth:`run_subcommand`; :meth:`subcommand_parser` is a subcommand's parser.
    """

    def _parse_ckpt_path(self) -> None:
        self.parse_checkpoint_path()

    def parse_checkpoint_path(self) -> None:
        """Lightning: the hyper-parameters of ``--ckpt_path`` replace the model's config."""
        super()._parse_ckpt_path()

    def _set_seed(self) -> None:
        self.set_seed()

    def set_seed(self) -> None:
        """Lightning: seed everything with ``seed_everything`` of the config."""
        super()._set_seed()

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        return self.build_trainer(config, callbacks)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """Lightning: the Trainer built from its config and ``callbacks``."""
        return super()._instantiate_trainer(config, callbacks)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        return self.subcommand_kwargs(subcommand)

    def subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """Lightning: the keyword arguments of the subcommand's Trainer method."""
        return super()._prepare_subcommand_kwargs(subcommand)

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)

    def run_subcommand(self, subcommand: str) -> None:
        """Lightning: run the subcommand with its hooks (``before_fit``, ``trainer.fit``, ...)."""
        super()._run_subcommand(subcommand)

    def subcommand_parser(self, subcommand: str | None) -> Any:
        """The parser of ``subcommand`` (the whole parser for ``None``)."""
        return self._parser(subcommand)


class SeamProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose redraw decision is the public :meth:`should_redraw`."""

    def _should_update(self, current: int, total: int | float) -> bool:
        return self.should_redraw(current, total)

    def should_redraw(self, current: int, total: int | float) -> bool:
        """Lightning: redraw every ``refresh_rate`` batches and on the last."""
        return super()._should_update(current, total)  # type: ignore[arg-type]  # Lightning says int; passes tqdm's float total


@contextmanager
def counted_step(optimizer: Any) -> Iterator[None]:
    """Around a step of the torch optimizer inside ``optimizer`` (a ``LightningOptimizer``)
    taken by hand: Lightning's step count and profiler section, as its manual loop has them."""
    optimizer._on_before_step()
    yield
    optimizer._on_after_step()


def wandb_init(logger: Any) -> dict[str, Any]:
    """The keyword arguments a Lightning ``WandbLogger`` gives ``wandb.init``."""
    return logger._wandb_init


def wandb_offline(logger: Any) -> bool:
    """Whether a Lightning ``WandbLogger`` was built with ``offline=True``."""
    return bool(logger._offline)


def experiment_started(logger: Any) -> bool:
    """Whether a Lightning logger has made its experiment (a W&B run, a CSV writer): reading
    ``logger.experiment`` would make it."""
    return logger._experiment is not None


def set_experiment(logger: Any, experiment: Any) -> None:
    """Give a Lightning logger its experiment before it makes one (e.g. a CSV writer that
    continues a file)."""
    logger._experiment = experiment


def hparams_stores(module: Any) -> list[dict[str, Any]]:
    """A LightningModule's saved hyper-parameters and its initial copy (those that exist)."""
    stores = [getattr(module, "_hparams", None), getattr(module, "_hparams_initial", None)]
    return [s for s in stores if s is not None]


def given_hyperparameters() -> Any:
    """The hyper-parameters LightningCLI gives the class being instantiated (``None`` outside
    the CLI's instantiation)."""
    return hparams_mixin._given_hyperparameters.get()


def given_hyperparameters_context(hparams: dict[str, Any], instantiator: str) -> Any:
    """The context in which LightningCLI instantiates a class with ``hparams`` (so that its
    ``save_hyperparameters()`` stores them and its checkpoint can rebuild it)."""
    return hparams_mixin._given_hyperparameters_context(hparams, instantiator)


def log_config_only(*modules: Any) -> None:
    """Keep the Trainer from logging these modules' saved hyper-parameters at fit start: the
    CLI logs the whole resolved config (``model``, ``data``, ``trainer``, ...) to the run, and
    the task's own copy under its bare names (``net``, ``optimizer``, ...) would put every model
    option in the run's config twice."""
    for module in modules:
        if module is not None:
            module._log_hyperparams = False


def datamodule_of(trainer: Trainer) -> Any:
    """``trainer.datamodule``: the data module of the running ``fit`` / ``validate`` (a public
    attribute Lightning sets on the trainer but does not declare on its class)."""
    return trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning, undeclared
