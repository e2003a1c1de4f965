"""Tiny in-memory data, a CPU Trainer with a CSV logger, and read-back of what was logged."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lmc.models import MLP
from lmc.tasks import ClassificationTask

IN, OUT = 8, 3


class TinyData(L.LightningDataModule):
    """64 seeded Gaussian points in 3 classes, with a fixed alignment subset like lmc.data."""

    def __init__(self, n: int = 64, batch_size: int = 16) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, IN, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
        self.train, self.val = TensorDataset(x, y), TensorDataset(x[:32], y[:32])
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    def alignment_dataloader(self, batch_size: int | None = None) -> DataLoader:
        return DataLoader(self.val, batch_size=batch_size or self.batch_size)


def tiny_task(seed: int = 0) -> ClassificationTask:
    torch.manual_seed(seed)
    net = MLP(IN, OUT, width=16, depth=2)
    return ClassificationTask(net, OUT, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))


def read_metrics(log_dir: str | Path) -> list[dict[str, float]]:
    """Rows of the CSV logger's metrics.csv, empty cells dropped."""
    with open(Path(log_dir) / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def series(rows: Sequence[dict[str, float]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every row that logged ``key``."""
    return [(int(r["step"]), r[key]) for r in rows if key in r]


@pytest.fixture
def fit(tmp_path) -> Callable[..., tuple[L.Trainer, ClassificationTask, list[dict[str, float]]]]:
    """``fit(callbacks, max_epochs=2, **trainer_kwargs)`` -> (trainer, task, logged rows)."""

    def run(callbacks: list[L.Callback], max_epochs: int = 2, task: Any = None, **kwargs: Any):
        task = task if task is not None else tiny_task()
        ckpt_path = kwargs.pop("ckpt_path", None)
        options = {
            "accelerator": "cpu",
            "max_epochs": max_epochs,
            "logger": CSVLogger(tmp_path, name="csv"),
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "default_root_dir": tmp_path,
            "log_every_n_steps": 1,
            "num_sanity_val_steps": 0,
        }
        trainer = L.Trainer(callbacks=callbacks, **{**options, **kwargs})
        trainer.fit(task, datamodule=TinyData(), ckpt_path=ckpt_path)
        csv_logger = isinstance(trainer.logger, CSVLogger)
        return trainer, task, read_metrics(trainer.logger.log_dir) if csv_logger else []

    return run
