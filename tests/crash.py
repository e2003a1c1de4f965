"""A callback that kills a run mid-epoch (in-process stand-in for SIGKILL in resume tests)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback


class Crash(RuntimeError):
    """The simulated failure."""


class CrashAt(Callback):
    """Raise :class:`Crash` after training batch ``batch`` of epoch ``epoch`` (0-based)."""

    def __init__(self, epoch: int = 1, batch: int = 2) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.current_epoch == self.epoch and args[-1] == self.batch:
            raise Crash(f"simulated crash in epoch {self.epoch}, batch {self.batch}")
