"""Log the neuron-distribution entropy of every layer during training (000 Def. 2.2, §4.2)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from callbacks._utils import due, log_metrics, network
from lmc.metrics.entropy import (
    DEFAULT_BITS,
    EntropyMode,
    layer_entropies,
    out_of_range_fraction,
)
from lmc.metrics.layers import effective_weight, weight_layers


class NeuronEntropyMonitor(L.Callback):
    """Log ``entropy/<layer>`` (H̃ per element), ``entropy/max`` and ``entropy/out_of_range``.

    Logged once at fit start (the initialization, step 0) and after every ``every_n_epochs``-th
    epoch. ``entropy/out_of_range`` is the largest fraction of a layer's weights outside
    ``value_range`` (clipped into the edge bins; widen the range if it is not ~0). See
    :mod:`lmc.metrics.entropy` for the estimator.

    Args:
        bits: N, the number of bins per component is 2**N.
        value_range: fixed (low, high) of the bins, shared by all layers and epochs.
        every_n_epochs: logging cadence.
        differential: log H_Δ + ln Δ (comparable to closed forms) instead of the discrete H_Δ.
        mode: ``pooled`` (all elements of a layer in one histogram) or ``marginal``.
        layers: layer names (default every Linear/Conv layer of ``pl_module.net``).
        log_histograms: also log each layer's weight histogram to W&B loggers.
    """

    def __init__(
        self,
        bits: int = DEFAULT_BITS,
        value_range: tuple[float, float] = (-1.0, 1.0),
        every_n_epochs: int = 1,
        differential: bool = True,
        mode: EntropyMode = "pooled",
        layers: list[str] | None = None,
        log_histograms: bool = False,
    ) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.bits = bits
        self.value_range = (float(value_range[0]), float(value_range[1]))
        self.every_n_epochs = every_n_epochs
        self.differential = differential
        self.mode = mode
        self.layers = layers
        self.log_histograms = log_histograms

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None:  # a resumed run logged its initialization already
            self._log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if due(trainer, self.every_n_epochs):
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        net = network(pl_module)
        h = layer_entropies(
            net, self.bits, self.value_range, self.differential, self.mode, self.layers
        )
        weights = {n: effective_weight(m) for n, m in weight_layers(net, self.layers).items()}
        metrics = {f"entropy/{n}": v for n, v in h.items()}
        metrics["entropy/max"] = max(h.values())
        metrics["entropy/out_of_range"] = max(
            out_of_range_fraction(w, self.value_range) for w in weights.values()
        )
        log_metrics(trainer, metrics)
        if self.log_histograms and trainer.is_global_zero and not trainer.sanity_checking:
            _log_wandb_histograms(trainer, weights)


def _log_wandb_histograms(trainer: L.Trainer, weights: dict) -> None:
    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    if not loggers:
        return
    import wandb

    data = {f"weights/{n}": wandb.Histogram(w.float().cpu().numpy()) for n, w in weights.items()}
    for logger in loggers:
        logger.experiment.log({**data, "trainer/global_step": trainer.global_step})
