"""Sinkhorn re-basin (Peña et al. 2023, "Re-basin via implicit Sinkhorn differentiation").

Model B is aligned to model A by *learning* one permutation per group of the permutation spec.
Each group g holds a matrix of logits ``M_g``; its relaxation is the Sinkhorn (entropic) projection
``S_g = sinkhorn(M_g / tau)`` onto the doubly-stochastic matrices, differentiated through the
unrolled log-domain iterations. ``S(theta_B)`` applies every group's ``S_g`` on every axis the
group acts on, so the loss of the mixture

    L((1 - alpha) theta_A + alpha S(theta_B))                                (Peña et al. §3.2)

is differentiable in the logits; ``alpha = 1/2`` is their midpoint loss, ``alpha ~ U(0, 1)``
their random-alpha loss. The temperature is annealed geometrically from ``tau_start`` to
``tau_end`` over the training steps, so the relaxation starts smooth and ends close to a
permutation. The hard permutation is the zero-temperature limit of the Sinkhorn projection,
``argmax_P <P, M_g>`` (Hungarian), taken when training ends.

The logits start at ``init_scale`` times the permutation matrix of ``init``: the identity (as in
Peña et al.) or weight matching of B to A (:func:`~lmc.permutation.weight_matching`).

BatchNorm uses batch statistics during the search (the template network runs in train mode; its
running-statistic buffers are copies of A's); reset them on data before evaluating a merge.

:class:`SinkhornRebasin` holds one pair's logits as parameters; :class:`SinkhornSearch`, the
search of the trained ``sinkhorn`` merge method, aligns every model to the reference with one
pair each (``lmc fit`` trains it with :class:`lmc.tasks.TrainedMergeTask`); and
:func:`sinkhorn_rebasin` runs two models through the one plain loop
(:func:`~lmc.merging.search.train_search`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from lmc.curves.birkhoff import permutation_matrix, round_to_permutation
from lmc.curves.pam import soft_permute
from lmc.evaluation import LossName, batch_loss
from lmc.merging.baselines import check_models, parameter_keys
from lmc.merging.contract import MERGE_METHODS, Merged, MergeInputs
from lmc.merging.search import MergeSearch, OptimizerFactory, Progress, adam, train_search
from lmc.merging.ste import Mixing, ModelBank, Template, sample_mixing_weights
from lmc.permutation import (
    Permutation,
    PermutationSpec,
    apply_permutation,
    identity_permutation,
    spec_for,
    weight_matching,
)

StateDict = Mapping[str, Tensor]
Init = Literal["identity", "weight_matching"]


def log_sinkhorn(logits: Tensor, iters: int = 20) -> Tensor:
    """``log S`` for the Sinkhorn projection ``S`` of ``exp(logits)``: ``iters`` rounds of
    row then column normalisation in the log domain (rows and columns of ``S`` sum to one,
    the columns exactly, the rows up to the convergence of the iteration)."""
    if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"expected a square matrix of logits, got shape {tuple(logits.shape)}")
    if iters < 1:
        raise ValueError(f"sinkhorn_iters must be >= 1, got {iters}")
    z = logits
    for _ in range(iters):
        z = z - torch.logsumexp(z, dim=1, keepdim=True)
        z = z - torch.logsumexp(z, dim=0, keepdim=True)
    return z


def sinkhorn(logits: Tensor, tau: float = 1.0, iters: int = 20) -> Tensor:
    """The doubly-stochastic ``S = sinkhorn(logits / tau)``; tends to the permutation
    ``argmax_P <P, logits>`` as ``tau -> 0``."""
    if tau <= 0:
        raise ValueError(f"the temperature must be positive, got tau={tau}")
    return log_sinkhorn(logits / tau, iters).exp()


def temperature(step: int, total: int, tau_start: float, tau_end: float) -> float:
    """Geometric annealing: ``tau_start`` at step 0, ``tau_end`` at step ``total - 1``."""
    if tau_start <= 0 or tau_end <= 0:
        raise ValueError(f"temperatures must be positive, got {tau_start} and {tau_end}")
    if total <= 1:
        return tau_end
    frac = min(max(step / (total - 1), 0.0), 1.0)
    return tau_start * (tau_end / tau_start) ** frac


class SinkhornRebasin(nn.Module):
    """The logits, relaxation and loss of Sinkhorn re-basin of ``model_b`` onto ``model_a``.

    Args:
        net: the architecture; a private copy runs the functional forward passes.
        model_a: the fixed model's full state dict.
        model_b: the model to permute (same architecture; checked by
            :func:`~lmc.merging.check_models`).
        spec: their permutation spec (built-in if omitted).
        init: the logits' start: ``identity`` (Peña et al.) or ``weight_matching`` of B to A.
        init_scale: the logits start at ``init_scale`` times the initial permutation matrix.
        sinkhorn_iters: log-domain Sinkhorn iterations per relaxation.
        mixing: ``midpoint`` (alpha = 1/2, the midpoint loss), ``dirichlet`` or ``uniform``
            (alpha ~ U(0, 1), the random-alpha loss).
        seed: seed of alpha.
        names: how to call the two models in error messages.
    """

    _template: Template

    def __init__(
        self,
        net: nn.Module,
        model_a: StateDict,
        model_b: StateDict,
        spec: PermutationSpec | None = None,
        *,
        init: Init = "identity",
        init_scale: float = 1.0,
        sinkhorn_iters: int = 20,
        mixing: Mixing = "midpoint",
        seed: int = 0,
        names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if init not in ("identity", "weight_matching"):
            raise ValueError(f"init must be 'identity' or 'weight_matching', got {init!r}")
        if sinkhorn_iters < 1:
            raise ValueError(f"sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
        sample_mixing_weights(2, mixing)  # validates the name
        self.spec = check_models(net, [model_a, model_b], spec, names) or spec_for(net)
        self.bank: ModelBank = ModelBank([model_a, model_b])
        self.param_keys = parameter_keys(net)
        self.match_spec = self.spec.restrict(self.param_keys)
        self.sinkhorn_iters, self.mixing = sinkhorn_iters, mixing
        self._template = Template(net)
        sizes = self.spec.sizes(model_a)
        self.groups = list(sizes)
        device = next(iter(model_a.values())).device
        if init == "weight_matching":
            keys = self.param_keys
            self.init_perm = weight_matching(
                {k: model_a[k] for k in keys},
                {k: model_b[k] for k in keys},
                self.match_spec,
                method="accelerated",
                seed=seed,
            ).perm
        else:
            self.init_perm = identity_permutation(sizes, device)
        self.logits = nn.ParameterList(
            nn.Parameter(init_scale * permutation_matrix(self.init_perm[g]).to(device))
            for g in self.groups
        )
        self.generator = torch.Generator().manual_seed(seed)

    def soft_permutations(self, tau: float) -> dict[str, Tensor]:
        """Group -> ``sinkhorn(M_g / tau)`` (differentiable in the logits)."""
        return {g: sinkhorn(m, tau, self.sinkhorn_iters) for g, m in zip(self.groups, self.logits)}

    @torch.no_grad()
    def permutation(self) -> Permutation:
        """The hard permutation ``argmax_P <P, M_g>`` of every group (the zero-temperature
        limit of the relaxation)."""
        # on the logits' device (round_to_permutation solves on the CPU)
        return {g: round_to_permutation(m).to(m.device) for g, m in zip(self.groups, self.logits)}

    def sample_alpha(self) -> float:
        """The weight of model B for the next step (``mixing``)."""
        return float(sample_mixing_weights(2, self.mixing, self.generator)[1])

    def mixed_state(self, alpha: float, tau: float) -> dict[str, Tensor]:
        """``(1 - alpha) theta_A + alpha S(theta_B)`` over the parameters; the buffers are
        copies of A's (BatchNorm runs on batch statistics during the search)."""
        a, b = self.bank.state(0), self.bank.state(1)
        soft = soft_permute(b, self.match_spec, self.soft_permutations(tau), self.param_keys)
        out: dict[str, Tensor] = {}
        for key, value in a.items():
            if key in soft:
                out[key] = torch.lerp(value, soft[key], alpha)
            else:
                out[key] = value.clone()
        return out

    def forward(self, x: Tensor, alpha: float, tau: float) -> Tensor:
        """Output of the relaxed mixture on ``x`` (train mode: batch statistics)."""
        return self._template(self.mixed_state(alpha, tau), x)

    def loss(
        self,
        x: Tensor,
        y: Tensor,
        tau: float,
        alpha: float | None = None,
        loss: LossName = "cross_entropy",
    ) -> Tensor:
        """Mean loss of the relaxed mixture on a batch; ``alpha`` sampled if omitted."""
        alpha = self.sample_alpha() if alpha is None else alpha
        return batch_loss(self(x, alpha, tau), y, loss) / y.shape[0]

    def aligned(self) -> dict[str, Tensor]:
        """``pi(theta_B)`` with the hard permutation (full state)."""
        return apply_permutation(self.bank.state(1), self.spec, self.permutation())


