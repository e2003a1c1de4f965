"""Weight matching: plain (004 Alg. 2, 000 App. A.2) and accelerated with dual warm start (Alg. 3).

Weight matching looks for the permutation pi maximising ``<theta_a, pi(theta_b)>`` (equivalently
minimising ``||theta_a - pi(theta_b)||^2``, 004 eq. 1) by coordinate descent: the groups are
visited in a random (seeded) order and each group's permutation is the solution of a linear
assignment problem with the others held fixed (004 §4.2; Ainsworth et al. 2023).

The cost matrix of group ``g`` is ``C_g = sum_{(k, axis) in g} A_k B~_k^T``, where ``A_k`` is the
target's entry ``k`` unfolded along ``axis`` and ``B~_k`` the source's, with every *other* axis
already permuted by its current permutation (004 Alg. 2 line 6).

``method="plain"`` is Alg. 2 as published: every sweep solves every group; stop after a sweep in
which no group improved. ``method="accelerated"`` is Alg. 3 plus bookkeeping that cannot change
the result:

* dual variables ``(u_g, v_g)`` are kept per group across sweeps *and across calls* (pass
  ``init=result.state``; STE/STE-MM warm-start every step this way) and each LAP is
  warm-started from them and the group's current permutation with a dual-returning solver
  (``"sap"``: feasibility restored, tight pairs kept, augmenting paths only from the freed rows;
  a solver without a warm start gets the reduced costs ``K - u - v``);
* a group is re-solved only if the permutation of a neighbouring group changed since its last
  solve (otherwise its cost matrix, hence its optimum, is unchanged), which also detects
  convergence without a final confirmation sweep;
* per-member products ``A_k B~_k^T`` are cached; when the permutation on another axis changed,
  a product is updated from the slices of the units that moved (cost proportional to their
  number) or, if many moved, recomputed.
* the source side (each entry unfolded, and gathered by the permutations of its other axes)
  is kept in ``result.state`` and reused by the next call while the source equals the kept
  copy (STE, STE-MM and MergeMany match a fixed model to a moving target), so a warm call
  spends its time on the products themselves rather than on re-permuting the source.

Groups that follow each other in a sweep's order and are not neighbours cannot change each
other's cost matrices, so both methods solve such runs of groups at once, in threads (the LAP
kernels release the GIL): the trajectory is exactly the one-by-one trajectory.

Both methods visit groups in the same seeded order, so apart from ties in the assignment they
follow the same trajectory and end at the same objective.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from lmc.permutation._costs import Problem, SourceCache
from lmc.permutation._search import Duals, _Search
from lmc.permutation.apply import apply_permutation
from lmc.permutation.coupled import coupled_start
from lmc.permutation.lap import LapSolver, TimedSolver
from lmc.permutation.spec import (
    Permutation,
    PermutationSpec,
    SpecError,
    StateDict,
    check_finite,
    check_permutation,
    check_same_architecture,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

Method = Literal["plain", "accelerated"]

#: LAPs solved at once hold at most this many cost-matrix entries together (two n = 2048
#: groups). Matrices solved at once compete for the last-level cache: on the 16-core host of
#: an H200, trained VGG-11 x4's cold call (groups of 256-2048 units) took 47.2 s with two
#: n = 2048 problems at once against 37.1 s one at a time, when the kernel still scanned a
#: column of the matrix for each broken pair; since it reads its (float32) matrix row after row,
#: two n = 2048 warm solves at once took 0.65 of the time of one after the other on the 2-core
#: CPU, and that call's LAPs 2.57 instead of 2.97 s (3 x 1024**2 entries, the cap before;
#: not yet measured on a GPU's host: benchmarks/weight_matching.py --compare-lap-cells).
CONCURRENT_LAP_CELLS = 2 * 2048 * 2048


@dataclass
class MatchingState:
    """What accelerated weight matching carries from one call to the next (004 Alg. 3).

    Attributes:
        perm: the permutation found by the last call (the next call starts from it).
        duals: group -> ``(u, v)``, optimal LAP duals of the group's last (negated) cost matrix.
        cache: the source model copied, unfolded and gathered for cost matrices, reused by
            the next call while the source it is given is equal to the kept copy (compared
            element for element, so edits of any kind are seen); about four times the
            source's memory; ``None`` with ``cache_source=False``, or set it to ``None`` to
            free it.
    """

    perm: Permutation
    duals: Duals = field(default_factory=dict)
    cache: SourceCache | None = field(default=None, repr=False, compare=False)


@dataclass
class WeightMatchingResult:
    """Outcome of :func:`weight_matching`.

    Attributes:
        perm: group -> int64 indices; ``apply_permutation(source, spec, perm)`` is aligned to
            the target.
        history: ``<theta_a, pi(theta_b)>`` at the initial permutation and after every sweep.
        sweeps: number of sweeps (passes over the groups that needed a solve).
        solves: number of LAPs solved.
        converged: whether it stopped because no group could improve (not ``max_sweeps``).
        seconds: wall time of the call.
        solve_seconds: time spent inside the LAP solver.
        cost_seconds: time spent building cost matrices.
        state: permutation and duals to pass as ``init`` to the next call.
    """

    perm: Permutation
    history: list[float]
    sweeps: int
    solves: int
    converged: bool
    seconds: float
    solve_seconds: float
    cost_seconds: float
    state: MatchingState

    @property
    def objective(self) -> float:
        """Final ``<theta_a, pi(theta_b)>``."""
        return self.history[-1]

    @property
    def solve_share(self) -> float:
        """Fraction of the wall time spent in LAP solves."""
        return self.solve_seconds / self.seconds if self.seconds > 0 else 0.0


class PassedMatchingOptions(TypedDict, total=False):
    """Options of :func:`weight_matching` that :func:`~lmc.permutation.merge_many` passes on."""

    solver: str | LapSolver | None
    max_sweeps: int
    keys: Iterable[str] | None
    cache_source: bool
    workers: int | None


class WeightMatchingOptions(PassedMatchingOptions, total=False):
    """The keyword options of :func:`weight_matching`, as :func:`align_weights` takes them."""

    method: Method
    init: MatchingState | Mapping[str, Tensor] | None
    tol: float
    seed: int | None


def as_state_dict(x: StateDict | nn.Module) -> StateDict:
    """A module's (detached) state dict, or the mapping itself."""
    if isinstance(x, nn.Module):
        return x.state_dict()
    if not isinstance(x, Mapping):
        raise TypeError(f"expected an nn.Module or a state dict, got {type(x).__name__}")
    return x


