"""STE-MM (004 Alg. 1) and two-model STE (004 §2.3) as trained merge methods (``stemm``, ``ste``:
registered builders of :class:`~lmc.merging.ste.STEMM`), and :func:`ste_mm` / :func:`ste`, their
runs through the one plain loop :func:`~lmc.merging.search.train_search` for notebooks and
benchmarks; ``lmc fit`` trains the same search with :class:`lmc.tasks.TrainedMergeTask`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from lmc.evaluation import LossName
from lmc.merging.contract import MERGE_METHODS, MergeInputs
from lmc.merging.search import OptimizerFactory, train_search
from lmc.merging.ste import STEMM, Mixing
from lmc.permutation import Permutation, PermutationSpec, apply_permutation
from lmc.permutation.weight_matching import Method

StateDict = Mapping[str, Tensor]


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
    run = train_search(
        search.to(device),
        batches,
        epochs=epochs,
        optimizer=optimizer,
        max_steps=max_steps,
        loss=loss,
    )
    perms = run.merged.perms
    assert perms is not None  # STE-MM permutes
    aligned = [apply_permutation(m, search.spec, p, check=False) for m, p in zip(models, perms)]
    wm = [t.get("wm_seconds", 0.0) for t in run.timers]
    return STEResult(perms, aligned, run.losses, run.epoch_seconds, wm)


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


@MERGE_METHODS.register(
    "stemm", trains=True, needs=("net", "train_batches"), paper="004 §4.1, Alg. 1"
)
def stemm_search(
    inputs: MergeInputs,
    *,
    mixing: Mixing = "dirichlet",
    keep_best: bool = False,
    cache_source: bool = True,
) -> STEMM:
    """STE-MM (004 Alg. 1): n - 1 proxies at the inputs' reference, every step each model
    weight-matched to its proxy (``inputs.wm_method``, warm-started, 004 §4.2), mixing weights
    lambda (``mixing``: ``dirichlet``, ``uniform`` or ``midpoint``) and the straight-through
    loss of ``sum_i lambda_i pi_i(theta_i)`` (trained with Adam, lr 1e-3, 10 epochs, batch 256
    in 004 App. B.2). ``keep_best``: the permutations of the lowest batch loss;
    ``cache_source``: as in :class:`~lmc.merging.ste.STEMM`."""
    return _search(inputs, "stemm", mixing, keep_best, cache_source)


@MERGE_METHODS.register(
    "ste", trains=True, needs=("net", "train_batches"), paper="Ainsworth et al. 2023 §3.3; 004 §2.3"
)
def ste_search(
    inputs: MergeInputs,
    *,
    mixing: Mixing = "midpoint",
    keep_best: bool = True,
    cache_source: bool = True,
) -> STEMM:
    """STE for two models (Ainsworth et al. 2023): a proxy at model A (the inputs' reference),
    model B weight-matched to it every step and the loss of the midpoint (``midpoint``) or of a
    sampled alpha (``dirichlet``) trains the proxy; the permutation of the lowest batch loss is
    kept (``keep_best``). With more models it is STE-MM with these defaults."""
    return _search(inputs, "ste", mixing, keep_best, cache_source)


def _search(
    inputs: MergeInputs, name: str, mixing: Mixing, keep_best: bool, cache_source: bool
) -> STEMM:
    n = len(inputs.states)
    return STEMM(
        inputs.need("net", name),
        inputs.bank if inputs.bank is not None else inputs.states,
        inputs.spec,
        reference=inputs.reference,
        method=inputs.wm_method,
        mixing=mixing,
        keep_best=keep_best,
        seed=inputs.seed,
        num_models=n if inputs.bank is not None else None,
        cache_source=cache_source,
    )
