"""The Lightning seam (lmc/engine/seam.py, issue 49 item 3): every private Lightning name lmc
uses exists in the installed Lightning as used there, and no other module of lmc or of the
callbacks uses one."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.loggers import CSVLogger, WandbLogger

import lmc
from lmc.engine import seam

ROOT = Path(lmc.__file__).parent
SOURCES = [*sorted(ROOT.rglob("*.py")), *sorted((ROOT.parent / "callbacks").glob("*.py"))]


def _owner(path: str):
    """A class or module from its dotted path."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


class _Task(LightningModule):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()


def _instance(owner: type, tmp_path: Path):
    """An instance of ``owner`` on which its instance attributes exist."""
    if owner is LightningOptimizer:
        return LightningOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    if owner is WandbLogger:
        return WandbLogger(save_dir=str(tmp_path), offline=True, name="seam")
    if owner is CSVLogger:
        return CSVLogger(str(tmp_path))
    if owner is LightningModule:
        return _Task()
    if owner is LightningDataModule:
        return LightningDataModule()
    raise AssertionError(f"no instance recipe for {owner}")


@pytest.mark.parametrize("owner_name", list(seam.PRIVATE_NAMES), ids="/".join)
def test_every_private_name_is_in_the_installed_lightning_as_the_seam_uses_it(owner_name, tmp_path):
    path, name = owner_name
    params = seam.PRIVATE_NAMES[owner_name]
    owner = _owner(path)
    if params is not None:  # a method or function, called with these parameters
        fn = getattr(owner, name, None)
        assert callable(fn), f"{path}.{name} is gone: update lmc/engine/seam.py"
        assert tuple(inspect.signature(fn).parameters) == params, (
            f"{path}.{name}{inspect.signature(fn)} changed: update lmc/engine/seam.py"
        )
    elif inspect.ismodule(owner):
        assert hasattr(owner, name), f"{path}.{name} is gone: update lmc/engine/seam.py"
    else:  # an attribute of instances
        assert hasattr(_instance(owner, tmp_path), name), f"{path} objects have no {name}"


def _private_uses(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` imports a private name from Lightning, or reads, sets or overrides one
    of ``names`` (the seam's) on anything but its own instance."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
            found += [(node.lineno, f"imports {a.name}") for a in node.names if a.name[0] == "_"]
        elif isinstance(node, ast.Attribute) and node.attr in names:
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own or node.attr in OVERRIDDEN:
                found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.ClassDef):
            found += [
                (item.lineno, f"overrides {item.name}")
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name in OVERRIDDEN
            ]
    return [f"{line}: {what}" for line, what in sorted(found)]


#: the seam's private methods a subclass would override (a ``self._x`` of these is Lightning's)
OVERRIDDEN = {n for (_, n), params in seam.PRIVATE_NAMES.items() if params and params[0] == "self"}


def test_no_module_but_the_seam_uses_a_private_lightning_name():
    names = {n for _, n in seam.PRIVATE_NAMES}
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{where}"
        for path in SOURCES
        if path != Path(seam.__file__)
        for where in _private_uses(path, names)
    ]
    assert not wrong, "use lmc.engine.seam instead:\n" + "\n".join(wrong)


def test_the_scan_sees_each_kind_of_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from lightning.pytorch.loggers.utilities import _log_hyperparams\n"
        "class CLI:\n"
        "    def _run_subcommand(self, subcommand):\n"
        "        return super()._run_subcommand(subcommand)\n"
        "def f(logger):\n"
        "    return logger._wandb_init\n"
    )
    names = {n for _, n in seam.PRIVATE_NAMES}
    assert _private_uses(bad, names) == [
        "1: imports _log_hyperparams",
        "3: overrides _run_subcommand",
        "4: ._run_subcommand",
        "6: ._wandb_init",
    ]


def test_the_seam_imports_no_other_part_of_lmc():
    tree = ast.parse(Path(seam.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in imported if m.split(".")[0] == "lmc"]


def test_the_logger_helpers_read_what_lightning_keeps(tmp_path):
    wandb = WandbLogger(save_dir=str(tmp_path), offline=True, name="seam", project="p")
    assert seam.wandb_init(wandb)["name"] == "seam" and seam.wandb_init(wandb)["project"] == "p"
    assert seam.wandb_offline(wandb) is True
    assert not seam.experiment_started(wandb)  # nothing made until .experiment is read
    csv = CSVLogger(str(tmp_path / "csv"))
    assert not seam.experiment_started(csv)
    marker = object()
    seam.set_experiment(csv, marker)
    assert seam.experiment_started(csv) and csv.experiment is marker


def test_the_hyperparameter_helpers(tmp_path):
    task = _Task(width=5)
    stores = seam.hparams_stores(task)
    assert [dict(s) for s in stores] == [{"width": 5}, {"width": 5}]
    assert seam.given_hyperparameters() is None  # outside the CLI's instantiation
    with seam.given_hyperparameters_context({"width": 7}, "lmc.test"):
        assert seam.given_hyperparameters()["width"] == 7
        assert dict(_Task(width=7).hparams) == {"width": 7, "_instantiator": "lmc.test"}


def test_a_counted_step_calls_lightnings_step_hooks():
    opt = LightningOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    calls = []
    opt._on_before_step = lambda: calls.append("before")
    opt._on_after_step = lambda: calls.append("after")
    with seam.counted_step(opt):
        calls.append("step")
    assert calls == ["before", "step", "after"]


def test_log_config_only_keeps_the_trainer_from_logging_the_modules_hyperparameters():
    task, data = _Task(), LightningDataModule()
    data.save_hyperparameters({"batch_size": 8})  # a data module that saved some
    assert task._log_hyperparams and data._log_hyperparams  # logged by default
    seam.log_config_only(task, data, None)  # no data module: nothing to do for it
    assert not task._log_hyperparams and not data._log_hyperparams
