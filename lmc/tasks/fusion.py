"""``lmc validate`` tasks for OTFusion and FedMA with prune-before-align (000 §5, SPEC C7): thin
glue around :func:`lmc.merging.otfusion` and :func:`lmc.merging.fedma` that writes the results
record (``summary.json``, kind ``fusion``) and logs it like the other merges."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.data.federated import client_batches, dirichlet_split
from lmc.evaluation import evaluate, has_batchnorm, reset_bn
from lmc.interpolation.states import weighted_average
from lmc.io import load_endpoints
from lmc.merging.contract import MERGE_METHODS, MergeInputs
from lmc.merging.fedma import local_train
from lmc.merging.otfusion import materialize
from lmc.options import as_options
from lmc.results import RunRecord
from lmc.results.logging import publish, run_config
from lmc.tasks.base import (
    EvaluationTask,
    SpecSource,
    datamodule_of,
    save_task_hparams,
    split_batches,
    train_batches,
)
from lmc.tasks.options import (
    ClientOptions,
    EvaluationOptions,
    FedMAOptions,
    OTFusionOptions,
    moved_into,
)
from lmc.tasks.rundir import run_dir


class _FusionBase(EvaluationTask):
    """Evaluation and the results record shared by the fusion tasks."""

    _net: nn.Module  # a template, not a submodule (set with object.__setattr__)

    def __init__(
        self, net: nn.Module, evaluation: EvaluationOptions | None, seed: int, spec: str
    ) -> None:
        super().__init__()
        object.__setattr__(self, "_net", net)  # a template, not checkpointed
        self.spec_source = SpecSource(spec, net)
        evaluation = as_options(EvaluationOptions, evaluation)
        self.splits, self.max_batches, self.seed = evaluation.splits, evaluation.max_batches, seed

    def _report(
        self,
        net: nn.Module,
        fused: Mapping[str, Tensor],
        originals: Sequence[Mapping[str, Tensor]],
        extra: dict[str, Any],
        seconds: float,
        scalars: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        dm = datamodule_of(self.trainer)
        batches = split_batches(dm, sorted({*self.splits, "train"}), self.max_batches, self.device)
        summary: dict[str, float] = dict(scalars or {})

        def measure(name: str, state: Mapping[str, Tensor], reset: bool) -> None:
            model = materialize(net, state).to(self.device)
            if reset and has_batchnorm(model):
                reset_bn(model, batches["train"])
            for split in self.splits:
                r = evaluate(model, batches[split])
                summary[f"{name}/{split}/acc"], summary[f"{name}/{split}/loss"] = r.acc, r.loss

        measure("fused", fused, True)
        for i, state in enumerate(originals):
            measure(f"originals/model{i}", state, False)
        shapes = {tuple(s[k].shape for k in s) for s in originals}
        if len(shapes) == 1:
            measure("vanilla_avg", weighted_average(originals), True)
        for split in self.splits:
            accs = [summary[f"originals/model{i}/{split}/acc"] for i in range(len(originals))]
            summary[f"originals/{split}/acc_mean"] = sum(accs) / len(accs)
        out = run_dir(self.trainer)
        if self.trainer.is_global_zero:
            record = RunRecord(
                kind="fusion",
                summary=summary,
                config=run_config(self.trainer, out),
                timings={"fusion": seconds},
                details=extra,
            )
            publish(self.trainer, record, out, {}, "fusion")
        split = self.splits[-1]
        rank_zero_info(
            f"\nFused {split} acc {summary[f'fused/{split}/acc']:.4f} (originals "
            f"{summary[f'originals/{split}/acc_mean']:.4f}); summary in {out}\n"
        )
        return summary


class OTFusionTask(_FusionBase):
    """Fuse checkpoints by OTFusion (Singh & Jaggi 2020), optionally pruning every layer before
    its alignment (000 §5, Table 2): the registered ``otfusion`` merge method, evaluated and
    logged as a fusion record. Run with ``lmc validate``.

    Args:
        net: the architecture of the checkpoints (the base's; widths of the others may differ).
        checkpoints: 2 or more ``.ckpt`` files or run folders.
        otfusion: the method's options (:class:`~lmc.tasks.options.OTFusionOptions`): ``base``,
            ``metric``, ``marginals``, ``target_width``, ``allow_shrink`` and prune-before-align
            (``prune_rate``, ``prune_strategy``, ``prune_rounds``, ``finetune_epochs``,
            ``finetune_lr``).
        evaluation: evaluated ``splits`` (``train`` = the alignment subset) and ``max_batches``.
        seed: seed of the fine-tuning.
        spec: permutation spec source (:mod:`lmc.permutation.source`).
    """

    moved_keys: ClassVar[dict[str, str]] = {
        **moved_into("otfusion", OTFusionOptions),
        **moved_into("evaluation", EvaluationOptions),
    }

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        otfusion: OTFusionOptions | None = None,
        evaluation: EvaluationOptions | None = None,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__(net, evaluation, seed, spec)
        save_task_hparams(self, ["net"])
        self.files, self.states = load_endpoints(checkpoints, None, "model.init_args.checkpoints")
        self.options = as_options(OTFusionOptions, otfusion)

    def evaluate(self) -> None:
        with torch.inference_mode(False):
            dm = datamodule_of(self.trainer)
            device = self.device
            inputs = MergeInputs(
                [{k: v.to(device) for k, v in s.items()} for s in self.states],
                self.spec_source.resolve(dm, device),
                net=self._net.to(device),
                seed=self.seed,
                align_batches=split_batches(dm, ["train"], self.max_batches, device)["train"],
                train_batches=train_batches(dm, device),
            )
            res = MERGE_METHODS.get("otfusion")(inputs, **asdict(self.options))
            self._report(
                self._net,
                res.state,
                self.states,
                {"checkpoints": self.files, "widths": res.diagnostics["widths"]},
                res.diagnostics["seconds"],
                {"finetune/epochs_per_model": res.diagnostics["finetune/epochs_per_model"]},
            )


class FedMATask(_FusionBase):
    """Federated learning with FedMA (Wang et al. 2020) on a Dirichlet non-IID split, optionally
    pruning the clients before each matching (000 §5, Tables 4-5). Run with ``lmc validate``: the
    clients are trained here (from one seeded init, with FedMA's SGD settings), then merged by
    the registered ``fedma`` merge method.

    Args:
        net: the client architecture (sequential: MLP or VGG).
        federated: the clients (:class:`~lmc.tasks.options.ClientOptions`): ``clients`` (J),
            ``alpha`` (Dirichlet concentration), ``local_epochs`` before the first matching and
            ``batch_size`` (000 Table 4: 20).
        fedma: the method's options (:class:`~lmc.tasks.options.FedMAOptions`): ``rounds`` (000
            Table 4: 9), ``epochs`` after each matching (20), the clients' SGD ``lr`` (0.1),
            ``momentum``, ``weight_decay``, BBP-MAP ``sigma``, ``sigma0``, ``gamma``,
            ``max_width`` and ``prune_rate`` (000 Table 5: 0.1-0.5).
        evaluation: evaluation as in :class:`OTFusionTask`.
        seed: seed of the split, the init and the clients' training.
        spec: permutation spec source (:mod:`lmc.permutation.source`).
    """

    moved_keys: ClassVar[dict[str, str]] = {
        **moved_into("federated", ClientOptions),
        **moved_into("fedma", FedMAOptions),
        **moved_into("evaluation", EvaluationOptions),
    }

    def __init__(
        self,
        net: nn.Module,
        federated: ClientOptions | None = None,
        fedma: FedMAOptions | None = None,
        evaluation: EvaluationOptions | None = None,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__(net, evaluation, seed, spec)
        save_task_hparams(self, ["net"])
        self.clients = as_options(ClientOptions, federated)
        self.options = as_options(FedMAOptions, fedma)

    def evaluate(self) -> None:
        with torch.inference_mode(False):
            c, o, dm = self.clients, self.options, datamodule_of(self.trainer)
            spec = self.spec_source.resolve(dm, self.device)
            train = [tuple(t.to(self.device) for t in b) for b in dm.train_dataloader()]
            x, y = torch.cat([b[0] for b in train]), torch.cat([b[1] for b in train])
            parts = dirichlet_split(y, c.clients, c.alpha, self.seed)
            batches = client_batches(x, y, parts, c.batch_size)
            net = self._net.to(self.device)
            start = time.perf_counter()
            states = []
            for j, b in enumerate(batches):
                model = materialize(net, net.state_dict())
                local_train(
                    model, b, c.local_epochs, o.lr, o.momentum, o.weight_decay, seed=self.seed + j
                )
                states.append({k: v.detach() for k, v in model.state_dict().items()})
            inputs = MergeInputs(states, spec, net=net, seed=self.seed, client_batches=batches)
            res = MERGE_METHODS.get("fedma")(inputs, **asdict(o))
            seconds = time.perf_counter() - start
            extra = {"client_sizes": [len(p) for p in parts], "widths": res.diagnostics["widths"]}
            self._report(net, res.state, states, extra, seconds)
