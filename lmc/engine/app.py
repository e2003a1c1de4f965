"""``lmc fit|validate|test|predict``: LightningCLI with model and data chosen by ``class_path``.

``lmc fit --config cfg.yaml`` trains; the fully resolved config is saved as ``config.yaml`` in the
run's own directory (next to its ``checkpoints/``), and ``lmc fit --config <that file>`` reruns
the run. ``lmc validate``/``test``/``predict`` take the same configs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import lightning as L
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lmc.engine.arguments import (
    check_model_checkpoints,
    check_spawn_from,
    config_differences,
    config_file_error,
)
from lmc.engine.errors import LMCArgumentParser, condensed_error, quiet_third_party
from lmc.engine.moved import merge_mapping_args, moved_keys_error
from lmc.engine.progress import ProgressBar
from lmc.engine.resume import (
    AtomicCheckpointIO,
    LogsForResume,
    RandomStateCheckpoint,
    SpawnPoints,
    continue_run,
    keep_logged_rows,
    resumable_runs,
    run_of_config,
    same_experiment,
)
from lmc.engine.seam import SeamCLI, datamodule_of, log_config_only
from lmc.io import atomic_write, config_to_save, drop_unserializable, load_checkpoint
from lmc.shipped import resolve_shipped
from lmc.tasks.rundir import run_dir


class RunConfigSaver(SaveConfigCallback):
    """Save ``config.yaml`` into the run's own directory (also with W&B, which shares save_dir),
    atomically, and never over an existing one (a resumed run keeps its config)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # the run's config below is the whole config: the task's hyper-parameters once, under
        # model.init_args, not again under their bare names
        dm = datamodule_of(trainer)
        log_config_only(pl_module, dm)
        if self.already_saved:
            return
        path = run_dir(trainer) / self.config_filename
        if trainer.is_global_zero and not path.exists():  # a resumed run keeps its config
            self._dumped = self.parser.dump(self.config, skip_none=False)  # one dump for both
            atomic_write(path, lambda f: f.write(config_to_save(self._dumped)), mode="w")
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The whole resolved config (model, data, trainer, seed) into the logger's run config.
        if trainer.logger is not None:
            text = getattr(self, "_dumped", None) or self.parser.dump(self.config, skip_none=False)
            trainer.logger.log_hyperparams(drop_unserializable(yaml.safe_load(text)))


#: the options ``lmc`` adds to LightningCLI's: (name, type, default, help)
RUN_OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    (
        "test_after_fit",
        bool,
        False,
        "After `fit`, evaluate the final weights on the test split (reporting only).",
    ),
    (
        "study",
        Optional[dict[str, Any]],  # noqa: UP045 (jsonargparse reads it)
        None,
        "Set by `lmc study run`: the study's name, the job's stage, id and grid coordinates; a "
        "W&B logger gets them as group, job_type and config.",
    ),
    (
        "spawn_points",
        Optional[list[int]],  # noqa: UP045
        None,
        "`fit`: save a full checkpoint after each of these epochs (0: before training) as "
        "checkpoints/spawn/epoch=<k>.ckpt, for runs started with --spawn_from.",
    ),
    (
        "spawn_from",
        Optional[str],  # noqa: UP045
        None,
        "`fit`: start from this checkpoint's weights, optimizer and epoch (e.g. "
        "<run>/checkpoints/spawn/epoch=2.ckpt) with this run's own seed, so data order and "
        "noise follow --seed_everything; ignored when --ckpt_path resumes this run.",
    ),
    (
        "population",
        Optional[list[int]],  # noqa: UP045
        None,
        "`fit`: train one member per seed as one vectorised run (torch.func), each exactly the "
        "run `--seed_everything <seed>` would be; members are written as run folders "
        "<run>/members/seed=<s>/ (lmc.population).",
    ),
    (
        "fresh_if_nothing_to_resume",
        bool,
        False,
        "With `--ckpt_path last`: start a new run when there is no run to resume (otherwise "
        "that is an error).",
    ),
)


