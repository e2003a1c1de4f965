"""OTFusion and FedMA as merge methods (000 §5, SPEC C7): the ``otfusion`` and ``fedma`` entries
of :data:`~lmc.merging.MERGE_METHODS`, with prune-before-align and its fine-tuning on the
training split. The algorithms are :func:`lmc.merging.otfusion.otfusion` and
:func:`lmc.merging.fedma.fedma`.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch import nn

from lmc.merging.contract import MERGE_METHODS, Merged, MergeInputs
from lmc.merging.fedma import fedma, local_train
from lmc.merging.otfusion import Metric, PruneStrategy, Pruning, otfusion


@MERGE_METHODS.register("otfusion", paper="Singh & Jaggi 2020; 000 §5")
def otfusion_merge(
    inputs: MergeInputs,
    *,
    base: int | None = None,
    metric: Metric = "weight",
    marginals: str = "uniform",
    target_width: int | None = None,
    allow_shrink: bool = False,
    prune_rate: float = 0.0,
    prune_strategy: PruneStrategy = "only_prune",
    prune_rounds: int = 1,
    finetune_epochs: int = 1,
    finetune_lr: float = 1e-3,
) -> Merged:
    """OTFusion (Singh & Jaggi 2020) onto model ``base`` (default the inputs' reference), every
    layer optionally magnitude-pruned before its alignment (000 §5, Table 2).

    ``prune_strategy`` ``finetune_once``/``iterative`` fine-tune each pruned model with SGD
    (momentum 0.9) for ``finetune_epochs`` at ``finetune_lr`` on the training split; at rate 0
    they fine-tune the dense models as much (the fine-tune-only control), while ``only_prune``
    at rate 0 fuses the dense models as they are. Diagnostics: ``widths``, ``seconds`` and
    ``finetune/epochs_per_model``.
    """
    net = inputs.net
    tuned: list[int] = []  # the epochs of every fine-tuning call
    pruning = None
    if prune_strategy != "only_prune":  # also at rate 0: the fine-tune-only control
        step = functools.partial(
            local_train,
            batches=inputs.need("train_batches", "otfusion"),
            epochs=finetune_epochs,
            lr=finetune_lr,
            seed=inputs.seed,
        )

        def tune(model: nn.Module) -> None:
            tuned.append(finetune_epochs)
            step(model)

        pruning = Pruning(prune_rate, prune_strategy, prune_rounds, tune)
    elif prune_rate > 0:
        pruning = Pruning(prune_rate)
    start = time.perf_counter()
    res = otfusion(
        inputs.states,
        inputs.spec,
        net=net,
        base=inputs.reference if base is None else base,
        metric=metric,
        batches=inputs.align_batches,
        marginals=marginals,
        target_width=target_width,
        allow_shrink=allow_shrink,
        pruning=pruning,
    )
    diagnostics = {
        "widths": res.widths,
        "seconds": time.perf_counter() - start,
        "finetune/epochs_per_model": sum(tuned) / len(inputs.states),
    }
    return Merged(res.state, None, diagnostics)


@MERGE_METHODS.register("fedma", paper="Wang et al. 2020; 000 §5")
def fedma_merge(
    inputs: MergeInputs,
    *,
    rounds: int = 1,
    epochs: int = 0,
    lr: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    sigma: float = 1.0,
    sigma0: float = 1.0,
    gamma: float = 1.0,
    max_width: float = 1.5,
    prune_rate: float = 0.0,
) -> Merged:
    """FedMA (Wang et al. 2020) over the models as clients, each optionally magnitude-pruned
    before each matching (000 §5, Tables 4-5).

    Retraining (``epochs`` > 0) and later ``rounds`` train every client on its own batches
    (``client_batches``; the output layer is then weighted by each client's class counts);
    with neither, the models are matched once and need no data. Diagnostics: ``widths`` and
    ``seconds``.
    """
    clients = inputs.client_batches
    if epochs > 0 or rounds > 1:
        clients = inputs.need("client_batches", "fedma")
    if clients is not None and len(clients) != len(inputs.states):
        raise ValueError(
            f"merge method 'fedma' got {len(inputs.states)} models but {len(clients)} clients' "
            "batches: give one checkpoint per client, in client order"
        )
    counts = None
    if clients is not None:
        labels = [torch.cat([b[1] for b in c]).cpu() if c else torch.zeros(0) for c in clients]
        classes = int(max(int(y.max()) for y in labels if len(y))) + 1
        counts = np.stack([np.bincount(y.long().numpy(), minlength=classes) for y in labels])
    start = time.perf_counter()
    res = fedma(
        inputs.states,
        inputs.spec,
        net=inputs.net,
        client_batches=clients,
        rounds=rounds,
        epochs=epochs,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        class_counts=counts,
        sigma=sigma,
        sigma0=sigma0,
        gamma=gamma,
        max_width=max_width,
        pruning=Pruning(prune_rate) if prune_rate > 0 else None,
        seed=inputs.seed,
    )
    return Merged(res.state, None, {"widths": res.widths, "seconds": time.perf_counter() - start})
