"""A population member's files and logs, as its sequential twin's ``lmc fit`` leaves them:
its checkpoints and config written in threads, its config and ``hparams.yaml`` texts from the
first member's with its own seed, its loggers (CSV in its folder, W&B a run of its own), and the
stand-ins a measurement callback reads for one member (:mod:`lmc.population.fit` uses them)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from lmc.engine.seam import wandb_init, wandb_offline
from lmc.io import atomic_write
from lmc.loggers import WandbLogger as LmcWandbLogger

#: member folders written at once by :meth:`PopulationFit._write_members`
WRITERS = 8


def write_member(folder: Path, config: str, ckpt: dict[str, Any], names: Sequence[str]) -> None:
    """One member's ``config.yaml`` and its checkpoint under each of ``names`` (serialised
    once: the files are byte for byte the same), each written atomically and flushed."""
    atomic_write(folder / "config.yaml", lambda f: f.write(config), mode="w")
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    data = buffer.getbuffer()
    for name in names:
        atomic_write(folder / "checkpoints" / name, lambda f: f.write(data))


def member_configs(first: str) -> Callable[[int], str]:
    """Member ``seed``'s ``config.yaml`` (or ``hparams.yaml``) from the first member's: the
    same text with its own top-level ``seed_everything``. The substitution is checked once, by
    parsing (the members' texts differ only in that integer)."""
    parts = re.split(r"^seed_everything: .*$", first, maxsplit=1, flags=re.M)
    probe = 2**31 - 7
    text = f"seed_everything: {probe}".join(parts) if len(parts) == 2 else first
    if len(parts) != 2 or yaml.safe_load(text).get("seed_everything") != probe:
        raise RuntimeError(f"cannot set the member seed_everything in the config:\n{first}")
    before, after = parts
    return lambda seed: f"{before}seed_everything: {seed}{after}"


class MetricSink:
    """A logger stand-in that keeps what a callback logs."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics |= {k: float(v) for k, v in metrics.items() if k != "epoch"}


@dataclass
class MemberTrainer:
    """What a measurement callback reads of its Trainer, for one member at one point."""

    current_epoch: int
    global_step: int
    max_epochs: int
    loggers: list[MetricSink]
    sanity_checking: bool = False
    is_global_zero: bool = True
    ckpt_path: None = None


def member_logger(main: Logger, folder: Path, seed: int) -> Logger | None:
    """A logger of ``main``'s kind writing into the member folder ``folder``: CSV straight
    into it (``folder/metrics.csv``), W&B as a run of its own named ``<run>-seed=<seed>`` in
    the population run's group (the study's, else the population run's id); ``None`` for
    other kinds (their per-member columns stay in the population's run)."""
    if isinstance(main, WandbLogger):
        init = wandb_init(main)
        return LmcWandbLogger(
            name=f"{init.get('name') or 'population'}-seed={seed}",
            save_dir=str(folder),
            project=init.get("project") or "lmc",
            offline=wandb_offline(main),
            tags=[*(init.get("tags") or []), "population-member"],
            group=init.get("group") or f"population-{main.version}",
            job_type=init.get("job_type"),
        )
    if isinstance(main, CSVLogger):
        return CSVLogger(str(folder.parent), name=folder.name, version="")
    return None


def plain_values(obj: Any) -> Any:
    """Hyper-parameters as plain containers (loadable with ``weights_only=True``)."""
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {k: plain_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_values(v) for v in obj]
    return obj