class LMCCLI(SeamCLI):
    """LightningCLI for ``lmc``: subclass mode for model and data, integer seed, safe checkpoints."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        for name, kind, default, text in RUN_OPTIONS:
            parser.add_argument(f"--{name}", type=kind, default=default, help=text)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        # Name the new key of a config key that moved (e.g. grouped options) before jsonargparse
        # rejects it as unknown without saying where it went.
        given = sys.argv[1:] if args is None else args
        try:  # a shipped config named lmc:NAME, read from the package
            shipped = resolve_shipped(given)
        except ValueError as err:
            parser.error(str(err))
        if shipped != list(given):
            given = shipped
            if args is None:
                sys.argv[1:] = shipped
            else:
                args = shipped
        message = moved_keys_error(given)
        message = message or config_file_error(given)
        if message:
            parser.error(message)
        # a dotted key into a mapping option sets one entry, not the whole mapping
        merged = merge_mapping_args(given)
        if merged != list(given):
            if args is None:  # the command line itself (Lightning warns when given both)
                sys.argv[1:] = merged
            else:
                args = merged
        super().parse_arguments(parser, args)

    def parse_checkpoint_path(self) -> None:
        # Check --ckpt_path before Lightning reads hyper-parameters from it, so a missing, corrupt
        # or untrusted file fails fast with a clear message before any work starts.
        sub = self.config.get("subcommand")
        ckpt = self.config[sub].get("ckpt_path") if sub else None
        spawn = self.config[sub].get("spawn_from") if sub else None
        self._spawning = bool(spawn) and not ckpt
        if self._spawning:
            assert spawn is not None  # _spawning says it is set
            check_spawn_from(spawn, sub, (self.config[sub].get("trainer") or {}).get("max_epochs"))
        if sub == "fit" and ckpt and (ckpt == "last" or Path(ckpt).is_dir()):
            ckpt = self.config[sub].ckpt_path = self._resume_checkpoint(self.config[sub], ckpt)
        if ckpt and ckpt not in ("last", "best", "hpc", "registry"):
            hparams = load_checkpoint(ckpt, mmap=True).get("hyper_parameters") or {}
            # a checkpoint written before options moved: name the new keys, not a union error
            old = {k: v for k, v in hparams.items() if k != "_class_path"}
            model = {"class_path": hparams.get("_class_path"), "init_args": old}
            message = moved_keys_error({"model": model}) if model["class_path"] else None
            if message:
                raise ValueError(
                    f"{ckpt} was written before some options of its task moved: {message} Its "
                    "weights still load (lmc.io.load_checkpoint, model_state_dict); give the new "
                    "keys in the config and leave --ckpt_path out, or rerun the run."
                )
        before = self._model_config(sub)
        super().parse_checkpoint_path()  # the checkpoint's hyper-parameters replace the given ones
        changed = config_differences(before, self._model_config(sub), "model")
        if changed and sub == "fit":
            shown = "; ".join(
                f"{k}: {given!r} given, {kept!r} in the checkpoint"
                for k, given, kept in changed[:6]
            )
            raise ValueError(
                f"--ckpt_path {ckpt} resumes its run with the model options it was trained with, "
                f"and these given ones differ (they would be ignored): {shown}. Leave them out "
                "to resume, or start a new run from those weights with --spawn_from <checkpoint "
                "file> (its own folder and seed)"
            )
        if changed:
            rank_zero_warn(
                f"--ckpt_path {ckpt}: the checkpoint's model options are used, not the given "
                f"{', '.join(k for k, _, _ in changed)}"
            )

    def _model_config(self, sub: str | None) -> Any:
        """The ``model`` part of the config as plain YAML values (``None`` if it cannot be
        written out)."""
        if not sub:
            return None
        try:
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        except Exception:  # noqa: BLE001 - not comparable: Lightning's behaviour alone
            return None
        return (dumped.get(sub) or {}).get("model")

    def _resume_checkpoint(self, cfg: Any, ckpt: str) -> str | None:
        """``last`` or a run folder -> the run's ``last.ckpt``, with the loggers pointed at that
        run (same folder, same W&B run); ``None`` to start fresh when asked to."""
        if ckpt != "last":
            folder = Path(ckpt)
            return self._continue(cfg, folder.parent if folder.name == "checkpoints" else folder)
        run = run_of_config([str(p) for p in cfg.get("config") or []])
        root = _logger_root(cfg)
        if run is None:
            current = yaml.safe_load(self.subcommand_parser("fit").dump(cfg, skip_none=False))
            current = drop_unserializable(current)
            for candidate in resumable_runs(root):
                saved = yaml.safe_load((candidate / "config.yaml").read_text())
                if same_experiment(saved, current):
                    run = candidate
                    break
        if run is not None:
            return self._continue(cfg, run)
        if cfg.get("fresh_if_nothing_to_resume"):
            return None
        raise FileNotFoundError(
            f"--ckpt_path last: no run to resume under {root} (a run folder with "
            "checkpoints/last.ckpt and the same model, data and seed). Start fresh without "
            "--ckpt_path (or add --fresh_if_nothing_to_resume true), resume a run explicitly with "
            "--config <run>/config.yaml --ckpt_path last, or give --ckpt_path <run folder or file>"
        )

    def _continue(self, cfg: Any, run: Path) -> str:
        """Continue ``run``: its loggers pointed at it, its ``last.ckpt`` the checkpoint, whose
        logged rows the run keeps (:meth:`before_fit`)."""
        self._continuing = str(continue_run(cfg, run))
        return self._continuing

    def before_fit(self) -> None:
        continuing = getattr(self, "_continuing", None)
        if continuing is not None:
            keep_logged_rows(self.trainer, continuing)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> L.Trainer:
        # Every fit saves last.ckpt (what --ckpt_path last resumes), atomically, with the random
        # state inside (RandomStateCheckpoint), so a resumed run continues exactly.
        given = [*(config.get("callbacks") or []), *callbacks]
        checkpoints = [c for c in given if isinstance(c, ModelCheckpoint)]
        if config.get("enable_checkpointing", True) is not False:
            if not checkpoints:
                callbacks = [*callbacks, ModelCheckpoint(save_last=True)]
            for c in checkpoints:
                c.save_last = True if c.save_last is None else c.save_last
        # the bar a user sees, redrawn ten times a second rather than after every batch
        if config.get("enable_progress_bar", True) is not False and not any(
            isinstance(c, LightningProgressBar) for c in given
        ):
            callbacks = [*callbacks, ProgressBar()]
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        if cfg.get("spawn_points"):
            end = config.get("max_epochs")
            late = [k for k in cfg.spawn_points if isinstance(end, int) and 0 <= end < k]
            if late:
                raise ValueError(
                    f"--spawn_points {late}: past the end of training (trainer.max_epochs="
                    f"{config.get('max_epochs')}), so they would never be saved; give points "
                    "up to max_epochs"
                )
            callbacks = [*callbacks, SpawnPoints(list(cfg.spawn_points))]
        callbacks = [
            *callbacks,
            RandomStateCheckpoint(restore=not getattr(self, "_spawning", False)),
            LogsForResume(),
        ]
        # one spelling of the run's folders whatever the command line said (relative or
        # absolute), so that a resumed run knows its own last.ckpt (lmc.engine.resume)
        if config.get("default_root_dir"):
            config["default_root_dir"] = os.path.abspath(config["default_root_dir"])
        plugins = config.get("plugins")
        plugins = (
            [] if plugins is None else list(plugins) if isinstance(plugins, list) else [plugins]
        )
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().build_trainer(config, callbacks)

    def subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        kwargs = super().subcommand_kwargs(subcommand)
        if getattr(self, "_spawning", False):  # start where the parent run was, own seed
            kwargs["ckpt_path"] = self.config_init[subcommand].spawn_from
        return kwargs

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        root = (cfg.get("trainer") or {}).get("default_root_dir")
        if root and Path(root).exists() and not Path(root).is_dir():
            raise ValueError(
                f"--trainer.default_root_dir {root} is a file: give a folder (made if missing), "
                "where the run folders go"
            )
        _resolve_logger_dirs(cfg)
        _study_to_wandb(cfg)
        check_model_checkpoints(cfg)
        # Checkpoints hold only tensors and plain containers: never unpickle arbitrary objects.
        if "weights_only" in cfg and cfg.weights_only is None:
            cfg.weights_only = True

    def instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        if cfg.get("population") is None:
            super().instantiate_classes()
            return
        if self.subcommand not in ("fit", None):  # None: built with run=False
            raise ValueError(
                f"--population trains members: it is for `lmc fit`, not {self.subcommand}"
            )
        from lmc.population.fit import PopulationFit

        self.population = PopulationFit(self)  # builds every member now; no Trainer

    def run_subcommand(self, subcommand: str) -> None:
        if getattr(self, "population", None) is not None:
            self.population.run()
            return
        super().run_subcommand(subcommand)

    def after_validate(self) -> None:
        # The task's closing line (what it measured, where its figure and summary went) last,
        # after Lightning's table of logged metrics.
        line = getattr(self.model, "report_line", None)
        if line:
            rank_zero_info(line)

    def after_fit(self) -> None:
        cfg = self.config[self.subcommand]
        if cfg.get("test_after_fit") and self.trainer.state.fn == TrainerFn.FITTING:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=True)
        # the folder later commands take (--model.init_args.checkpoints, --config, --ckpt_path)
        folder = run_dir(self.trainer)
        rank_zero_info(
            f"Run folder: {folder} (rerun: lmc fit --config {folder / 'config.yaml'}; resume: "
            "add --ckpt_path last)"
        )


def _loggers(cfg: Any) -> list[Any]:
    trainer = cfg.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    return [g for g in (loggers if isinstance(loggers, list) else [loggers]) if g is not None]


def _study_to_wandb(cfg: Any) -> None:
    """A study job's W&B run: ``group`` = the study, ``job_type`` = its stage (unless the
    config sets them); its ``study`` entry (grid coordinates) is in the logged config."""
    study = cfg.get("study")
    if not study:
        return
    for logger in _loggers(cfg):
        init_args = getattr(logger, "init_args", None)
        if init_args is None or not str(getattr(logger, "class_path", "")).endswith("WandbLogger"):
            continue
        if "group" in init_args and init_args.group is None:
            init_args.group = study.get("name")
        if "job_type" in init_args and init_args.job_type is None:
            init_args.job_type = study.get("stage")


def _logger_root(cfg: Any) -> Path:
    """Where the runs of ``cfg`` land: its first logger's ``save_dir``, else the trainer's
    ``default_root_dir``, else ``runs``."""
    trainer = cfg.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    first = loggers[0] if isinstance(loggers, list) and loggers else loggers
    init = getattr(first, "init_args", None)
    if init is not None and init.get("save_dir"):
        return Path(init.save_dir)
    return Path((trainer.get("default_root_dir") if trainer is not None else None) or "runs")


def _resolve_logger_dirs(cfg: Any) -> None:
    """Give every logger without ``save_dir`` the trainer's ``default_root_dir`` (else
    ``runs``), as an absolute path; the saved config keeps ``null`` there, so reruns follow
    their own root."""
    trainer = cfg.get("trainer")
    if trainer is None:
        return
    root = os.path.abspath(trainer.get("default_root_dir") or "runs")
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and "save_dir" in init_args and init_args.save_dir is None:
            init_args.save_dir = root


def cli_kwargs() -> dict[str, Any]:
    """The arguments every ``lmc`` LightningCLI is built with (also the studies' parse-only
    check): subclass mode, integer seed, config saving, no prefix matching of options."""
    return {
        "model_class": L.LightningModule,
        "datamodule_class": L.LightningDataModule,
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "seed_everything_default": 0,
        "save_config_callback": RunConfigSaver,
        "save_config_kwargs": {"overwrite": True},
        "auto_configure_optimizers": False,
        "parser_class": LMCArgumentParser,
        # no prefix matching: --trainer.max_epoch must not silently mean max_epochs
        "parser_kwargs": {
            "prog": "lmc",
            "allow_abbrev": False,
            **{sub: {"allow_abbrev": False} for sub in ("fit", "validate", "test", "predict")},
        },
    }


def build_cli(args: list[str] | None = None, run: bool = True) -> LMCCLI:
    """Parse ``args`` (default: ``sys.argv``) and, if ``run``, execute the subcommand."""
    return LMCCLI(**cli_kwargs(), args=args, run=run)


def main(args: list[str] | None = None) -> None:
    """``lmc fit|validate|test|predict``; ``args`` lets tests call it in-process.

    From the console, an error that stops the run is printed as its one relevant line
    (``LMC_DEBUG=1`` shows the full traceback); in-process callers get the exception.
    """
    from lmc.registry import load_plugins

    quiet_third_party()
    exit_code = 1
    try:
        load_plugins()  # a study job's process: the user's registrations ($LMC_PLUGINS)
        build_cli(args)
        exit_code = 0
    except Exception as err:
        if args is not None or os.environ.get("LMC_DEBUG"):
            raise
        sys.stderr.write(
            f"lmc: error: {condensed_error(err)}\n(LMC_DEBUG=1 shows the full traceback)\n"
        )
        raise SystemExit(1) from None
    finally:
        _finish_wandb(exit_code)


def _finish_wandb(exit_code: int) -> None:
    """Close the W&B run so its log is complete and the next in-process run starts a new one."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
