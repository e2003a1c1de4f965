"""LightningModules: thin glue that calls the pure ``lmc`` algorithms at hook points."""

from lmc.tasks.classification import ClassificationTask, RegressionTask, TrainTask
from lmc.tasks.curves import CurveTask
from lmc.tasks.ensemble import TrainAndInterpolateTask
from lmc.tasks.interpolation import InterpolationTask
from lmc.tasks.merge import MergeTask
from lmc.tasks.pam import PAMTask
from lmc.tasks.robust import AdversarialClassificationTask
from lmc.tasks.trained_merge import TrainedMergeTask

__all__ = [
    "AdversarialClassificationTask",
    "ClassificationTask",
    "CurveTask",
    "InterpolationTask",
    "MergeTask",
    "PAMTask",
    "RegressionTask",
    "TrainAndInterpolateTask",
    "TrainTask",
    "TrainedMergeTask",
]
