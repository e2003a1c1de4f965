"""Interpolation, barriers, BatchNorm reset and REPAIR: pure functions, no Lightning."""

from lmc.evaluation import EvalResult, cache_batches, evaluate, has_batchnorm, reset_bn
from lmc.interpolation.barrier import (
    BARRIER_DEFINITIONS,
    Barrier,
    alpha_grid,
    barrier,
    check_definition,
    loss_barrier,
)
from lmc.interpolation.repair import (
    average_stats,
    channel_stats,
    interpolate_stats,
    repair,
    repair_points,
)
from lmc.interpolation.states import check_compatible, lerp_state, load_lerp_, weighted_average
from lmc.interpolation.study import (
    PathResult,
    StudyResult,
    interpolate_path,
    interpolation_study,
    match_states,
)

__all__ = [
    "BARRIER_DEFINITIONS",
    "check_definition",
    "PathResult",
    "StudyResult",
    "interpolate_path",
    "interpolation_study",
    "match_states",
    "Barrier",
    "EvalResult",
    "alpha_grid",
    "average_stats",
    "barrier",
    "cache_batches",
    "channel_stats",
    "check_compatible",
    "evaluate",
    "has_batchnorm",
    "interpolate_stats",
    "lerp_state",
    "load_lerp_",
    "loss_barrier",
    "repair",
    "repair_points",
    "reset_bn",
    "weighted_average",
]
