"""The coordinate descent of :func:`lmc.permutation.weight_matching` (see its module
docstring) as named steps: sweeps over the groups in a seeded order, batches of groups whose
LAPs cannot affect each other solved at once, warm-started from the last duals (accelerated,
004 Alg. 3) or not (plain, Alg. 2), and the checks of each cost matrix."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from lmc.permutation._costs import Member, Problem
from lmc.permutation.lap import LapInputError, LapSolution, TimedSolver
from lmc.permutation.spec import PermutationSpec, SpecError

Duals = dict[str, tuple[np.ndarray, np.ndarray]]


class _Search:
    """The coordinate descent over the groups (see the module docstring), in place on ``perm``
    and ``duals``: sweeps in a seeded random order, each a run of batches of groups whose LAPs
    cannot affect each other, solved at once (``at_once`` at most). Accelerated (Alg. 3) when
    ``duals`` warm-start the solves and a group is solved only when a neighbour changed;
    plain (Alg. 2) when the solver returns no duals. ``max_cells``: the cost entries of the
    LAPs solved at once, at most (:data:`lmc.permutation.weight_matching.CONCURRENT_LAP_CELLS`)."""

    def __init__(
        self,
        problem: Problem,
        spec: PermutationSpec,
        sizes: dict[str, int],
        perm: dict[str, Tensor],
        duals: Duals,
        frozen: set[str],
        lap: TimedSolver,
        tol: float,
        at_once: int,
        accelerated: bool = True,
        max_cells: int = 2 * 2048 * 2048,
    ) -> None:
        self.problem, self.spec, self.sizes, self.perm = problem, spec, sizes, perm
        self.duals, self.frozen, self.lap = duals, frozen, lap
        self.accelerated, self.tol, self.at_once = accelerated, tol, at_once
        self.max_cells = max_cells  # cost entries of the LAPs solved at once, at most
        self.device = next(iter(perm.values())).device if perm else torch.device("cpu")
        # the LAPs' copy of the permutation: no read-back a solve
        self.host = {g: p.cpu().numpy() for g, p in perm.items()}
        self.groups = [g for g in spec.groups if g in sizes]
        self.version = dict.fromkeys(self.groups, 0)
        self.solved_at: dict[str, dict[str, int] | None] = dict.fromkeys(self.groups)
        self.history: list[float] = []
        self.cost_seconds = 0.0

    def run(self, max_sweeps: int, rng: np.random.Generator) -> tuple[bool, int]:
        """Sweep until converged or ``max_sweeps``; ``(converged, sweeps)``."""
        sweeps = 0
        while sweeps < max_sweeps:
            if self.accelerated and not any(self.needs_solve(g) for g in self.groups):
                return True, sweeps
            sweeps += 1
            order = [self.groups[i] for i in rng.permutation(len(self.groups))]
            improved = self.sweep(order)
            self.history.append(self.problem.total())
            if self.frozen and not improved:  # the rest converged around the coupled groups
                self.frozen = set()
                continue
            if not self.accelerated and not improved:
                return True, sweeps
        return self.accelerated and not any(self.needs_solve(g) for g in self.groups), sweeps

    def needs_solve(self, g: str) -> bool:
        """Whether a neighbour of ``g`` changed since ``g`` was last solved (accelerated)."""
        last = self.solved_at[g]
        return last is None or any(self.version[h] != last[h] for h in self.spec.neighbors[g])

    def sweep(self, order: list[str]) -> bool:
        """One pass over ``order``; whether any group's permutation improved."""
        improved = False
        at = 0
        while at < len(order):
            batch, at = self.next_batch(order, at)
            improved |= self.solve(batch)
        return improved

    def next_batch(self, order: list[str], start: int) -> tuple[list[str], int]:
        """The groups to solve from ``order[start:]`` on whose solves cannot affect each other:
        it stops before the first group that neighbours one already taken (its cost matrix,
        and whether it needs a solve at all, depend on that solve's outcome). Solving a batch
        at once therefore follows the one-by-one trajectory exactly."""
        batch: list[str] = []
        cells = 0
        i = start
        while i < len(order) and len(batch) < self.at_once:
            g = order[i]
            if g not in self.frozen and any(h in self.spec.neighbors[g] for h in batch):
                break
            size = self.sizes[g] ** 2
            if batch and g not in self.frozen and cells + size > self.max_cells:
                break
            i += 1
            if g in self.frozen or (self.accelerated and not self.needs_solve(g)):
                continue  # frozen, or its cost matrix is the one it was last solved for
            batch.append(g)
            cells += size
        return batch, i

    def cost_matrix(self, g: str) -> tuple[Tensor, list[tuple[Member, Tensor]]]:
        """The LAP's input ``K_g = -C_g``, summed negated (exactly the negation of the sum:
        rounding is symmetric), and the member products (left intact for the objective)."""
        stat = self.problem.static[g]
        k = stat.neg() if stat is not None else None
        prods = []
        for m in self.problem.dynamic[g]:
            prod = m.kept_product(self.perm) if self.accelerated else m.product(self.perm)
            k = prod.neg() if k is None else k.sub_(prod)
            prods.append((m, prod))
        if k is None:
            k = torch.zeros(self.sizes[g], self.sizes[g], device=self.device)
        return k, prods

    def solve(self, batch: list[str]) -> bool:
        """Solve ``batch``'s LAPs at once and keep each group's new permutation where it
        improves the group's objective by more than ``tol * n * max|K|``."""
        t0 = time.perf_counter()
        built = [self.cost_matrix(g) for g in batch]
        costs, scales = _to_host([c for c, _ in built])
        self.cost_seconds += time.perf_counter() - t0
        problems = []
        for g, k in zip(batch, costs):
            warm = None
            if self.accelerated and g in self.duals:
                warm = LapSolution(self.host[g], *self.duals[g])
            problems.append((k, warm))
        solutions = self.lap.many(problems, self.at_once)
        improved = False
        for g, k, scale, (_, prods), sol in zip(batch, costs, scales, built, solutions):
            if isinstance(sol, LapInputError):
                raise SpecError(_cost_error(g, self.problem, prods, sol)) from sol
            if self.accelerated:
                if sol.u is None or sol.v is None:
                    self.duals.pop(g, None)
                else:
                    self.duals[g] = (sol.u, sol.v)
            rows = np.arange(k.shape[0])
            old = -float(k[rows, self.host[g]].sum(dtype=np.float64))
            new = -float(k[rows, sol.perm].sum(dtype=np.float64))
            if new - old > self.tol * k.shape[0] * scale:
                self.perm[g] = torch.as_tensor(sol.perm, device=self.device)
                self.host[g] = np.asarray(sol.perm, dtype=np.int64)
                self.version[g] += 1
                improved = True
            self.solved_at[g] = {h: self.version[h] for h in self.spec.neighbors[g]}
            self.problem.refresh(g, prods, self.perm)
        return improved


