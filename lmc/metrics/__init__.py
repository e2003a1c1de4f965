"""Training-time measurements as pure functions (SPEC C5): no Lightning here.

- :mod:`lmc.metrics.entropy`: neuron-distribution entropy (000 Def. 2.2, Remark 2.3, App. B).
- :mod:`lmc.metrics.sharpness`: Hutchinson tr(H ⊙ θθᵀ) and tr(H) (004 §6.2, eq. 6, App. D.2).
- :mod:`lmc.metrics.sparsity`: PQ-index sparsity of weights (003 Def. 7).
- :mod:`lmc.metrics.overlap`: neuron types and the overlap of two teacher-student minima
  (003 §3; uniform minima on the manifold are drawn by :func:`lmc.models.init.sample_minimum`).
"""

from lmc.metrics.entropy import (
    DEFAULT_BITS,
    DEFAULT_RANGE,
    bin_width,
    column_entropies,
    gaussian_entropy,
    gaussian_layer_entropies,
    histogram_entropy,
    layer_entropies,
    neuron_entropy,
    out_of_range_fraction,
    uniform_entropy,
)
from lmc.metrics.layers import effective_weight, is_pruned, weight_layers
from lmc.metrics.sharpness import (
    TraceEstimate,
    exact_hessian_trace,
    hessian_matrix,
    hutchinson_trace,
    hutchinson_traces,
    rademacher_probe,
)
from lmc.metrics.sparsity import layer_pq_indices, neuron_norms, pq_index

__all__ = [
    "DEFAULT_BITS",
    "DEFAULT_RANGE",
    "TraceEstimate",
    "bin_width",
    "column_entropies",
    "effective_weight",
    "exact_hessian_trace",
    "gaussian_entropy",
    "gaussian_layer_entropies",
    "hessian_matrix",
    "histogram_entropy",
    "hutchinson_trace",
    "hutchinson_traces",
    "is_pruned",
    "layer_entropies",
    "layer_pq_indices",
    "neuron_entropy",
    "neuron_norms",
    "out_of_range_fraction",
    "pq_index",
    "rademacher_probe",
    "uniform_entropy",
    "weight_layers",
]
