"""Training LightningModules: thin glue around an injected ``nn.Module``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal, cast

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanSquaredError, Metric, MetricCollection

from lmc.optim import default_optimizer
from lmc.tasks.base import LMCTask, save_task_hparams
from lmc.tasks.capture import CapturedStep, capture_problems
from lmc.tasks.direct import direct_step, direct_step_allowed

STAGES = ("train", "val", "test")


class BatchMean(Metric):
    """The sample-weighted mean of per-batch values (a stage's mean loss), without a host sync.

    ``torchmetrics.MeanMetric`` asks the device whether a value is NaN on every update and
    copies an integer weight to the device, two waits per training step on a GPU, which keep
    the CPU from queueing the next step (issue 30); here a NaN loss makes the mean NaN, so a
    diverged epoch shows as one. States are summed across processes.
    """

    full_state_update = False
    total: Tensor
    count: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, value: Tensor, n: int) -> None:
        # in place (``add_``, not ``+=``): the same sums without re-assigning the states through
        # nn.Module.__setattr__ on every step
        self.total.add_(value.detach().to(self.total.dtype) * n)
        self.count.add_(n)

    def compute(self) -> Tensor:
        return self.total / self.count


class Accuracy(Metric):
    """Top-1 accuracy over an epoch: the fraction of targets at their output's largest entry
    (classes on dim 1; torchmetrics' micro ``MulticlassAccuracy``, equal to it on the same
    batches) in five device ops a step and no host sync, where the confusion-matrix route of
    ``MulticlassAccuracy`` launches a dozen (issue 30). States are summed across processes.

    Args:
        num_classes: the outputs' size on dim 1, checked on every update (a shape, no sync).
    """

    full_state_update = False
    correct: Tensor
    total: Tensor

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.add_state("correct", torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, output: Tensor, target: Tensor) -> None:
        if output.ndim < 2 or output.shape[1] != self.num_classes:
            raise ValueError(
                f"the network gives outputs of shape {tuple(output.shape)}, but the task has "
                f"num_classes={self.num_classes} (classes on dim 1): set num_classes to the "
                "network's number of outputs"
            )
        self.correct.add_((output.argmax(1) == target).sum())  # in place, as BatchMean's
        self.total.add_(target.numel())

    def compute(self) -> Tensor:
        return self.correct / self.total


# Configs saved before the default moved to lmc.optim name this path: keep it importable.
_adam = default_optimizer


class TrainTask(LMCTask, ABC):
    """Supervised training of ``net`` with an optimizer and LR scheduler from the config.

    Subclasses choose the loss and metrics. Metrics are logged as ``{stage}/{name}`` (e.g.
    ``train/loss``, ``val/acc``, ``test/acc``), one ``MetricCollection`` cloned per stage.

    Args:
        net: the network, injected from the config (``class_path``/``init_args``).
        optimizer: callable building the optimizer from parameters (default Adam, lr 1e-3).
        lr_scheduler: optional callable building an LR scheduler from the optimizer.
        scheduler_interval: step the scheduler every ``epoch`` or every optimizer ``step``.
        channels_last: hold the network's 4-D weights and the image batches in channels-last
            memory format (faster convolutions on GPUs with tensor cores; same values).
        compile: ``torch.compile`` the network's forward in place (state-dict keys unchanged),
            once, before the optimizer is built.
        capture_step: record the training step (forward, loss, backward, optimizer step) as a
            CUDA graph and replay it for every batch of that shape (:mod:`lmc.tasks.capture`:
            what it needs of a run is checked before training).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        channels_last: bool = False,
        compile: bool = False,
        capture_step: bool = False,
    ) -> None:
        super().__init__()
        save_task_hparams(self, ignore=["net", "optimizer", "lr_scheduler"])
        self.net = net
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.scheduler_interval = scheduler_interval
        self.channels_last = channels_last
        self.compile_net = compile
        self._compiled = False
        self.capture_step = capture_step
        self._captured_step: CapturedStep | None = None
        self._direct_step = False  # backward and step without Lightning's hooks (on_fit_start)
        metrics = self.build_metrics()
        # ModuleDict keys cannot be "train" (it is a Module method), hence the suffix.
        self.metrics = nn.ModuleDict({f"{s}_": metrics.clone(prefix=f"{s}/") for s in STAGES})
        self.losses = nn.ModuleDict({f"{s}_": BatchMean() for s in STAGES})

    @abstractmethod
    def build_metrics(self) -> MetricCollection:
        """The metrics logged for every stage."""

    @abstractmethod
    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """The training objective for a batch."""

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning names the running hook here around every hook call, ~40 times a training
        # step; nn.Module.__setattr__'s checks for parameters, modules and buffers cost more than
        # a small network's step on a GPU, and a string is none of them (issue 30)
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def configure_model(self) -> None:
        """The speed recipes (``configs/speed/``): channels-last weights, ``torch.compile``."""
        if self.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net and not self._compiled:
            self.net.compile()
            self._compiled = True

    def _layout(self, batch: Any) -> tuple[Tensor, Tensor]:
        x, y = batch
        if self.channels_last and x.ndim == 4:  # image batches as the weights: NHWC
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def _shared_step(self, batch: Any, stage: str) -> Tensor:
        x, y = self._layout(batch)
        out = self(x)
        loss = self.loss(out, y)
        self._record(stage, out, loss, y)
        return loss

    def _record(self, stage: str, out: Tensor, loss: Tensor, y: Tensor) -> None:
        """Update the stage's epoch loss and metrics with a batch (and log the step's loss)."""
        losses, metrics = self._stage_metrics(stage)
        losses.update(loss.detach(), y.shape[0])
        metrics.update(out.detach(), y)
        if stage == "train" and self._logging_step():
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False)

    def _stage_metrics(self, stage: str) -> tuple[BatchMean, MetricCollection]:
        """The stage's epoch loss and metrics."""
        return (
            cast(BatchMean, self.losses[f"{stage}_"]),
            cast(MetricCollection, self.metrics[f"{stage}_"]),
        )

    def _logging_step(self) -> bool:
        """Whether the trainer writes step metrics after this step (``log_every_n_steps``);
        logging a value on the other steps would only cost time (Lightning drops it)."""
        connector = getattr(self._trainer, "_logger_connector", None)
        return connector is None or bool(connector.should_update_logs)

    def _log_epoch(self, stage: str) -> None:
        """Log the epoch's ``{stage}/loss`` and metrics, then reset them.

        The metrics are updated every step and logged once here: ``self.log`` of a metric
        object on every step costs Lightning ~1 ms of bookkeeping per call, which is a large
        share of a small network's step. ``compute`` syncs the metric states across processes.
        """
        losses, metrics = self._stage_metrics(stage)
        if not losses.update_called:
            return
        values = {f"{stage}/loss": losses.compute(), **metrics.compute()}
        for name, value in values.items():
            # the progress bar shows the losses, and the metrics outside training
            bar = stage != "train" or name == f"{stage}/loss"
            self.log(name, value, on_step=False, on_epoch=True, prog_bar=bar)
        losses.reset()
        metrics.reset()

    @property
    def automatic_optimization(self) -> bool:
        """``False`` while this task steps its optimizer itself (the lean step, issue 30):
        whenever ``training_step`` is this class's own and the trainer asks for neither gradient
        clipping nor accumulation (Lightning's, which need its automatic loop). The same
        arithmetic as Lightning's automatic loop (zero the gradients, forward, backward through
        the precision plugin, step, the LR scheduler at its interval), without its per-step
        closure machinery: ~0.5 ms a step on a GPU host, a large share of a small network's step.
        """
        if not self._automatic_optimization:  # a subclass or Lightning turned it off
            return False
        trainer = self._trainer
        return not (
            type(self).training_step is TrainTask.training_step
            and trainer is not None
            and not trainer.gradient_clip_val
            and trainer.accumulate_grad_batches == 1
        )

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.automatic_optimization:
            return self._shared_step(batch, "train")
        optimizer = cast(LightningOptimizer, self.optimizers())  # configure_optimizers: one
        x, y = self._layout(batch)
        replayed = self._captured_step(optimizer, (x, y)) if self._captured_step else None
        if replayed is None:
            optimizer.zero_grad()  # set_to_none, as Lightning's optimizer_zero_grad
            out = self(x)
            loss = self.loss(out, y)
            if self._direct_step:
                direct_step(optimizer, loss)
            else:
                self.manual_backward(loss)
                optimizer.step()
        else:
            out, loss = replayed
        self._record("train", out, loss, y)
        if self.lr_scheduler is not None:
            # where Lightning's loop steps it: after every step, or after the epoch's last one
            trainer = self.trainer
            last = trainer.is_last_batch or batch_idx + 1 == trainer.num_training_batches
            if self.scheduler_interval == "step" or last:
                cast(LRScheduler, self.lr_schedulers()).step()  # the one configured
        return loss.detach()

    def on_fit_start(self) -> None:
        self._direct_step = direct_step_allowed(self, self.trainer)
        if self.capture_step:
            problems = capture_problems(self, self.trainer)
            if problems:
                raise ValueError("capture_step: " + "; ".join(problems))
            self._captured_step = CapturedStep(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Carry the optimizer-step count across the two loops: a checkpoint counts its steps in
        the loop that ran (automatic, or this task's lean step), and the resumed run reads the
        count of the loop it runs, so each is set to the larger (``global_step``, ``max_steps``
        and the logging steps continue where the run stopped)."""
        fit = checkpoint.get("loops", {}).get("fit_loop", {})
        auto = fit.get("epoch_loop.automatic_optimization.optim_progress")
        manual = fit.get("epoch_loop.manual_optimization.optim_step_progress")
        if not auto or not manual:
            return
        step = auto["optimizer"]["step"]
        for part in ("total", "current"):
            for count in ("ready", "completed"):
                n = max(step[part][count], manual[part][count])
                step[part][count] = manual[part][count] = n

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is None:
            return optimizer
        scheduler = self.lr_scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval},
        }


class ClassificationTask(TrainTask):
    """Cross-entropy classification; logs ``loss`` and ``acc`` per stage.

    Args:
        num_classes: number of classes for the accuracy metric.
        label_smoothing: cross-entropy label smoothing (0 in every paper recipe).
        channels_last, compile, capture_step: the speed recipes, see :class:`TrainTask`.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        compile: bool = False,
        capture_step: bool = False,
    ) -> None:
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        super().__init__(
            net, optimizer, lr_scheduler, scheduler_interval, channels_last, compile, capture_step
        )

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"acc": Accuracy(self.num_classes)})

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        return nn.functional.cross_entropy(output, target, label_smoothing=self.label_smoothing)


class RegressionTask(TrainTask):
    """Mean-squared-error regression (teacher-student, polynomial tasks); logs ``loss`` and ``mse``.

    The loss is ``0.5 * MSE`` when ``half_mse`` (the convention of 003's objective), else MSE;
    ``channels_last``, ``compile`` and ``capture_step`` are the speed recipes of :class:`TrainTask`.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        half_mse: bool = False,
        channels_last: bool = False,
        compile: bool = False,
        capture_step: bool = False,
    ) -> None:
        self.half_mse = half_mse
        super().__init__(
            net, optimizer, lr_scheduler, scheduler_interval, channels_last, compile, capture_step
        )

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"mse": MeanSquaredError()})

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        mse = nn.functional.mse_loss(output, target)
        return 0.5 * mse if self.half_mse else mse
