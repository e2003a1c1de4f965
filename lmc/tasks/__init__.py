"""LightningModules: thin glue that calls the pure ``lmc`` algorithms at hook points."""

from lmc.tasks.classification import ClassificationTask, RegressionTask, TrainTask
from lmc.tasks.ensemble import TrainAndInterpolateTask
from lmc.tasks.interpolation import InterpolationTask
from lmc.tasks.merge import MergeTask
from lmc.tasks.ste import STEMMTask, STETask

__all__ = [
    "ClassificationTask",
    "InterpolationTask",
    "MergeTask",
    "RegressionTask",
    "STEMMTask",
    "STETask",
    "TrainAndInterpolateTask",
    "TrainTask",
]
