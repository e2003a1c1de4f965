"""CCMM: cycle-consistent multi-model matching by Frank-Wolfe (Crisostomi et al. 2024, C2M3).

N models are matched through a shared *universe*: every model i gets one permutation per group,
``P_i`` (model -> universe), and the permutation between any two models is factored through it,
``P_ij = P_i^T P_j`` (model j -> universe -> model i). The pairwise maps are therefore cycle
consistent by construction: ``P_ij P_jk = P_ik`` around every cycle.

The permutations maximise the sum of the pairwise weight-matching objectives (C2M3 eq. 5)

    F(P) = sum_{i<j} <theta_i, P_ij(theta_j)> = sum_{i<j} <P_i(theta_i), P_j(theta_j)>,

where ``P(theta)`` applies a group's matrix on every axis the group acts on. ``P`` is relaxed to
doubly-stochastic matrices and F, multilinear in them, is maximised by Frank-Wolfe (C2M3 §4):
each iteration takes the gradient of F (autograd), solves one linear assignment problem per model
and group for the vertex ``V = argmax_P <grad, P>``, and moves to ``P + gamma (V - P)`` with
the exact line search (F along the segment is a polynomial in gamma, of degree twice the number
of permuted axes of a key, whose coefficients are computed exactly); it stops when the
Frank-Wolfe gap or the step falls below ``tol``. Every matrix is then rounded to the nearest
permutation (Hungarian). The merge is the average in the universe,
``1/N sum_i P_i(theta_i)``.

One deviation from the published code, which moves every model: the reference model's matrices
stay the identity (the universe is labelled by the reference's units). Relabelling the universe
changes no pairwise map, so this removes a symmetry of the discrete problem without changing its
optima, and the reference keeps its own units as :data:`~lmc.merging.MERGE_METHODS` expects.

The objective is ``N`` times MergeMany's (``sum_{i<j} |a_i - a_j|^2 = N sum_i |a_i - mean|^2``
and norms are permutation invariant): both look for the same permutations, MergeMany by
block-coordinate weight matching, CCMM by Frank-Wolfe over all models at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
import torch
from torch import Tensor, nn

from lmc.curves.birkhoff import permutation_matrix, round_to_permutation
from lmc.interpolation.states import check_compatible
from lmc.merging.baselines import align_states
from lmc.merging.contract import MERGE_METHODS, by_permutation
from lmc.permutation import (
    Permutation,
    PermutationSpec,
    SpecError,
    compose_permutations,
    invert_permutation,
    spec_for,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

StateDict = Mapping[str, Tensor]
Matrices = dict[str, Tensor]


@dataclass
class CCMMResult:
    """Outcome of :func:`ccmm`.

    Attributes:
        perms: one permutation per model, model -> universe (identity for the reference);
            ``apply_permutation(states[i], spec, perms[i])`` puts model i in the universe.
        merged: ``1/N sum_i P_i(theta_i)`` over full states (BatchNorm running statistics
            permuted and averaged; reset them on data before evaluating).
        history: the relaxed objective F before and after every Frank-Wolfe iteration.
        objective: F at the rounded permutations.
        gaps: the Frank-Wolfe gap ``<grad F, V - P>`` of every iteration.
        iterations: Frank-Wolfe iterations run.
        converged: stopped because the gap or the step vanished (not ``max_iter``).
        seconds: wall time.
    """

    perms: list[Permutation]
    merged: dict[str, Tensor]
    history: list[float] = field(default_factory=list)
    objective: float = float("nan")
    gaps: list[float] = field(default_factory=list)
    iterations: int = 0
    converged: bool = False
    seconds: float = 0.0


def pairwise_permutation(perms: Sequence[Mapping[str, Tensor]], i: int, j: int) -> Permutation:
    """``P_ij = P_i^T P_j``: the permutation aligning model ``j`` to model ``i`` through the
    universe (``apply_permutation(states[j], spec, P_ij)`` is in model i's units)."""
    return compose_permutations(invert_permutation(perms[i]), perms[j])


def _as_states(
    models: Sequence[StateDict | nn.Module], spec: PermutationSpec | None
) -> tuple[list[StateDict], PermutationSpec]:
    states = [m.state_dict() if isinstance(m, nn.Module) else m for m in models]
    if spec is None:
        first = next((m for m in models if isinstance(m, nn.Module)), None)
        if first is None:
            raise ValueError("spec is required when merging state dicts (use spec_for(net))")
        spec = spec_for(first)
    return states, spec


def check_states(
    states: Sequence[StateDict], spec: PermutationSpec, names: Sequence[str] | None = None
) -> dict[str, int]:
    """Check N >= 2 models of one architecture that fit ``spec``; return the group sizes.

    Raises:
        ValueError: fewer than two models, or models whose keys or shapes differ (the message
            names the model and the first differing entry).
        SpecError: a model does not fit the spec.
    """
    if len(states) < 2:
        raise ValueError(
            f"CCMM matches N >= 2 models, got {len(states)}; give two or more models of one "
            "architecture"
        )
    names = list(names) if names is not None else [f"model {i}" for i in range(len(states))]
    check_compatible(states, names)
    sizes: dict[str, int] = {}
    for name, state in zip(names, states):
        try:
            sizes = spec.sizes(state)
        except SpecError as err:
            raise SpecError(f"{name} does not fit the permutation spec: {err}") from None
    return sizes


def _apply_poly(
    state: StateDict,
    spec: PermutationSpec,
    keys: Sequence[str],
    mats: Mapping[str, Tensor],
    dirs: Mapping[str, Tensor] | None,
) -> dict[str, list[Tensor]]:
    """Coefficients in gamma of ``(P + gamma D)(theta)`` per key (one entry when ``dirs`` is
    ``None``: ``P(theta)``, differentiable in ``mats``)."""
    out: dict[str, list[Tensor]] = {}
    for key in keys:
        coeffs = [state[key]]
        for axis, g in enumerate(spec.axes[key]):
            if g is None:
                continue
            p = mats[g]
            new = [torch.tensordot(p, c, dims=([1], [axis])).movedim(0, axis) for c in coeffs]
            if dirs is not None:
                d = dirs[g]
                new.append(torch.zeros_like(new[0]))
                for k, c in enumerate(coeffs):
                    new[k + 1] = new[k + 1] + torch.tensordot(d, c, dims=([1], [axis])).movedim(
                        0, axis
                    )
            coeffs = new
        out[key] = coeffs
    return out


def _poly_dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> np.ndarray:
    """Coefficients (ascending) of ``<A(gamma), B(gamma)>`` in float64."""
    out = np.zeros(len(a) + len(b) - 1)
    for p, x in enumerate(a):
        for q, y in enumerate(b):
            out[p + q] += float((x.double() * y.double()).sum())
    return out


class _Objective:
    """F and its line polynomial for fixed models; the reference's matrices are the identity."""

    def __init__(
        self, states: Sequence[StateDict], spec: PermutationSpec, keys: Sequence[str], ref: int
    ) -> None:
        self.states, self.spec, self.keys, self.ref = states, spec, list(keys), ref
        # keys with no permuted axis add a constant; drop them from the work
        self.keys = [k for k in self.keys if any(g is not None for g in spec.axes[k])]

    def value(self, mats: Sequence[Mapping[str, Tensor]]) -> Tensor:
        """F(P) = (|sum_i U_i|^2 - sum_i |U_i|^2) / 2 with ``U_i = P_i(theta_i)``."""
        total = torch.zeros((), dtype=torch.float64, device=self._device)
        for key in self.keys:
            us = [
                self.states[i][key]
                if i == self.ref
                else _apply_poly(self.states[i], self.spec, [key], mats[i], None)[key][0]
                for i in range(len(self.states))
            ]
            s = torch.stack(us).sum(0)
            total = total + 0.5 * (
                s.double().square().sum() - sum(u.double().square().sum() for u in us)
            )
        return total

    def line(
        self, mats: Sequence[Mapping[str, Tensor]], dirs: Sequence[Mapping[str, Tensor]]
    ) -> np.ndarray:
        """Ascending coefficients of ``gamma -> F(P + gamma D)``."""
        poly = np.zeros(1)
        for key in self.keys:
            per_model = [
                [self.states[i][key]]
                if i == self.ref
                else _apply_poly(self.states[i], self.spec, [key], mats[i], dirs[i])[key]
                for i in range(len(self.states))
            ]
            width = max(len(c) for c in per_model)
            # every degree d < width has a model with a term: tensors, never sum's 0 start
            s = [cast(Tensor, sum(c[d] for c in per_model if d < len(c))) for d in range(width)]
            part = _poly_dot(s, s)
            for c in per_model:
                part[: 2 * len(c) - 1] -= _poly_dot(c, c)
            poly = _add(poly, 0.5 * part)
        return poly

    @property
    def _device(self) -> torch.device:
        return next(iter(self.states[0].values())).device


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(max(len(a), len(b)))
    out[: len(a)] += a
    out[: len(b)] += b
    return out


def _best_step(poly: np.ndarray) -> tuple[float, float]:
    """``argmax_{gamma in [0, 1]}`` of a polynomial (ascending coefficients) and its gain."""
    p = np.polynomial.Polynomial(poly)
    candidates = [0.0, 1.0]
    for r in p.deriv().roots():
        if abs(r.imag) < 1e-12 and 0.0 < r.real < 1.0:
            candidates.append(float(r.real))
    values = [float(p(c)) for c in candidates]
    best = int(np.argmax(values))
    return candidates[best], values[best] - values[0]


class CCMMOptions(TypedDict, total=False):
    """The keyword options of :func:`ccmm`, as :func:`ccmm_merge` takes them."""

    keys: Sequence[str] | None
    reference: int
    max_iter: int
    tol: float
    init: Sequence[Mapping[str, Tensor]] | None
    names: Sequence[str] | None


def ccmm(
    models: Sequence[StateDict | nn.Module],
    spec: PermutationSpec | None = None,
    *,
    keys: Sequence[str] | None = None,
    reference: int = 0,
    max_iter: int = 100,
    tol: float = 1e-7,
    init: Sequence[Mapping[str, Tensor]] | None = None,
    names: Sequence[str] | None = None,
) -> CCMMResult:
    """Cycle-consistent matching of N models by Frank-Wolfe and their merge in the universe.

    Args:
        models: N >= 2 state dicts (or modules) of one architecture, on one device.
        spec: their permutation spec (built in if omitted and modules are given).
        keys: entries entering the objective (default every floating-point entry; merge tasks
            pass :func:`~lmc.merging.parameter_keys` to leave BatchNorm statistics out). Every
            entry of the state is permuted and averaged whatever ``keys`` is.
        reference: the model whose units label the universe (its permutation is the identity).
        max_iter: upper bound on Frank-Wolfe iterations.
        tol: stop when the Frank-Wolfe gap, or the line-search gain, is below ``tol`` times
            ``|F| + 1``.
        init: starting permutation of every model (identity by default, as in C2M3); the
            reference's entry is ignored.
        names: how to call the models in error messages.

    Returns:
        The permutations (model -> universe), the merged state, the objective history and the
        Frank-Wolfe gaps.

    Raises:
        ValueError: fewer than two models, models of different architectures (naming the
            first differing entry), or ``reference`` out of range.
        SpecError: a model does not fit the spec.
    """
    t0 = time.perf_counter()
    states, spec = _as_states(models, spec)
    sizes = check_states(states, spec, names)
    n = len(states)
    if not -n <= reference < n:
        raise ValueError(f"reference={reference} is not an index into {n} models")
    ref = reference % n
    if keys is None:
        keys = [k for k, t in states[0].items() if t.is_floating_point()]
    unknown = [k for k in keys if k not in states[0]]
    if unknown:
        raise SpecError(f"keys {unknown[:5]} are not in the state dicts")
    device = next(iter(states[0].values())).device
    dtype = next((t.dtype for t in states[0].values() if t.is_floating_point()), torch.float32)
    work = [{k: s[k].detach() for k in keys} for s in states]
    objective = _Objective(work, spec, keys, ref)

    def matrix(perm: Tensor) -> Tensor:
        return permutation_matrix(perm.cpu(), dtype).to(device)

    mats: list[Matrices] = [
        {g: torch.eye(m, dtype=dtype, device=device) for g, m in sizes.items()} for _ in range(n)
    ]
    if init is not None:
        if len(init) != n:
            raise ValueError(f"got {n} models but {len(init)} initial permutations")
        for i in range(n):
            if i != ref:
                mats[i] = {g: matrix(init[i][g]) for g in sizes}
    free = [i for i in range(n) if i != ref]
    result = CCMMResult(perms=[], merged={})
    value = float(objective.value(mats))
    result.history.append(value)
    for _ in range(max_iter):
        leaves = [{g: m.clone().requires_grad_(True) for g, m in mats[i].items()} for i in free]
        current = list(mats)
        for i, leaf in zip(free, leaves):
            current[i] = leaf
        flat = [m for leaf in leaves for m in leaf.values()]
        grads = torch.autograd.grad(objective.value(current), flat, allow_unused=True)
        # a group outside ``keys`` has no gradient: it stays where it is
        grad_iter = iter(torch.zeros_like(m) if g is None else g for m, g in zip(flat, grads))
        dirs: list[Matrices] = [{} for _ in range(n)]
        gap = 0.0
        for i, leaf in zip(free, leaves):
            for g in leaf:
                grad = next(grad_iter)
                vertex = matrix(round_to_permutation(grad))  # argmax_V <grad, V>
                dirs[i][g] = vertex - mats[i][g]
                gap += float((grad.double() * dirs[i][g].double()).sum())
        result.gaps.append(gap)
        result.iterations += 1
        scale = tol * (abs(value) + 1.0)
        if gap <= scale:
            result.converged = True
            break
        with torch.no_grad():
            step, gain = _best_step(objective.line(mats, dirs))
        if step <= 0.0 or gain <= scale:
            result.converged = True
            break
        for i in free:
            mats[i] = {g: m + step * dirs[i][g] for g, m in mats[i].items()}
        with torch.no_grad():
            value = float(objective.value(mats))
        result.history.append(value)
    result.perms = [  # on the models' device (round_to_permutation solves on the CPU)
        {g: torch.arange(m, device=device) for g, m in sizes.items()}
        if i == ref
        else {g: round_to_permutation(mats[i][g]).to(device) for g in sizes}
        for i in range(n)
    ]
    with torch.no_grad():
        hard = [{g: matrix(p) for g, p in perm.items()} for perm in result.perms]
        result.objective = float(objective.value(hard))
        aligned = align_states(states, spec, result.perms)
        result.merged = _mean(aligned)
    result.seconds = time.perf_counter() - t0
    return result


def _mean(states: Sequence[StateDict]) -> dict[str, Tensor]:
    out = {}
    for k, v in states[0].items():
        out[k] = torch.stack([s[k] for s in states]).mean(0) if v.is_floating_point() else v.clone()
    return out


def ccmm_merge(
    models: Sequence[StateDict | nn.Module],
    spec: PermutationSpec | None = None,
    **kwargs: Unpack[CCMMOptions],
) -> dict[str, Tensor]:
    """``1/N sum_i P_i(theta_i)``: the CCMM merge of N models (keyword arguments as in
    :func:`ccmm`). Reset BatchNorm statistics on data before evaluating a BatchNorm net."""
    return ccmm(models, spec, **kwargs).merged


def ccmm_perms(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    keys: Sequence[str] | None = None,
    reference: int = 0,
    max_iter: int = 100,
) -> list[Permutation]:
    """CCMM's permutations (model -> universe = the reference's units), one per model: the
    ``ccmm`` method of :data:`~lmc.merging.MERGE_METHODS` (Frank-Wolfe is deterministic and
    solves its own assignment problems: no seed or weight-matching variant)."""
    return ccmm(states, spec, keys=keys, reference=reference, max_iter=max_iter).perms


MERGE_METHODS.register("ccmm", paper="C2M3, Crisostomi et al. 2024")(by_permutation(ccmm_perms))