class SinkhornSearch(MergeSearch):
    """Sinkhorn re-basin of every model onto the reference: one :class:`SinkhornRebasin` pair
    per other model (the j-th seeded ``seed + j``), their losses summed, the temperature
    annealed geometrically from ``tau_start`` to ``tau_end`` over the run's steps; the result
    is the average of the models under the hard permutations.

    Args:
        net, spec, init, init_scale, sinkhorn_iters, mixing: as in :class:`SinkhornRebasin`.
        states: the n >= 2 models' full state dicts.
        reference: the model the others are aligned to.
        tau_start, tau_end: temperature at the first and the last step.
        seed: seed of alpha and of a weight-matching init.
    """

    lr = 0.1  # Adam on the logits, whose scale is init_scale (about 1)

    def __init__(
        self,
        net: nn.Module,
        states: Sequence[StateDict],
        spec: PermutationSpec | None = None,
        *,
        reference: int = 0,
        tau_start: float = 1.0,
        tau_end: float = 0.01,
        init: Init = "identity",
        init_scale: float = 1.0,
        sinkhorn_iters: int = 20,
        mixing: Mixing = "midpoint",
        seed: int = 0,
    ) -> None:
        super().__init__()
        temperature(0, 2, tau_start, tau_end)  # validates the temperatures
        self.n = len(states)
        if not 0 <= reference < self.n:
            raise ValueError(f"reference={reference} is not an index into {self.n} models")
        self.reference, self.tau_start, self.tau_end = reference, tau_start, tau_end
        self.others = [i for i in range(self.n) if i != reference]
        self.pairs = nn.ModuleList(
            SinkhornRebasin(
                net,
                states[reference],
                states[i],
                spec,
                init=init,
                init_scale=init_scale,
                sinkhorn_iters=sinkhorn_iters,
                mixing=mixing,
                seed=seed + j,
            )
            for j, i in enumerate(self.others)
        )
        self.spec: PermutationSpec = self._pairs()[0].spec
        self.tau = tau_start

    def step_loss(self, x: Tensor, y: Tensor, loss: LossName, progress: Progress) -> Tensor:
        if progress.total is None:
            raise ValueError("batches has no length: give max_steps for the temperature schedule")
        self.tau = temperature(progress.step, progress.total, self.tau_start, self.tau_end)
        total: Tensor | None = None
        for pair in self._pairs():
            value = pair.loss(x, y, self.tau, loss=loss)
            total = value if total is None else total + value
        assert total is not None
        return total

    def step_logs(self) -> dict[str, float]:
        return {"tau": self.tau}

    def output(self, x: Tensor) -> Tensor | None:
        """The relaxed midpoint's output at the current temperature (two models only)."""
        pairs = self._pairs()
        return pairs[0](x, 0.5, self.tau) if len(pairs) == 1 else None

    def _pairs(self) -> list[SinkhornRebasin]:
        return [cast(SinkhornRebasin, p) for p in self.pairs]

    def result(self) -> Merged:
        pairs = self._pairs()
        ref = pairs[0].bank.state(0)
        perms: list[Permutation] = []
        states: list[dict[str, Tensor]] = []
        for i in range(self.n):
            if i == self.reference:
                perms.append(
                    identity_permutation(self.spec.sizes(ref), next(iter(ref.values())).device)
                )
                states.append(dict(ref))
            else:
                pair = pairs[self.others.index(i)]
                perms.append(pair.permutation())
                states.append(pair.bank.state(1))
        return Merged.from_perms(states, self.spec, perms)


