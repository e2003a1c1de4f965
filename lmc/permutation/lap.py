"""Pluggable linear assignment (LAP) solvers with optional dual variables (004 §2.4).

A solver takes a square cost matrix ``K`` (float32 or float64, *minimised*; a callable
registered by the user gets float64) and returns the assignment
``perm`` (row ``i`` -> column ``perm[i]``) and, if it can, optimal dual variables ``u`` (rows)
and ``v`` (columns) with ``K[i, j] - u[i] - v[j] >= 0`` everywhere and ``= 0`` on the
assignment (eq. 3-4). Duals let accelerated weight matching warm-start the next solve on the
reduced costs ``K - u - v`` (004 §4.2, Alg. 3).

Built in: ``"scipy"`` (``scipy.optimize.linear_sum_assignment``, no duals, the default of
plain matching) and ``"sap"`` (shortest augmenting paths compiled with numba, with duals and a
true warm start: :mod:`lmc.permutation.lap_sap`; the default of accelerated matching).
``"lapjv"`` and ``"lapjv64"``, the names of the lapjv-based solvers that ``"sap"`` replaced
(issue 18: lapjv has wheels for CPython 3.9-3.11 on Linux x86-64 only), are aliases of
``"sap"``. Any callable ``(K) -> LapSolution`` works too, and one that also accepts
``warm=LapSolution`` is warm-started; :func:`register_solver` makes it available by name.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeGuard

import numpy as np
from scipy.optimize import linear_sum_assignment


@dataclass
class LapSolution:
    """Solution of a minimisation LAP: assignment and, when available, optimal duals."""

    perm: np.ndarray
    u: np.ndarray | None = None
    v: np.ndarray | None = None
    #: rows that needed an augmenting path (warm-starting solvers; ``None`` if not reported)
    freed: int | None = None


LapSolver = Callable[[np.ndarray], LapSolution]


class WarmLapSolver(Protocol):
    """A solver that also takes a previous solution to start from (``warm``)."""

    def __call__(self, cost: np.ndarray, warm: LapSolution | None = None) -> LapSolution: ...


def scipy_solver(cost: np.ndarray) -> LapSolution:
    """``scipy.optimize.linear_sum_assignment`` (shortest augmenting path); no duals."""
    _, cols = linear_sum_assignment(cost)
    return LapSolution(cols.astype(np.int64))


class LapInputError(ValueError):
    """A cost matrix or warm start the solver cannot use (NaN/inf costs, wrong shapes)."""


def _check_warm(warm: LapSolution, nr: int, nc: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(perm, v)`` of a warm start for an ``nr x nc`` problem."""
    perm = np.asarray(warm.perm)
    if perm.shape != (nr,) or perm.dtype.kind not in "iu":
        raise LapInputError(
            f"warm-start perm must be an integer array of length {nr} (one column per row), "
            f"got dtype {perm.dtype} and shape {perm.shape}"
        )
    v = warm.v
    if v is None:
        raise LapInputError("warm start without column duals v: pass warm=None for a cold solve")
    v = np.asarray(v)
    if v.shape != (nc,) or v.dtype.kind != "f":
        raise LapInputError(
            f"warm-start duals v must be a float array of length {nc} (one per column), got "
            f"dtype {v.dtype} and shape {v.shape}"
        )
    if warm.u is not None:
        u = np.asarray(warm.u)
        if u.shape != (nr,) or u.dtype.kind != "f":
            raise LapInputError(
                f"warm-start duals u must be a float array of length {nr} (one per row), got "
                f"dtype {u.dtype} and shape {u.shape}"
            )
    if not np.isfinite(v).all():
        raise LapInputError("warm-start duals v contain NaN/inf; pass warm=None for a cold solve")
    valid = perm[perm >= 0]
    if valid.size and (valid.max() >= nc or np.bincount(valid, minlength=nc).max() > 1):
        raise LapInputError(
            f"warm-start perm must assign distinct columns in [0, {nc}) (-1 for none)"
        )
    return perm.astype(np.int64), v.astype(np.float64)


def _nonfinite_error(cost: np.ndarray) -> LapInputError:
    bad = np.argwhere(~np.isfinite(cost))
    if len(bad):
        i, j = bad[0]
        return LapInputError(
            f"LAP cost matrix has {len(bad)} NaN/inf entries (first at row {i}, column {j}, "
            f"value {cost[i, j]}); costs must be finite"
        )
    return LapInputError("cost matrix minus the warm-start duals overflows; cold-start instead")


