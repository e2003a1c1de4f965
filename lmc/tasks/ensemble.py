"""Train several independently initialised copies of a network in one ``fit``, then measure
the barriers between them before and after matching (the quickstart's main job)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, cast

import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.evaluation import LossName, batch_loss
from lmc.interpolation.barrier import BarrierDefinition, check_definition
from lmc.interpolation.study import Matcher, StudyResult, interpolation_study
from lmc.models.init import reinitialize
from lmc.optim import default_optimizer
from lmc.options import as_options
from lmc.permutation.matchers import MATCHERS
from lmc.tasks.base import (
    LMCTask,
    SpecSource,
    datamodule_of,
    default_loss,
    eval_and_align_batches,
    save_task_hparams,
)
from lmc.tasks.options import PathEvaluationOptions, moved_into
from lmc.tasks.report import log_study


class TrainAndInterpolateTask(LMCTask):
    """``num_models`` copies of ``net`` with different initialisations, trained on the same
    batches by one optimizer (the models do not interact: the loss is a sum), then compared.

    Model 0 keeps ``net``'s initial weights; model ``i`` is re-initialised from a seed drawn
    from the global RNG, so ``seed_everything`` fixes all of them. When training ends, the
    interpolation study of :class:`~lmc.tasks.InterpolationTask` runs on the trained models and
    its barriers, plots, ``interpolation.png`` and ``summary.json`` are logged.

    Args:
        net: the architecture.
        num_models: how many models to train (2 gives one naive and one matched path).
        optimizer: optimizer over all models' parameters.
        loss: training/evaluation loss; default from the data module's task.
        matcher, barrier, evaluation, spec: as in :class:`~lmc.tasks.InterpolationTask`.
    """

    moved_keys: ClassVar[dict[str, str]] = moved_into("evaluation", PathEvaluationOptions)

    def __init__(
        self,
        net: nn.Module,
        num_models: int = 2,
        optimizer: OptimizerCallable = default_optimizer,
        loss: LossName | None = None,
        matcher: Matcher = "weight",
        barrier: BarrierDefinition = "chord",
        evaluation: PathEvaluationOptions | None = None,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ignore=["net", "optimizer"])
        MATCHERS.check(matcher, "model.init_args.matcher")
        self.barrier = check_definition(barrier, "model.init_args.barrier")
        if num_models < 2:
            raise ValueError(f"num_models must be at least 2, got {num_models}")
        seeds = torch.randint(0, 2**31 - 1, (num_models - 1,)).tolist()
        self.nets = nn.ModuleList([net] + [reinitialize(copy.deepcopy(net), s) for s in seeds])
        self.optimizer = optimizer
        self._loss_override = loss
        opts = as_options(PathEvaluationOptions, evaluation)
        self.matcher, self.repair, self.num_alphas = matcher, opts.repair, opts.num_alphas
        self.splits, self.max_batches = opts.splits, opts.max_batches
        self.result: StudyResult | None = None
        self.spec = SpecSource(spec, net)

    @property
    def loss_name(self) -> LossName:
        """``loss`` if given, else the data module's."""
        return self._loss_override or default_loss(datamodule_of(self.trainer))

    def _step(self, batch: Any, stage: str) -> Tensor:
        x, y = batch
        total: Tensor | float = 0.0
        for i, net in enumerate(self.nets):
            loss = batch_loss(net(x), y, self.loss_name) / x.shape[0]
            self.log(f"{stage}/loss_{i}", loss.detach(), on_step=False, on_epoch=True)
            total = total + loss
        return cast(Tensor, total)  # a sum of num_models >= 2 tensors

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer(self.parameters())

    def on_train_end(self) -> None:
        dm = datamodule_of(self.trainer)
        splits, align = eval_and_align_batches(dm, self.splits, self.max_batches, self.device)
        states = [{k: v.detach().clone() for k, v in net.state_dict().items()} for net in self.nets]
        self.result = interpolation_study(
            self.nets[0],
            states,
            splits,
            self.matcher,
            self.repair,
            align,
            self.num_alphas,
            self.loss_name,
            spec=self.spec.resolve(dm, self.device),
            barrier_definition=self.barrier,
        )
        out = log_study(self.trainer, self.result)
        s = self.result.summary
        rank_zero_info(
            f"\nBarrier between the trained models ({self.splits[-1]} split): loss "
            f"{s['barrier_loss_naive']:.4g} naive -> {s.get('barrier_loss_matched', float('nan')):.4g} "
            f"matched ({self.matcher} matching). Figure and summary: {out}\n"
        )
