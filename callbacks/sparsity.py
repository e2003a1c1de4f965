"""Log the PQ-index sparsity of every layer during training (003 Def. 7, §5)."""

from __future__ import annotations

import lightning as L

from callbacks._utils import due, log_metrics, network
from lmc.metrics.sparsity import layer_pq_indices


class PQIndexMonitor(L.Callback):
    """Log ``pq/flat/<layer>`` and ``pq/neuron/<layer>`` at fit start and every N epochs.

    ``flat`` is the PQ index of the flattened weight, ``neuron`` that of the vector of
    per-neuron norms (zero rows counted), 003 §5.

    Args:
        p: smaller norm order of the PQ index (0 < p < q).
        q: larger norm order.
        every_n_epochs: logging cadence.
        layers: layer names (default every Linear/Conv layer of ``pl_module.net``).
        norm_order: the norm taken per neuron for the ``neuron`` variant.
    """

    def __init__(
        self,
        p: float = 1.0,
        q: float = 2.0,
        every_n_epochs: int = 1,
        layers: list[str] | None = None,
        norm_order: float = 2.0,
    ) -> None:
        if not 0 < p < q:
            raise ValueError(f"the PQ index needs 0 < p < q, got p={p}, q={q}")
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.p, self.q = p, q
        self.every_n_epochs = every_n_epochs
        self.layers = layers
        self.norm_order = norm_order

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None:
            self._log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if due(trainer, self.every_n_epochs):
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pq = layer_pq_indices(network(pl_module), self.p, self.q, self.layers, self.norm_order)
        metrics = {}
        for name, (flat, neuron) in pq.items():
            metrics[f"pq/flat/{name}"] = flat
            metrics[f"pq/neuron/{name}"] = neuron
        log_metrics(trainer, metrics)