@MERGE_METHODS.register(
    "sinkhorn", trains=True, needs=("net", "train_batches"), paper="Peña et al. 2023"
)
def sinkhorn_search(
    inputs: MergeInputs,
    *,
    tau_start: float = 1.0,
    tau_end: float = 0.01,
    sinkhorn_iters: int = 20,
    mixing: Mixing = "midpoint",
    init: Init = "identity",
    init_scale: float = 1.0,
) -> SinkhornSearch:
    """Sinkhorn re-basin (Peña et al. 2023) of every model onto the inputs' reference
    (:class:`SinkhornSearch`; Adam, lr 0.1, by default)."""
    return SinkhornSearch(
        inputs.need("net", "sinkhorn"),
        inputs.states,
        inputs.spec,
        reference=inputs.reference,
        tau_start=tau_start,
        tau_end=tau_end,
        init=init,
        init_scale=init_scale,
        sinkhorn_iters=sinkhorn_iters,
        mixing=mixing,
        seed=inputs.seed,
    )


@dataclass
class SinkhornResult:
    """Outcome of :func:`sinkhorn_rebasin`.

    Attributes:
        perm: the hard permutation aligning model B to model A.
        aligned: ``pi(theta_B)`` (full state).
        init_perm: the permutation the logits started from.
        losses: the training batch losses in order.
        taus: the temperature of every step.
        seconds: wall time.
    """

    perm: Permutation
    aligned: dict[str, Tensor]
    init_perm: Permutation
    losses: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    seconds: float = 0.0


