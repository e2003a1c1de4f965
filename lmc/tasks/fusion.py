"""``lmc validate`` tasks for OTFusion and FedMA with prune-before-align (000 §5, SPEC C7): thin
glue around :func:`lmc.merging.otfusion` and :func:`lmc.merging.fedma` that writes the results
record (``summary.json``, kind ``fusion``) and logs it like the other merges."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.data.federated import client_batches, dirichlet_split
from lmc.evaluation import evaluate, has_batchnorm, reset_bn
from lmc.interpolation.states import weighted_average
from lmc.io import load_endpoints
from lmc.merging.contract import MERGE_METHODS, MergeInputs, method_options
from lmc.merging.fedma import local_train
from lmc.merging.otfusion import PruneStrategy, materialize
from lmc.results import RunRecord
from lmc.results.logging import publish, run_config
from lmc.tasks.base import (
    EvaluationTask,
    SpecSource,
    Split,
    save_task_hparams,
    split_batches,
    train_batches,
)
from lmc.tasks.rundir import run_dir


class _FusionBase(EvaluationTask):
    """Evaluation and the results record shared by the fusion tasks."""

    splits: list[str]
    max_batches: int | None

    def _report(
        self,
        net: nn.Module,
        fused: Mapping[str, Tensor],
        originals: Sequence[Mapping[str, Tensor]],
        extra: dict[str, Any],
        seconds: float,
        scalars: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        dm = self.trainer.datamodule
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
    its alignment (000 §5, Table 2). Run with ``lmc validate``.

    Args:
        net: the architecture of the checkpoints (the base's; widths of the others may differ).
        checkpoints: 2 or more ``.ckpt`` files or run folders.
        base: index of the base (target) model.
        metric: ``weight`` or ``activation`` (on the alignment subset).
        marginals: ``uniform`` or ``activation``.
        target_width: fused width of every group (default the base's).
        allow_shrink: allow a target narrower than the base.
        prune_rate: magnitude-pruning rate before alignment (0: none).
        prune_strategy: ``only_prune``, ``finetune_once`` or ``iterative`` (000 §5). At rate 0,
            ``only_prune`` fuses the dense models as they are (the plain dense fusion) and a
            fine-tuning strategy fine-tunes the dense models for its ``prune_rounds`` x
            ``finetune_epochs`` epochs before fusing them (the fine-tune-only control: the
            same training as its pruned cells, nothing pruned).
        prune_rounds: rounds of ``iterative``.
        finetune_epochs, finetune_lr: fine-tuning after each pruning (SGD, momentum 0.9, on the
            training split).
        splits: evaluated splits (``train`` = the alignment subset).
        max_batches: cap on cached batches per split.
        spec: permutation spec source (:mod:`lmc.permutation.source`).
    """

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        base: int = 0,
        metric: str = "weight",
        marginals: str = "uniform",
        target_width: int | None = None,
        allow_shrink: bool = False,
        prune_rate: float = 0.0,
        prune_strategy: PruneStrategy = "only_prune",
        prune_rounds: int = 1,
        finetune_epochs: int = 1,
        finetune_lr: float = 1e-3,
        splits: list[Split] | None = None,
        max_batches: int | None = None,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net"])
        object.__setattr__(self, "_net", net)
        self.spec_source = SpecSource(spec, net)
        self.files, self.states = load_endpoints(checkpoints, None, "model.init_args.checkpoints")
        self.base, self.metric, self.marginals = base, metric, marginals
        self.target_width, self.allow_shrink = target_width, allow_shrink
        self.prune = (prune_rate, prune_strategy, prune_rounds, finetune_epochs, finetune_lr)
        self.splits = list(splits) if splits else ["train", "test"]
        self.max_batches, self.seed = max_batches, seed

    def evaluate(self) -> None:
        with torch.inference_mode(False):
            dm = self.trainer.datamodule
            device = self.device
            rate, strategy, rounds, epochs, lr = self.prune
            inputs = MergeInputs(
                [{k: v.to(device) for k, v in s.items()} for s in self.states],
                self.spec_source.resolve(dm, device),
                net=self._net.to(device),
                reference=self.base,
                seed=self.seed,
                align_batches=split_batches(dm, ["train"], self.max_batches, device)["train"],
                train_batches=train_batches(dm, device),
            )
            res = MERGE_METHODS.get("otfusion")(
                inputs,
                metric=self.metric,
                marginals=self.marginals,
                target_width=self.target_width,
                allow_shrink=self.allow_shrink,
                prune_rate=rate,
                prune_strategy=strategy,
                prune_rounds=rounds,
                finetune_epochs=epochs,
                finetune_lr=lr,
            )
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
    clients are trained here (from one seeded init), then matched layer by layer.

    Args:
        net: the client architecture (sequential: MLP or VGG).
        clients: number of clients J.
        alpha: Dirichlet concentration of the label split.
        local_epochs: epochs each client trains before the first matching.
        epochs: local epochs after each layer's matching and per later round (000 Table 4: 20).
        rounds: communication rounds (000 Table 4: 9).
        lr, momentum, weight_decay: clients' SGD (000 Table 4: lr 0.1).
        batch_size: clients' batch size (000 Table 4: 20).
        max_width: cap on a global layer's width, a multiple of the client width.
        sigma, sigma0, gamma: BBP-MAP matching settings.
        prune_rate: magnitude-pruning rate before each matching (0: none; 000 Table 5: 0.1-0.5).
        splits, max_batches: evaluation as in :class:`OTFusionTask`.
        seed: seed of the split, the init and the clients' training.
    """

    def __init__(
        self,
        net: nn.Module,
        clients: int = 5,
        alpha: float = 0.5,
        local_epochs: int = 1,
        epochs: int = 1,
        rounds: int = 1,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        batch_size: int = 64,
        max_width: float = 1.5,
        sigma: float = 1.0,
        sigma0: float = 1.0,
        gamma: float = 1.0,
        prune_rate: float = 0.0,
        splits: list[Split] | None = None,
        max_batches: int | None = None,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net"])
        if not alpha > 0:
            raise ValueError(f"model.init_args.alpha must be > 0, got {alpha}")
        object.__setattr__(self, "_net", net)
        self.spec_source = SpecSource(spec, net)
        self.opts = dict(
            clients=clients,
            alpha=alpha,
            local_epochs=local_epochs,
            epochs=epochs,
            rounds=rounds,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            batch_size=batch_size,
            max_width=max_width,
            sigma=sigma,
            sigma0=sigma0,
            gamma=gamma,
            prune_rate=prune_rate,
        )
        self.splits = list(splits) if splits else ["train", "test"]
        self.max_batches, self.seed = max_batches, seed

    def evaluate(self) -> None:
        with torch.inference_mode(False):
            o, dm = self.opts, self.trainer.datamodule
            spec = self.spec_source.resolve(dm, self.device)
            train = [tuple(t.to(self.device) for t in b) for b in dm.train_dataloader()]
            x, y = torch.cat([b[0] for b in train]), torch.cat([b[1] for b in train])
            parts = dirichlet_split(y, o["clients"], o["alpha"], self.seed)
            batches = client_batches(x, y, parts, o["batch_size"])
            net = self._net.to(self.device)
            start = time.perf_counter()
            states = []
            for j, b in enumerate(batches):
                model = materialize(net, net.state_dict())
                local_train(
                    model,
                    b,
                    o["local_epochs"],
                    o["lr"],
                    o["momentum"],
                    o["weight_decay"],
                    seed=self.seed + j,
                )
                states.append({k: v.detach() for k, v in model.state_dict().items()})
            inputs = MergeInputs(states, spec, net=net, seed=self.seed, client_batches=batches)
            res = MERGE_METHODS.get("fedma")(
                inputs,
                **{k: o[k] for k in method_options(MERGE_METHODS.get("fedma")) if k in o},
            )
            seconds = time.perf_counter() - start
            extra = {"client_sizes": [len(p) for p in parts], "widths": res.diagnostics["widths"]}
            self._report(net, res.state, states, extra, seconds)