def _to_host(costs: list[Tensor]) -> tuple[list[np.ndarray], list[float]]:
    """The LAPs' inputs ``K`` as numpy arrays in their own dtype (float32 or float64; lower
    precisions widened to float32, exactly) and ``max |K|`` of each.

    From a GPU, every matrix goes into page-locked host memory, all in one pass of copies and
    one sync (a pageable float64 copy ran at ~2.5 GB/s on an H100 host: 13 ms for each n = 2048
    matrix); on the CPU the arrays share the tensors' memory. ``max |K|`` is one ``aminmax``
    pass on the costs' device (``vector_norm(inf)`` took 5.3 ms for an n = 2048 float32
    matrix on the CPU, ``aminmax`` 0.3 ms). The LAP kernel reads float32 costs as they are:
    every operation on them widens them to float64 exactly."""
    if not costs:
        return [], []
    costs = [c if c.dtype in (torch.float32, torch.float64) else c.float() for c in costs]
    norms = torch.stack([_max_abs(c) for c in costs])  # on the costs' device: no sync yet
    if costs[0].device.type == "cuda":
        hosts = []
        for c in costs:
            buffer = torch.empty(c.shape, dtype=c.dtype, pin_memory=True)
            buffer.copy_(c, non_blocking=True)
            hosts.append(buffer)
    else:
        hosts = [c.cpu() for c in costs]
    scales = norms.cpu().tolist()  # on a GPU after the copies on the stream: they are done
    return [h.numpy() for h in hosts], scales


def _max_abs(t: Tensor) -> Tensor:
    """``max |t|`` as a float64 scalar on ``t``'s device, by one ``aminmax`` pass (0 when
    empty)."""
    if not t.numel():
        return t.new_zeros((), dtype=torch.float64)
    lo, hi = torch.aminmax(t)
    return torch.maximum(-lo, hi).double()


def _cost_error(
    g: str, problem: Problem, prods: list[tuple[Member, Tensor]], err: LapInputError
) -> str:
    """What to say when group ``g``'s LAP rejects its cost matrix: the group and its layers."""
    bad = [m.key for m, p in prods if not bool(torch.isfinite(p).all())]
    for key, axis in problem.spec.groups[g]:
        if key in problem.static_keys:  # summed into the permutation-independent part
            a = problem.a[key].movedim(axis, 0).reshape(problem.a[key].shape[axis], -1)
            b = problem.b[key].movedim(axis, 0).reshape(problem.b[key].shape[axis], -1)
            if not bool(torch.isfinite(a @ b.T).all()):
                bad.append(key)
    layers = bad or [key for key, _ in problem.spec.groups[g]]
    return (
        f"the weight-matching cost matrix of permutation group {g!r} is not usable: {err}; "
        f"layers {layers} of that group produce it. Finite weights can still overflow float32 "
        "in the products: rescale or fix those weights"
    )
