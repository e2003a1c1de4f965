"""LightningModules: thin glue that calls the pure ``lmc`` algorithms at hook points."""

from lmc.tasks.classification import ClassificationTask, RegressionTask, TrainTask

__all__ = ["ClassificationTask", "RegressionTask", "TrainTask"]
