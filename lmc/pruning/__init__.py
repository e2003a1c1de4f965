"""Magnitude pruning and the pruning strategies of 000 §4.3 / A.3 (SPEC C5), no Lightning here.

:mod:`lmc.pruning.magnitude` prunes on ``torch.nn.utils.prune``; :mod:`lmc.pruning.schedule`
turns a strategy into pruning events; :mod:`lmc.pruning.study` runs offline sweeps with a
pluggable barrier function. The Lightning glue is ``callbacks.MagnitudePruning``.
"""

from lmc.pruning.magnitude import (
    apply_masks,
    dense_snapshot,
    fold_masks,
    get_masks,
    layer_sparsity,
    magnitude_mask,
    make_permanent,
    num_pruned,
    prune_magnitude,
    rewind,
)
from lmc.pruning.schedule import STRATEGIES, PruneEvent, pruning_events, rate_schedule
from lmc.pruning.study import barrier_vs_rate, pruned_copy

__all__ = [
    "STRATEGIES",
    "PruneEvent",
    "apply_masks",
    "barrier_vs_rate",
    "dense_snapshot",
    "fold_masks",
    "get_masks",
    "layer_sparsity",
    "magnitude_mask",
    "make_permanent",
    "num_pruned",
    "prune_magnitude",
    "pruned_copy",
    "pruning_events",
    "rate_schedule",
    "rewind",
]