def _resolve_spec(spec: PermutationSpec | None, *models: object) -> PermutationSpec:
    if spec is not None:
        return spec
    for m in models:
        if isinstance(m, nn.Module):
            from lmc.permutation.builtin import spec_for

            return spec_for(m)
    raise ValueError("spec is required when matching state dicts (use spec_for(model))")


def weight_matching(
    target: StateDict | nn.Module,
    source: StateDict | nn.Module,
    spec: PermutationSpec | None = None,
    *,
    method: Method = "plain",
    solver: str | LapSolver | None = None,
    init: MatchingState | Mapping[str, Tensor] | None = None,
    max_sweeps: int = 100,
    tol: float = 1e-9,
    seed: int | None = 0,
    keys: Iterable[str] | None = None,
    cache_source: bool = True,
    workers: int | None = None,
) -> WeightMatchingResult:
    """Find pi maximising ``<theta_a, pi(theta_b)>`` by coordinate descent over groups.

    Args:
        target: theta_a, a state dict or module (e.g. the mean of other models for MergeMany,
            or the STE proxy).
        source: theta_b, the model to permute; same architecture as ``target``.
        spec: permutation spec; derived from a built-in module if omitted.
        method: ``"plain"`` (004 Alg. 2) or ``"accelerated"`` (Alg. 3 with dual warm start
            and incremental bookkeeping; see module docstring).
        solver: LAP solver name or callable; default ``"scipy"`` for plain and ``"sap"``
            (which returns duals and takes a warm start) for accelerated.
        init: starting permutation, or the ``state`` of a previous result (permutation and
            duals) to warm-start; identity if omitted (attention heads: paired by
            :func:`lmc.permutation.coupled.coupled_start`).
        max_sweeps: upper bound on the number of sweeps.
        tol: a group's new assignment replaces the current one only if it improves that
            group's objective by more than ``tol * n * max|C|``; ties keep the current one.
        seed: seed of the random group order.
        keys: state-dict entries entering the objective; default every floating-point entry
            (parameters and BatchNorm running statistics).
        cache_source: accelerated only: keep the prepared source in ``result.state`` so that
            the next call with an equal source (STE / STE-MM / MergeMany) skips unfolding
            and re-permuting it.
        workers: how many LAPs to solve at once. Groups next to each other in a sweep's
            order that share no neighbour relation are independent, and their LAPs are solved
            at once in threads (no more than :data:`CONCURRENT_LAP_CELLS` cost entries at
            once): the result is exactly that of solving them one by one. Default: one per CPU
            core for the built-in solvers, 1 for a callable solver (which may not be
            thread-safe).

    Returns:
        The permutation, the objective history, sweep/solve counts, timings and the state to
        warm-start the next call.

    Raises:
        SpecError: architectures differ, the spec does not fit, ``init`` is not a valid
            permutation or carries duals of the wrong length, a weight is NaN/inf (the message
            names the key), or a cost matrix is (the message names the group and layer).
        ValueError: accelerated matching with a solver that returns no duals.
    """
    t_start = time.perf_counter()
    if method not in ("plain", "accelerated"):
        raise ValueError(f"method must be 'plain' or 'accelerated', got {method!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(
            f"workers must be a positive integer or None (one per core), got {workers!r}"
        )
    spec = _resolve_spec(spec, target, source)
    a, b = as_state_dict(target), as_state_dict(source)
    check_same_architecture(a, b, ("target", "source"))
    sizes = spec.sizes(a)
    keys = _objective_keys(a, b, keys)
    accelerated = method == "accelerated"
    lap = TimedSolver(solver if solver is not None else ("sap" if accelerated else "scipy"))
    if accelerated and not lap.returns_duals:
        raise ValueError(
            f"accelerated weight matching needs a LAP solver that returns duals (e.g. 'sap'), "
            f"got {solver!r}"
        )
    duals = _warm_duals(init, sizes) if accelerated else {}
    device = a[keys[0]].device if keys else torch.device("cpu")
    perm, frozen = _start_permutation(a, b, spec, sizes, init, device)

    t0 = time.perf_counter()
    cache = None
    if accelerated:
        kept = init.cache if isinstance(init, MatchingState) else None
        cache = kept if kept is not None and cache_source else SourceCache()
    problem = Problem(a, b, spec, keys, cache)
    at_once = workers or lap.workers
    search = _Search(
        problem,
        spec,
        sizes,
        perm,
        duals,
        frozen,
        lap,
        tol,
        at_once,
        accelerated,
        CONCURRENT_LAP_CELLS,
    )
    search.cost_seconds += time.perf_counter() - t0
    search.history.append(problem.start(perm))
    converged, sweeps = search.run(max_sweeps, np.random.default_rng(seed))
    problem.release()
    return WeightMatchingResult(
        perm=dict(perm),  # on the inputs' device, as every result of an algorithm is
        history=search.history,
        sweeps=sweeps,
        solves=lap.calls,
        converged=converged,
        seconds=time.perf_counter() - t_start,
        solve_seconds=lap.seconds,
        cost_seconds=search.cost_seconds,
        state=MatchingState(dict(perm), duals, cache if cache_source else None),
    )


