"""A batched epsilon-scaling auction on the device (issue 48): many independent square LAPs of one
size solved at once as tensor programs, near-optimal, then finished exactly on the host.

The host kernel (:func:`lmc.permutation.lap.sap_solver`) solves one LAP at a time, each a
sequence of short dependent steps, and on a GPU machine every solve of a sweep waits for it.
Here a batch ``(B, n, n)`` of costs (minimised) goes through a Jacobi auction (Bertsekas 1988):
in one step every unassigned row of every problem bids for the column of its smallest reduced
cost ``c[i, j] - v[j]``, lowering that column's dual by the gap to its second smallest plus
``eps``; each column goes to its best bid (ties to the lowest row) and its previous row is freed.
Epsilon falls by ``factor`` from a quarter of the costs' range to ``eps_end`` (each phase keeps
the duals and frees every row). At the end the assignment satisfies eps-complementary slackness,
so its cost is within ``n * eps_end`` of the optimum (Bertsekas' bound; for integer costs and
``eps_end < 1 / n`` it is optimal). :func:`auction_solve` then hands each problem's assignment
and column duals to the host kernel's warm start, which returns the exact optimum, as from
any warm start, only faster the closer the duals are.

Every step is a few batched tensor operations (a top-2 over the rows, two scatter-reduces), and
the number of steps is read back only every ``check_every`` steps, so the host does not wait
for the device at each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lmc.permutation.lap import LapInputError, LapSolution, sap_solver

#: epsilon's last value relative to the costs' range (as the host kernel's auction)
EPS_END = 1e-7
#: epsilon shrinks by this factor from phase to phase
FACTOR = 5.0


@dataclass
class AuctionResult:
    """Assignments (row -> column) ``perm`` (B, n), column duals ``v`` (B, n) with
    ``c[i, j] - v[j] <= min_j' (c[i, j'] - v[j']) + eps`` at every row's column, the bids made
    (over the batch), the auction steps (each one batched program) and the last epsilon."""

    perm: Tensor
    v: Tensor
    bids: int
    steps: int
    eps: float


def _check(costs: Tensor) -> Tensor:
    if costs.ndim == 2:
        costs = costs.unsqueeze(0)
    if costs.ndim != 3 or costs.shape[1] != costs.shape[2]:
        raise LapInputError(
            f"the device auction takes square costs (n, n) or a batch (B, n, n), got shape "
            f"{tuple(costs.shape)}; pad rectangular problems or use sap_solver"
        )
    if not costs.is_floating_point():
        costs = costs.double()
    if not bool(torch.isfinite(costs).all()):
        raise LapInputError("LAP cost matrices contain NaN/inf entries; costs must be finite")
    return costs


@torch.no_grad()
def auction(
    costs: Tensor,
    eps_end: float | None = None,
    factor: float = FACTOR,
    max_steps: int = 100_000,
    check_every: int = 16,
) -> AuctionResult:
    """Near-optimal assignments of a batch of square cost matrices (minimised), on their device.

    Args:
        costs: (B, n, n) or (n, n); float64 keeps small epsilons exact (float32 is widened).
        eps_end: the last epsilon (default :data:`EPS_END` times the largest range in the
            batch); the assignment's cost is within ``n * eps_end`` of the optimum.
        factor: epsilon's shrink factor between phases (> 1).
        max_steps: a bound on the auction steps of all phases together; reaching it raises.
        check_every: steps between reads of "is any row still unassigned" (host syncs).

    Raises:
        LapInputError: non-square or non-finite costs, a non-positive ``eps_end``.
        RuntimeError: ``max_steps`` reached (it names the phase's epsilon).
    """
    c = _check(costs).double()
    b, n, _ = c.shape
    device = c.device
    lo = c.amin(dim=(1, 2), keepdim=True)
    span = float((c.amax(dim=(1, 2), keepdim=True) - lo).max())
    v = torch.zeros(b, n, dtype=c.dtype, device=device)
    perm = torch.arange(n, device=device).expand(b, n).clone()
    if n < 2 or not span > 0:  # one column or constant costs: any assignment is optimal
        return AuctionResult(perm, v, 0, 0, 0.0)
    eps_end = span * EPS_END if eps_end is None else float(eps_end)
    if not eps_end > 0 or not factor > 1:
        raise LapInputError(f"eps_end must be > 0 and factor > 1, got {eps_end} and {factor}")
    index = torch.arange(n, device=device).expand(b, n)  # each problem's rows (or columns)
    flat = (torch.arange(b, device=device) * n).unsqueeze(1)  # a problem's offset in B * n
    eps, steps = max(span / 4, eps_end), 0
    bids = torch.zeros((), dtype=torch.long, device=device)  # read back once, at the end
    while True:
        owner = torch.full((b, n), -1, dtype=torch.long, device=device)  # column -> row
        perm = torch.full((b, n), -1, dtype=torch.long, device=device)  # row -> column
        while True:
            free = perm < 0
            if steps % check_every == 0 and not bool(free.any()):
                break
            if steps >= max_steps:
                raise RuntimeError(
                    f"the device auction made {steps} steps without assigning every row (at "
                    f"epsilon {eps:.3g}); raise max_steps or solve on the host (sap_solver)"
                )
            steps += 1
            reduced = c - v.unsqueeze(1)  # (B, n, n): c[i, j] - v[j]
            best, cols = reduced.topk(2, dim=2, largest=False)  # each row's two smallest
            j1 = cols[..., 0]
            # the new dual row i offers column j1: as low as keeps j1 its best by eps
            offer = v.gather(1, j1) - (best[..., 1] - best[..., 0]) - eps
            offer = torch.where(free, offer, torch.inf)
            target = (flat + j1).flatten()
            lowest = torch.full((b * n,), torch.inf, dtype=c.dtype, device=device)
            lowest.scatter_reduce_(0, target, offer.flatten(), "amin")
            won = free & (offer == lowest[target].view(b, n))
            # ties: the lowest row among the column's best offers
            winner = torch.full((b * n,), n, dtype=torch.long, device=device)
            winner.scatter_reduce_(0, target[won.flatten()], index[won], "amin")
            winner = winner.view(b, n)
            taken = winner < n  # columns that got a bid
            bids += free.sum()
            old = torch.where(taken, owner, -1)
            gone = old >= 0
            perm.view(-1)[(flat + old.clamp(min=0)).flatten()[gone.flatten()]] = -1
            perm.view(-1)[(flat + winner.clamp(max=n - 1)).flatten()[taken.flatten()]] = index[
                taken
            ]
            owner = torch.where(taken, winner, owner)
            v = torch.where(taken, lowest.view(b, n), v)
        if eps <= eps_end:
            return AuctionResult(perm, v, int(bids), steps, eps)
        eps = max(eps / factor, eps_end)


def auction_solve(costs: Tensor | Sequence[Tensor], **options: Any) -> list[LapSolution]:
    """Exact LAPs of a batch: the device auction's assignments and column duals, finished by
    the host kernel's warm start (:func:`lmc.permutation.lap.sap_solver`), which returns an
    optimum whatever it starts from. ``options`` go to :func:`auction`."""
    c = _check(torch.stack(list(costs)) if not isinstance(costs, Tensor) else costs).double()
    result = auction(c, **options)  # its own check of c is one reduction, beside its steps'
    host = c.cpu().numpy()
    perms, duals = result.perm.cpu().numpy(), result.v.cpu().numpy()
    return [
        sap_solver(np.ascontiguousarray(k), warm=LapSolution(p.astype(np.int64), v=d))
        for k, p, d in zip(host, perms, duals)
    ]
