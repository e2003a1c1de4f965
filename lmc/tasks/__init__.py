"""LightningModules: thin glue that calls the pure ``lmc`` algorithms at hook points."""

from lmc.tasks.classification import ClassificationTask, RegressionTask, TrainTask
from lmc.tasks.ensemble import TrainAndInterpolateTask
from lmc.tasks.interpolation import InterpolationTask

__all__ = [
    "ClassificationTask",
    "InterpolationTask",
    "RegressionTask",
    "TrainAndInterpolateTask",
    "TrainTask",
]
