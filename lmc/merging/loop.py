"""Plain training loops of STE-MM (004 Alg. 1) and two-model STE (004 §2.3) over
:class:`~lmc.merging.ste.STEMM`, for notebooks and benchmarks; ``lmc fit`` runs the same steps
through :class:`lmc.tasks.STEMMTask`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lmc.evaluation import LossName
from lmc.interpolation.states import weighted_average
from lmc.merging.contract import MERGE_METHODS, Merged, MergeInputs
from lmc.merging.ste import STEMM, Mixing
from lmc.optim import default_optimizer
from lmc.permutation import Permutation, PermutationSpec, apply_permutation
from lmc.permutation.weight_matching import Method

StateDict = Mapping[str, Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass
class STEResult:
    """Outcome of :func:`ste_mm` / :func:`ste`.

    Attributes:
        perms: one permutation per model (identity for the reference).
        aligned: ``[pi_i(theta_i)]`` as full state dicts.
        losses: the training batch losses in order.
        epoch_seconds: wall time of every epoch.
        wm_seconds: time spent in weight matching per epoch.
    """

    perms: list[Permutation]
    aligned: list[dict[str, Tensor]]
    losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    wm_seconds: list[float] = field(default_factory=list)


def ste_mm(
    net: nn.Module,
    models: Sequence[StateDict],
    batches: Iterable[Any],
    *,
    epochs: int = 10,
    optimizer: OptimizerFactory | None = None,
    spec: PermutationSpec | None = None,
    reference: int = 0,
    method: Method = "accelerated",
    mixing: Mixing = "dirichlet",
    keep_best: bool = False,
    loss: LossName = "cross_entropy",
    seed: int = 0,
    max_steps: int | None = None,
) -> STEResult:
    """STE-MM (004 Alg. 1) as a plain loop: ``epochs`` passes over ``batches``.

    Args:
        net: the architecture.
        models: the n >= 2 models' state dicts (on the device to run on).
        batches: a re-iterable of ``(x, y)`` batches (a DataLoader or a list).
        epochs: passes over ``batches`` (004 App. B.2: 10, batch 256).
        optimizer: builds the optimizer from the proxies' parameters (default Adam, lr 1e-3,
            004 App. B.2).
        spec, reference, method, mixing, keep_best, seed: as in :class:`STEMM`.
        loss: ``cross_entropy`` or ``mse``/``half_mse``.
        max_steps: stop after this many steps in total (quick runs and timing).

    Returns:
        The permutations and aligned states after the final matching, with losses and timings.
    """
    search = STEMM(
        net,
        models,
        spec,
        reference=reference,
        method=method,
        mixing=mixing,
        keep_best=keep_best,
        seed=seed,
    )
    device = next(iter(models[0].values())).device
    search.to(device)
    opt = (optimizer or default_optimizer)(search.proxy_parameters())
    result = STEResult(perms=[], aligned=[])
    steps = 0
    for _ in range(epochs):
        start, wm0 = time.perf_counter(), search.wm_seconds
        for x, y in batches:
            if max_steps is not None and steps >= max_steps:
                break
            value = search.step_loss(x.to(device), y.to(device), loss)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            result.losses.append(float(value.detach()))
            steps += 1
        result.epoch_seconds.append(time.perf_counter() - start)
        result.wm_seconds.append(search.wm_seconds - wm0)
    result.perms = search.finalize()
    result.aligned = [
        apply_permutation(m, search.spec, p, check=False) for m, p in zip(models, result.perms)
    ]
    return result


def ste(
    net: nn.Module,
    model_a: StateDict,
    model_b: StateDict,
    batches: Iterable[Any],
    *,
    epochs: int = 10,
    optimizer: OptimizerFactory | None = None,
    spec: PermutationSpec | None = None,
    method: Method = "accelerated",
    mixing: Mixing = "midpoint",
    keep_best: bool = True,
    loss: LossName = "cross_entropy",
    seed: int = 0,
    max_steps: int | None = None,
) -> tuple[Permutation, dict[str, Tensor], STEResult]:
    """STE for two models (Ainsworth et al. 2023; 004 §2.3): the proxy starts at ``model_a``,
    ``model_b`` is matched to it every step and the loss of the midpoint (``mixing="midpoint"``)
    or of a uniformly sampled alpha (``"dirichlet"``) trains the proxy; the permutation of the
    lowest batch loss is kept (``keep_best``).

    Returns:
        ``(perm, pi(model_b), result)``.
    """
    result = ste_mm(
        net,
        [model_a, model_b],
        batches,
        epochs=epochs,
        optimizer=optimizer,
        spec=spec,
        reference=0,
        method=method,
        mixing=mixing,
        keep_best=keep_best,
        loss=loss,
        seed=seed,
        max_steps=max_steps,
    )
    return result.perms[1], result.aligned[1], result


@MERGE_METHODS.register("stemm")
def stemm_merge(
    inputs: MergeInputs,
    *,
    epochs: int = 10,
    lr: float = 1e-3,
    mixing: Mixing = "dirichlet",
    keep_best: bool = False,
    max_steps: int | None = None,
) -> Merged:
    """STE-MM (004 Alg. 1) as a merge method: :func:`ste_mm` over the training split with Adam
    at ``lr`` (004 App. B.2: 10 epochs, lr 1e-3), the models matched to the inputs' reference.
    Diagnostics: ``final_loss`` (the last batch's) and per epoch ``epoch_seconds`` and
    ``wm_seconds``."""
    res = ste_mm(
        inputs.need("net", "stemm"),
        inputs.states,
        inputs.need("train_batches", "stemm"),
        epochs=epochs,
        optimizer=lambda params: torch.optim.Adam(params, lr=lr),
        spec=inputs.spec,
        reference=inputs.reference,
        method=inputs.wm_method,
        mixing=mixing,
        keep_best=keep_best,
        loss=inputs.loss,
        seed=inputs.seed,
        max_steps=max_steps,
    )
    diagnostics = {
        "final_loss": res.losses[-1] if res.losses else float("nan"),
        "epoch_seconds": res.epoch_seconds,
        "wm_seconds": res.wm_seconds,
    }
    return Merged(weighted_average(res.aligned), res.perms, diagnostics)
