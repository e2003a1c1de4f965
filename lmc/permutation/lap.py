"""Pluggable linear assignment (LAP) solvers with optional dual variables (004 §2.4).

A solver takes a square cost matrix ``K`` (float64, *minimised*) and returns the assignment
``perm`` (row ``i`` -> column ``perm[i]``) and, if it can, optimal dual variables ``u`` (rows)
and ``v`` (columns) with ``K[i, j] - u[i] - v[j] >= 0`` everywhere and ``= 0`` on the
assignment (eq. 3-4). Duals let accelerated weight matching warm-start the next solve on the
reduced costs ``K - u - v`` (004 §4.2, Alg. 3).

Built in: ``"scipy"`` (``scipy.optimize.linear_sum_assignment``, no duals, the default),
``"lapjv"`` (Jonker-Volgenant from the ``lapjv`` package, float32 solve on row-reduced costs,
float64 duals) and ``"lapjv64"`` (the same in double precision). Any callable
``(K) -> LapSolution`` works too; :func:`register_solver` makes it available by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment


@dataclass
class LapSolution:
    """Solution of a minimisation LAP: assignment and, when available, optimal duals."""

    perm: np.ndarray
    u: np.ndarray | None = None
    v: np.ndarray | None = None


LapSolver = Callable[[np.ndarray], LapSolution]


def scipy_solver(cost: np.ndarray) -> LapSolution:
    """``scipy.optimize.linear_sum_assignment`` (shortest augmenting path); no duals."""
    _, cols = linear_sum_assignment(cost)
    return LapSolution(cols.astype(np.int64))


def lapjv_solver(cost: np.ndarray, precision: str = "float32") -> LapSolution:
    """Jonker-Volgenant (``lapjv`` package) returning optimal duals.

    With ``precision="float32"`` (the default, about 2-4x faster) the matrix is first reduced
    by its row minima in float64, solved in float32, and the duals are returned in float64
    (row minima added back). The assignment is then optimal up to float32 rounding of the
    reduced costs, which is below the rounding of float32 weight products that produce cost
    matrices in weight matching. ``"float64"`` solves in double precision.

    The duals are verified (feasible and tight on the assignment up to rounding); if the check
    fails the problem is solved again in float64, and failing that, the assignment comes from
    scipy without duals, so a caller never warm-starts from wrong duals.
    """
    try:
        from lapjv import lapjv
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the 'lapjv' LAP solver needs the lapjv package (pip install lapjv); accelerated "
            "weight matching uses it for the dual variables"
        ) from e
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    n = cost.shape[0]
    if precision == "float32":
        shift = cost.min(axis=1)
        reduced32 = (cost - shift[:, None]).astype(np.float32)
        rows, _, (_, u, v) = lapjv(reduced32)
        u = u.astype(np.float64) + shift
        rtol = 1e-5
    elif precision == "float64":
        rows, _, (_, u, v) = lapjv(cost, force_doubles=True)
        rtol = 1e-9
    else:
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}")
    perm = rows.astype(np.int64)
    v = v.astype(np.float64)
    scale = rtol * (1.0 + float(np.abs(cost).max(initial=0.0)))
    ok = n == 0 or np.bincount(perm, minlength=n).max() == 1
    if ok and n:
        reduced = cost - u[:, None]
        reduced -= v[None, :]
        tight = np.abs(reduced[np.arange(n), perm]).max()
        ok = reduced.min() >= -scale and tight <= scale
    if not ok:  # pragma: no cover - defensive; not observed
        return lapjv_solver(cost, "float64") if precision == "float32" else scipy_solver(cost)
    return LapSolution(perm, u, v)


def lapjv64_solver(cost: np.ndarray) -> LapSolution:
    """:func:`lapjv_solver` in double precision."""
    return lapjv_solver(cost, "float64")


_SOLVERS: dict[str, tuple[LapSolver, bool]] = {
    "scipy": (scipy_solver, False),
    "lapjv": (lapjv_solver, True),
    "lapjv64": (lapjv64_solver, True),
}


def register_solver(name: str, solver: LapSolver, returns_duals: bool) -> None:
    """Make ``solver`` available by ``name`` for weight and activation matching."""
    _SOLVERS[name] = (solver, returns_duals)


def available_solvers() -> list[str]:
    """Names of the registered solvers."""
    return list(_SOLVERS)


def get_solver(solver: str | LapSolver) -> tuple[LapSolver, bool]:
    """Resolve a solver name or callable to ``(callable, returns_duals)``.

    A plain callable is assumed to return duals if its solutions carry them; it is reported as
    dual-returning so that accelerated matching can use it.
    """
    if callable(solver):
        return solver, True
    try:
        return _SOLVERS[solver]
    except KeyError:
        raise ValueError(
            f"unknown LAP solver {solver!r}; choose one of {available_solvers()} or pass a "
            "callable cost -> LapSolution"
        ) from None


class TimedSolver:
    """Wraps a solver and accumulates the number of solves and the seconds spent in them."""

    def __init__(self, solver: str | LapSolver) -> None:
        self.fn, self.returns_duals = get_solver(solver)
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, cost: np.ndarray) -> LapSolution:
        """Solve ``min_P <K, P>`` for a square ``cost`` matrix."""
        if cost.ndim != 2 or cost.shape[0] != cost.shape[1]:
            raise ValueError(f"LAP cost matrix must be square, got shape {cost.shape}")
        t0 = time.perf_counter()
        sol = self.fn(cost)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return sol


def solve_max(similarity: np.ndarray, solver: str | LapSolver = "scipy") -> np.ndarray:
    """The assignment maximising ``sum_i S[i, perm[i]]`` (e.g. a correlation matrix)."""
    fn, _ = get_solver(solver)
    return fn(-np.asarray(similarity, dtype=np.float64)).perm