def sap_solver(cost: np.ndarray, warm: LapSolution | None = None) -> LapSolution:
    """Exact LAP by shortest augmenting paths with a true warm start (numba; issue 18).

    Cold (``warm=None``): column reduction, a greedy start on row minima, then one shortest
    augmenting path (Dijkstra on reduced costs) per row still free; about twice as fast as
    scipy at n = 512-2048. Warm: given a previous assignment and its duals (``warm.perm``,
    ``warm.v``; ``warm.u`` is recomputed), restore dual feasibility, keep every previous pair
    that stays tight and run augmenting paths only from the freed rows
    (:mod:`lmc.permutation.lap_sap`). When the augmenting paths turn out long (nearly flat
    costs, as trained VGGs' wide layers give), an epsilon-scaling auction computes the duals
    to finish from instead. The result is optimal whatever the warm start (exact, stale or
    garbage duals); only the time depends on it. ``LapSolution.freed`` is the number
    of rows that needed an augmenting path.

    Rectangular costs are padded with zero-cost rows or columns to a square problem; rows left
    without a column get ``perm = -1`` and the duals are those of the padded problem.

    Raises:
        LapInputError: NaN/inf costs, or a warm start of the wrong length or dtype.
    """
    from lmc.permutation.lap_sap import NONFINITE, OK, sap_square

    cost = np.asarray(cost)
    if cost.ndim != 2:
        raise LapInputError(f"LAP cost matrix must be 2-D, got shape {cost.shape}")
    if cost.dtype.kind not in "fiub":
        raise LapInputError(f"LAP cost matrix must be real, got dtype {cost.dtype}")
    nr, nc = cost.shape
    n = max(nr, nc)
    if n == 0:
        return LapSolution(np.zeros(nr, np.int64), np.zeros(nr), np.zeros(nc), freed=0)
    x0 = v0 = None
    if warm is not None:
        x0, v0 = _check_warm(warm, nr, nc)
    # float32 costs are read as they are: every operation on them widens them to float64
    # exactly, so the result is the widened matrix's (and a pass and half the memory are saved)
    dtype = np.float32 if cost.dtype == np.float32 else np.float64
    if nr == nc:
        square = np.ascontiguousarray(cost, dtype=dtype)
    else:
        square = np.zeros((n, n), dtype=dtype)
        square[:nr, :nc] = cost
        if x0 is not None:  # the unused columns (dummy rows) or dummy columns (unused rows)
            x0 = np.concatenate([x0, np.full(n - nr, -1, np.int64)])
            spare = np.setdiff1d(np.arange(n), x0[x0 >= 0])
            x0[x0 < 0] = spare
            v0 = np.concatenate([v0, np.zeros(n - nc)])
    x, u, v, status, _, freed, _ = sap_square(square, x0, v0)
    if status == NONFINITE:
        err = _nonfinite_error(np.asarray(cost, dtype=np.float64))
        if warm is not None and "overflows" in str(err):
            return sap_solver(cost)
        raise err
    if status != OK:  # pragma: no cover - finite costs always augment
        raise RuntimeError(f"LAP kernel failed with status {status}")
    perm = x[:nr].copy()
    perm[perm >= nc] = -1
    return LapSolution(perm, u[:nr].copy(), v[:nc].copy(), freed=freed)


_SOLVERS: dict[str, tuple[LapSolver, bool]] = {
    "scipy": (scipy_solver, False),
    "sap": (sap_solver, True),
}
#: names kept for configs and code written for the removed lapjv-based solvers
_ALIASES = {"lapjv": "sap", "lapjv64": "sap"}


def register_solver(name: str, solver: LapSolver, returns_duals: bool) -> None:
    """Make ``solver`` available by ``name`` for weight and activation matching.

    A solver that accepts a ``warm`` keyword (a previous :class:`LapSolution`) is warm-started
    by accelerated weight matching; others are given the reduced costs ``K - u - v``.
    """
    _SOLVERS[name] = (solver, returns_duals)


def available_solvers() -> list[str]:
    """Names of the registered solvers (and the aliases kept for old configs)."""
    return list(_SOLVERS) + list(_ALIASES)


def get_solver(solver: str | LapSolver) -> tuple[LapSolver, bool]:
    """Resolve a solver name or callable to ``(callable, returns_duals)``.

    A plain callable is assumed to return duals if its solutions carry them; it is reported as
    dual-returning so that accelerated matching can use it. ``"lapjv"`` and ``"lapjv64"`` (the
    lapjv package is no longer a dependency) resolve to ``"sap"``.
    """
    if callable(solver):
        return solver, True
    try:
        return _SOLVERS[_ALIASES.get(solver, solver)]
    except KeyError:
        raise ValueError(
            f"unknown LAP solver {solver!r}; choose one of {available_solvers()} or pass a "
            "callable cost -> LapSolution"
        ) from None


