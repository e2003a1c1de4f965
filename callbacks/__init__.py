"""Thin Lightning callbacks over the pure ``lmc`` measurements and pruning (SPEC C5).

Add them under ``trainer.callbacks`` with full class paths, e.g.
``class_path: callbacks.NeuronEntropyMonitor``; see ``configs/callbacks/``.
"""

from callbacks.barrier import BarrierMonitor
from callbacks.entropy import NeuronEntropyMonitor
from callbacks.pruning import MagnitudePruning
from callbacks.sharpness import SharpnessMonitor
from callbacks.sparsity import PQIndexMonitor

__all__ = [
    "BarrierMonitor",
    "MagnitudePruning",
    "NeuronEntropyMonitor",
    "PQIndexMonitor",
    "SharpnessMonitor",
]
