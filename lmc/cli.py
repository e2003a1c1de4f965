"""The ``lmc`` command line: LightningCLI with model and data chosen by ``class_path``.

``lmc fit --config cfg.yaml`` trains; the fully resolved config is saved as ``config.yaml`` in the
run's own directory (next to its ``checkpoints/``), and ``lmc fit --config <that file>`` reruns
the run. ``lmc validate``/``test``/``predict`` take the same configs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.trainer.states import TrainerFn

from lmc.io import load_checkpoint
from lmc.tasks.rundir import run_dir


class RunConfigSaver(SaveConfigCallback):
    """Save ``config.yaml`` into the run's own directory (also with W&B, which shares save_dir)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        path = run_dir(trainer) / self.config_filename
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, str(path), skip_none=False, overwrite=True)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The whole resolved config (model, data, trainer, seed) into the logger's run config.
        if trainer.logger is not None:
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
            trainer.logger.log_hyperparams(dumped)


class LMCCLI(LightningCLI):
    """LightningCLI for ``lmc``: subclass mode for model and data, integer seed, safe checkpoints."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, evaluate the final weights on the test split (reporting only).",
        )

    def _parse_ckpt_path(self) -> None:
        # Check --ckpt_path before Lightning reads hyper-parameters from it, so a missing, corrupt
        # or untrusted file fails fast with a clear message before any work starts.
        sub = self.config.get("subcommand")
        ckpt = self.config[sub].get("ckpt_path") if sub else None
        if ckpt and ckpt not in ("last", "best", "hpc", "registry"):
            load_checkpoint(ckpt, mmap=True)
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        _resolve_logger_dirs(cfg)
        _check_model_checkpoints(cfg)
        # Checkpoints hold only tensors and plain containers: never unpickle arbitrary objects.
        if "weights_only" in cfg and cfg.weights_only is None:
            cfg.weights_only = True

    def after_fit(self) -> None:
        cfg = self.config[self.subcommand]
        if cfg.get("test_after_fit") and self.trainer.state.fn == TrainerFn.FITTING:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=True)


def _check_model_checkpoints(cfg: Any) -> None:
    """Read every ``model.init_args.checkpoints`` entry now, so a missing, corrupt or untrusted
    file, or endpoints of different architectures, stop the run before anything is built."""
    init_args = getattr(cfg.get("model"), "init_args", None)
    paths = init_args.get("checkpoints") if init_args is not None else None
    if not paths:
        return
    from lmc.interpolation.states import check_compatible
    from lmc.io import model_state_dict

    states = [model_state_dict(load_checkpoint(p, mmap=True)) for p in paths]  # shapes only
    check_compatible(states, [str(p) for p in paths])


def _resolve_logger_dirs(cfg: Any) -> None:
    """Give W&B loggers without ``save_dir`` the trainer's ``default_root_dir`` (else ``runs``)."""
    trainer = cfg.get("trainer")
    if trainer is None:
        return
    root = trainer.get("default_root_dir") or "runs"
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and "save_dir" in init_args and init_args.save_dir is None:
            init_args.save_dir = str(Path(root))


def build_cli(args: list[str] | None = None, run: bool = True) -> LMCCLI:
    """Parse ``args`` (default: ``sys.argv``) and, if ``run``, execute the subcommand."""
    return LMCCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        save_config_callback=RunConfigSaver,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lmc`` console script; ``args`` lets tests call it in-process."""
    exit_code = 1
    try:
        build_cli(args)
        exit_code = 0
    finally:
        _finish_wandb(exit_code)


def _finish_wandb(exit_code: int) -> None:
    """Close the W&B run so its log is complete and the next in-process run starts a new one."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
