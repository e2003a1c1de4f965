"""Log loss sharpness tr(H ⊙ θθᵀ) and tr(H) during training (004 §6.2, eq. 6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import lightning as L
import torch
from torch import Tensor

from callbacks._utils import due, log_metrics, network
from lmc.engine.seam import datamodule_of
from lmc.metrics.sharpness import Batch, hutchinson_traces


class SharpnessMonitor(L.Callback):
    """Hutchinson estimates on a fixed data subset, logged as ``sharpness/*`` every N epochs.

    Logs ``sharpness/weighted_trace`` (tr(H ⊙ θθᵀ)) and ``sharpness/trace`` (tr(H)), each with
    a ``_se`` standard error. The subset is the first ``num_samples`` examples of the data
    module's ``alignment_dataloader`` (fixed order, un-augmented) or of the validation loader,
    taken once and reused, so every epoch and model sees the same data, probes and seed. The
    loss is ``pl_module.loss(net(x), y)`` evaluated in eval mode.

    Args:
        num_probes: Rademacher probes per estimate (>= 2 for a standard error).
        num_samples: size of the fixed data subset.
        batch_size: batch size of the Hessian-vector products.
        every_n_epochs: cadence (after the epoch; also once at fit start if ``at_fit_start``).
        seed: seed of the probes.
        source: ``alignment`` (the data module's alignment subset) or ``val``.
        weighted: estimate tr(H ⊙ θθᵀ).
        plain: estimate tr(H).
        at_fit_start: also log the value at initialization.
    """

    def __init__(
        self,
        num_probes: int = 10,
        num_samples: int = 1024,
        batch_size: int = 256,
        every_n_epochs: int = 1,
        seed: int = 0,
        source: Literal["alignment", "val"] = "alignment",
        weighted: bool = True,
        plain: bool = True,
        at_fit_start: bool = False,
    ) -> None:
        if num_probes < 1 or num_samples < 1 or batch_size < 1 or every_n_epochs < 1:
            raise ValueError("num_probes, num_samples, batch_size, every_n_epochs must be >= 1")
        if not (weighted or plain):
            raise ValueError("enable at least one of weighted and plain")
        if source not in ("alignment", "val"):
            raise ValueError(f"source must be 'alignment' or 'val', got {source!r}")
        self.num_probes, self.num_samples, self.batch_size = num_probes, num_samples, batch_size
        self.every_n_epochs, self.seed, self.source = every_n_epochs, seed, source
        self.kinds = tuple(k for k, on in (("weighted", weighted), ("plain", plain)) if on)
        self.at_fit_start = at_fit_start
        self._batches: list[Batch] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_fit_start and trainer.ckpt_path is None:
            self._log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if due(trainer, self.every_n_epochs):
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._batches is None:
            self._batches = self._subset(trainer, pl_module.device)
        # the task's loss(output, target) method (nn.Module's __getattr__ types it a tensor)
        loss = cast(Callable[[Tensor, Tensor], Tensor], pl_module.loss)
        est = hutchinson_traces(
            network(pl_module),
            loss,
            self._batches,
            self.num_probes,
            self.seed,
            self.kinds,
        )
        names = {"weighted": "weighted_trace", "plain": "trace"}
        metrics = {}
        for kind, e in est.items():
            metrics[f"sharpness/{names[kind]}"] = e.mean
            metrics[f"sharpness/{names[kind]}_se"] = e.stderr
        log_metrics(trainer, metrics)

    def _subset(self, trainer: L.Trainer, device: torch.device) -> list[Batch]:
        dm = datamodule_of(trainer)
        if self.source == "alignment" and hasattr(dm, "alignment_dataloader"):
            loader = dm.alignment_dataloader(self.batch_size)
        elif self.source == "val" and dm is not None:
            loader = dm.val_dataloader()
        elif self.source == "val" and trainer.val_dataloaders is not None:
            loader = trainer.val_dataloaders
        else:
            raise RuntimeError(
                f"SharpnessMonitor(source={self.source!r}) found no such data: pass a data module "
                "with alignment_dataloader(batch_size) (every lmc.data module has one) or use "
                "source='val' with a validation loader"
            )
        xs: list[Tensor] = []
        ys: list[Tensor] = []
        for x, y in loader:
            xs.append(x)
            ys.append(y)
            if sum(len(t) for t in xs) >= self.num_samples:
                break
        x, y = torch.cat(xs)[: self.num_samples], torch.cat(ys)[: self.num_samples]
        return [
            (xb.to(device), yb.to(device))
            for xb, yb in zip(x.split(self.batch_size), y.split(self.batch_size))
        ]