def sinkhorn_rebasin(
    net: nn.Module,
    model_a: StateDict,
    model_b: StateDict,
    batches: Iterable[Any],
    *,
    spec: PermutationSpec | None = None,
    epochs: int = 1,
    optimizer: OptimizerFactory | None = None,
    lr: float | None = None,
    tau_start: float = 1.0,
    tau_end: float = 0.01,
    sinkhorn_iters: int = 20,
    mixing: Mixing = "midpoint",
    init: Init = "identity",
    init_scale: float = 1.0,
    loss: LossName = "cross_entropy",
    seed: int = 0,
    max_steps: int | None = None,
) -> tuple[Permutation, dict[str, Tensor], SinkhornResult]:
    """Sinkhorn re-basin (Peña et al. 2023) of ``model_b`` onto ``model_a``, trained by the
    plain loop :func:`~lmc.merging.search.train_search`.

    Args:
        net: the architecture.
        model_a, model_b: full state dicts (on the device to run on); B is permuted onto A.
        batches: a re-iterable of ``(x, y)`` batches (a DataLoader or a list).
        spec: the permutation spec (built-in if omitted).
        epochs: passes over ``batches``.
        optimizer: builds the optimizer from the logits (default Adam, lr 0.1).
        lr: shortcut for Adam with this learning rate (ignored when ``optimizer`` is given).
        tau_start, tau_end: temperature annealed geometrically over the steps.
        sinkhorn_iters, mixing, init, init_scale, seed: as in :class:`SinkhornRebasin`.
        loss: ``cross_entropy`` or ``mse``/``half_mse``.
        max_steps: stop after this many steps in total (the schedule spans
            ``min(max_steps, epochs * len(batches))`` steps when ``batches`` has a length).

    Returns:
        ``(perm, pi(model_b), result)``.
    """
    t0 = time.perf_counter()
    inputs = MergeInputs([model_a, model_b], spec or spec_for(net), net=net, seed=seed)
    search = sinkhorn_search(
        inputs,
        tau_start=tau_start,
        tau_end=tau_end,
        init=init,
        init_scale=init_scale,
        sinkhorn_iters=sinkhorn_iters,
        mixing=mixing,
    )
    if optimizer is None and lr is not None:
        optimizer = adam(lr)
    run = train_search(
        search, batches, epochs=epochs, optimizer=optimizer, max_steps=max_steps, loss=loss
    )
    pair = search._pairs()[0]
    assert run.merged.perms is not None
    perm = run.merged.perms[1]
    result = SinkhornResult(
        perm,
        apply_permutation(model_b, search.spec, perm),
        pair.init_perm,
        run.losses,
        [log["tau"] for log in run.logs],
        time.perf_counter() - t0,
    )
    return result.perm, result.aligned, result
