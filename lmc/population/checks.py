"""What ``lmc fit --population`` refuses before any member is built: seeds, trainer options
and callbacks a population cannot reproduce, tasks that train more than ``loss(net(x), y)``,
data it cannot gather exactly, an unknown device (each named, with the way out)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lmc.data.base import BaseDataModule
from lmc.data.memory import InMemoryImageDataset
from lmc.population.pruning import PRUNING_CALLBACK, PRUNING_CALLBACK_PATHS
from lmc.tasks.classification import TrainTask

# trainer options a population reproduces: anything else set would make members differ from
# their sequential runs, so it is refused (option -> accepted values)
_TRAINER_OK: dict[str, tuple[Any, ...]] = {
    "gradient_clip_val": (None, 0, 0.0),
    "accumulate_grad_batches": (1,),
    "max_steps": (None, -1),
    "max_time": (None,),
    "fast_dev_run": (False, 0),
    "overfit_batches": (0, 0.0),
    "val_check_interval": (None,),
    "precision": (None, 32, "32", "32-true"),
    "num_nodes": (1,),
    "devices": (1, "1", "auto"),
    "strategy": ("auto",),
}
_WHY = {
    "gradient_clip_val": "clipping the norm of the stacked gradient would couple the members",
}


# callbacks that only read the network at fit start and epoch ends: a population runs them on
# every member (the values its sequential run logs); any other changes training or needs a
# Trainer, so it is refused
MEMBER_CALLBACKS = ("callbacks.NeuronEntropyMonitor", "callbacks.PQIndexMonitor")
_CALLBACK_MODULES = {
    "callbacks.entropy.NeuronEntropyMonitor": "callbacks.NeuronEntropyMonitor",
    "callbacks.sparsity.PQIndexMonitor": "callbacks.PQIndexMonitor",
}


def population_seeds(seeds: list[int] | None) -> list[int]:
    """The ``--population`` seeds, checked: a non-empty list of distinct integers."""
    if not seeds:
        raise ValueError(
            "--population: give the seeds of the members, e.g. --population '[0, 1, 2, 3]' "
            "(got an empty list)"
        )
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"--population: seeds must be integers, got {seeds}")
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        raise ValueError(
            f"--population: seed(s) {dup} given more than once; two members with one seed are "
            "the same run - give distinct seeds"
        )
    return list(seeds)


def check_trainer(trainer: Any, cfg: Any) -> None:
    """Refuse trainer and run options a population cannot reproduce, all named at once."""
    bad = [
        f"trainer.{k}={_show(trainer.get(k))} "
        f"({_WHY.get(k, 'not supported by population training')})"
        for k, ok in _TRAINER_OK.items()
        if k in trainer and trainer.get(k) not in ok
    ]
    # Lightning reads an int as a number of batches, a float as a fraction: only all batches
    # (and, for validation, none) are reproduced
    for key, ok in (("limit_train_batches", (1.0,)), ("limit_val_batches", (1.0, 0, 0.0))):
        value = trainer.get(key)
        if value is not None and (value not in ok or (value == 1 and isinstance(value, int))):
            bad.append(f"trainer.{key}={value!r} (population training uses every batch)")
    if trainer.get("max_epochs") in (-1,):
        bad.append("trainer.max_epochs=-1 (give a number of epochs)")
    for cb in trainer.get("callbacks") or []:
        path = _show(cb)
        if _CALLBACK_MODULES.get(path, path) not in MEMBER_CALLBACKS + PRUNING_CALLBACK_PATHS:
            bad.append(
                f"trainer.callbacks: {path} (a population runs no Trainer; it runs only the "
                f"measurement callbacks {', '.join(MEMBER_CALLBACKS)} and "
                f"{PRUNING_CALLBACK}, on every member)"
            )
    bad += [f"--{k}" for k in ("ckpt_path", "spawn_from", "spawn_points") if cfg.get(k)]
    if bad:
        raise ValueError(
            "--population trains every member exactly as its own `lmc fit --seed_everything s` "
            f"would, which these settings do not allow: {'; '.join(bad)}. Remove them, or train "
            "the members as separate runs"
        )


def _show(value: Any) -> str:
    """A config value for a message: class paths instead of whole namespaces."""
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_show(v) for v in value)}]"
    path = getattr(value, "class_path", None) or getattr(value, "get", lambda _k: None)(
        "class_path"
    )
    return str(path) if path else repr(value)


def train_tensors(datamodule: Any) -> tuple[Tensor, Tensor]:
    """The whole training split as tensors, refusing data a population cannot gather exactly."""
    name = type(datamodule).__name__
    if (
        not isinstance(datamodule, BaseDataModule)
        or type(datamodule).train_dataloader is not BaseDataModule.train_dataloader
    ):
        raise ValueError(
            f"--population needs one of lmc's in-memory data modules (synthetic, MNIST/CIFAR "
            f"formats) whose training order is EpochShuffle; {name} is not one: train the "
            "members as separate runs"
        )
    ds = datamodule.train_dataset
    if isinstance(ds, InMemoryImageDataset):
        if ds.augment is not None:
            raise ValueError(
                f"--population: {name} augments its training images ({ds.augment}), which "
                "draws from one global random stream per run; set data.init_args.augment=false "
                "or train the members as separate runs"
            )
        return ds.tensors()
    if isinstance(ds, TensorDataset):
        return ds.tensors[0], ds.tensors[1]
    raise ValueError(
        f"--population needs the training split in memory; {name}'s is a {type(ds).__name__}"
    )


def check_task(task: Any) -> None:
    """Refuse a task whose training is more than ``loss(net(x), y)`` with the config's optimizer
    (e.g. adversarial training, curves, merging): the population loop would not reproduce it."""
    name = type(task).__name__
    hooks = ("training_step", "_shared_step", "forward", "configure_optimizers")
    changed = [
        h
        for h in hooks
        if isinstance(task, TrainTask) and getattr(type(task), h) is not getattr(TrainTask, h)
    ]
    if not isinstance(task, TrainTask) or changed:
        why = f"overrides {', '.join(changed)}" if changed else "is not a TrainTask"
        raise ValueError(
            f"--population trains plain supervised tasks (lmc.tasks.ClassificationTask, "
            f"RegressionTask: loss of net(x) with the config's optimizer); {name} {why}: train "
            "it as separate runs"
        )
    flags = {
        "channels_last": task.channels_last,
        "compile": task.compile_net,
        "capture_step": task.capture_step,
    }
    recipes = [k for k, on in flags.items() if on]
    if recipes:
        raise ValueError(
            f"--population runs its own vectorised program, to which the speed recipes "
            f"model.init_args.{'/'.join(recipes)} do not apply: remove them (configs/speed/ "
            "overlays) or train the members as separate runs"
        )


def choose_device(accelerator: Any) -> torch.device:
    """The device of ``trainer.accelerator`` (``auto``: CUDA if present)."""
    acc = str(accelerator or "auto").lower()
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={acc} but CUDA is not available")
        return torch.device("cuda")
    if acc not in ("cpu", "auto"):
        raise ValueError(f"--population runs on cpu or cuda, not trainer.accelerator={acc}")
    return torch.device("cpu")