def _objective_keys(a: StateDict, b: StateDict, keys: Iterable[str] | None) -> list[str]:
    """The entries entering the objective (default every floating-point one), checked present
    and finite in both models."""
    if keys is None:
        keys = [k for k, t in a.items() if t.dtype.is_floating_point]
    else:
        keys = list(keys)
        unknown = [k for k in keys if k not in a]
        if unknown:
            raise SpecError(f"keys {unknown[:5]} are not in the state dicts")
    check_finite({k: a[k] for k in keys}, "target")
    check_finite({k: b[k] for k in keys}, "source")
    return keys


def _warm_duals(init: MatchingState | Mapping[str, Tensor] | None, sizes: dict[str, int]) -> Duals:
    """The LAP duals a previous call left in ``init`` (float64), checked against the groups."""
    duals: Duals = {}
    if not isinstance(init, MatchingState):
        return duals
    for g, (u, v) in init.duals.items():
        if g not in sizes:
            continue
        u, v = np.asarray(u), np.asarray(v)
        if u.shape != (sizes[g],) or v.shape != (sizes[g],) or u.dtype.kind + v.dtype.kind != "ff":
            raise SpecError(
                f"init.duals[{g!r}] must be two float arrays of length {sizes[g]} (the size "
                f"of permutation group {g!r}), got {u.dtype}{u.shape} and {v.dtype}{v.shape}; "
                "pass the state of a matching of the same architecture, or drop the duals"
            )
        duals[g] = (u.astype(np.float64), v.astype(np.float64))
    return duals


def _start_permutation(
    a: StateDict,
    b: StateDict,
    spec: PermutationSpec,
    sizes: dict[str, int],
    init: MatchingState | Mapping[str, Tensor] | None,
    device: torch.device,
) -> tuple[dict[str, Tensor], set[str]]:
    """The permutation the search starts from and the groups frozen at first: ``init``'s,
    else the identity, with coupled groups (attention heads) paired by
    :func:`~lmc.permutation.coupled.coupled_start` and frozen until the other groups have
    converged around them."""
    init_perm = init.perm if isinstance(init, MatchingState) else init
    if init_perm is not None:
        check_permutation(init_perm, sizes)
        return {g: init_perm[g].to(device, torch.long) for g in sizes}, set()
    perm = {g: torch.arange(n, device=device) for g, n in sizes.items()}
    start = coupled_start(a, b, spec) or {}
    perm.update({g: p.to(device) for g, p in start.items()})
    return perm, set(start)


def align_weights(
    target: StateDict | nn.Module,
    source: StateDict | nn.Module,
    spec: PermutationSpec | None = None,
    **kwargs: Unpack[WeightMatchingOptions],
) -> tuple[dict[str, Tensor], WeightMatchingResult]:
    """Weight-match ``source`` to ``target`` and return ``pi(source)`` with the result.

    Keyword arguments are passed to :func:`weight_matching`.
    """
    spec = _resolve_spec(spec, target, source)
    result = weight_matching(target, source, spec, **kwargs)
    return apply_permutation(as_state_dict(source), spec, result.perm), result