def accepts_warm(fn: LapSolver) -> TypeGuard[WarmLapSolver]:
    """Whether ``fn`` takes a ``warm`` keyword (a previous solution to start from)."""
    try:
        return "warm" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
        return False


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The process's LAP thread pool (one thread per core), created on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(available_cores(), thread_name_prefix="lmc-lap")
        return _POOL


def _forget_pool() -> None:  # a forked child has the pool object but none of its threads
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class TimedSolver:
    """Wraps a solver and accumulates the number of solves and the seconds spent in them."""

    def __init__(self, solver: str | LapSolver) -> None:
        self.fn, self.returns_duals = get_solver(solver)
        #: the solver again where it takes a ``warm`` keyword (``warm_start``), else ``None``
        self.warm_fn: WarmLapSolver | None = self.fn if accepts_warm(self.fn) else None
        self.warm_start = self.warm_fn is not None
        #: problems solved at once by default: the built-in solvers release the GIL (numba
        #: ``nogil``, scipy's C++), so one per core; a callable may not be thread-safe, so one
        self.workers = 1 if callable(solver) else available_cores()
        #: the built-in solvers take float32 costs as they are; any other gets them as float64
        self.float32 = self.fn in (scipy_solver, sap_solver)
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, cost: np.ndarray, warm: LapSolution | None = None) -> LapSolution:
        """Solve ``min_P <K, P>`` for a square ``cost`` matrix.

        With ``warm`` (assignment and duals of a previous solve), a warm-starting solver starts
        from it; any other solver is given the reduced costs ``K - u - v`` and its duals are
        shifted back, so that the returned duals are always those of ``cost``.

        Raises:
            LapInputError: non-square or NaN/inf ``cost``.
        """
        t0 = time.perf_counter()
        sol = self._solve(cost, warm)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return sol

    def many(
        self, problems: Sequence[tuple[np.ndarray, LapSolution | None]], workers: int | None = None
    ) -> list[LapSolution | LapInputError]:
        """Solve independent problems ``(cost, warm)``, up to ``workers`` at once (default: one
        per core for the built-in solvers, one at a time for a callable); the solutions are
        those of solving them one by one. A problem the solver rejects gets its
        :class:`LapInputError` in its place; :attr:`seconds` counts the wall time once."""
        t0 = time.perf_counter()
        workers = max(1, min(workers or self.workers, len(problems)))
        if workers == 1:
            out = [self._try(cost, warm) for cost, warm in problems]
        else:  # contiguous chunks, one a thread; the caller's thread takes the first
            bounds = np.linspace(0, len(problems), workers + 1).astype(int)
            chunks = [problems[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
            futures: list[Future[list[LapSolution | LapInputError]]] = [
                _pool().submit(self._try_all, chunk) for chunk in chunks[1:]
            ]
            out = self._try_all(chunks[0])
            for f in futures:
                out.extend(f.result())
        self.seconds += time.perf_counter() - t0
        self.calls += len(problems)
        return out

    def _try_all(
        self, problems: Sequence[tuple[np.ndarray, LapSolution | None]]
    ) -> list[LapSolution | LapInputError]:
        return [self._try(cost, warm) for cost, warm in problems]

    def _try(self, cost: np.ndarray, warm: LapSolution | None) -> LapSolution | LapInputError:
        try:
            return self._solve(cost, warm)
        except LapInputError as e:
            return e

    def _solve(self, cost: np.ndarray, warm: LapSolution | None) -> LapSolution:
        if cost.ndim != 2 or cost.shape[0] != cost.shape[1]:
            raise LapInputError(f"LAP cost matrix must be square, got shape {cost.shape}")
        if not self.float32:
            cost = np.asarray(cost, dtype=np.float64)
        if self.warm_fn is not None:
            return self.warm_fn(cost, warm=warm)
        if not np.isfinite(cost).all():
            raise _nonfinite_error(cost)
        if warm is not None and warm.u is not None and warm.v is not None:
            k = cost - warm.u[:, None]
            k -= warm.v[None, :]
            sol = self.fn(k)
            if sol.u is not None and sol.v is not None:
                sol = LapSolution(sol.perm, sol.u + warm.u, sol.v + warm.v)
            return sol
        return self.fn(cost)


def solve_max(similarity: np.ndarray, solver: str | LapSolver = "scipy") -> np.ndarray:
    """The assignment maximising ``sum_i S[i, perm[i]]`` (e.g. a correlation matrix)."""
    fn, _ = get_solver(solver)
    return fn(-np.asarray(similarity, dtype=np.float64)).perm
