"""Loss and accuracy barriers along a path (000 Def. 2.1, §4.1; 004 §5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

# Below this mean endpoint loss the normalised barrier B / mean(L(0), L(1)) divides by a number
# that is mostly noise (e.g. 1.7e-6 turns a barrier of 0.14 into 84,000): it is reported as NaN.
NORMALIZED_MIN_LOSS = 1e-3


def alpha_grid(n: int = 25) -> list[float]:
    """``n`` evenly spaced interpolation coefficients from 0 to 1 inclusive.

    Raises:
        ValueError: fewer than 3 points: the endpoints alone have no interior point, so every
            barrier would read 0.
    """
    if n < 3:
        raise ValueError(
            f"an alpha grid needs at least 3 points (the endpoints and one interior point), got "
            f"{n}: with only the endpoints every barrier reads 0; set num_alphas >= 3 (25 is usual)"
        )
    return np.linspace(0.0, 1.0, n).tolist()


@dataclass(frozen=True)
class Barrier:
    """Barrier summary of one path.

    ``loss`` is max over alpha of L(alpha) − [(1−alpha) L(0) + alpha L(1)] (never negative: the
    endpoints are on the grid, where the difference is 0), ``loss_normalized`` divides it by the
    mean endpoint loss (000 §4.1) and is NaN (undefined) when that mean is below
    :data:`NORMALIZED_MIN_LOSS`, ``acc`` is max over alpha of the chord accuracy minus A(alpha).
    ``alpha_loss``/``alpha_acc`` locate the maxima; ``mean_loss`` is the trapezoidal integral
    of L over the path.
    """

    loss: float
    loss_normalized: float
    acc: float
    alpha_loss: float
    alpha_acc: float
    mean_loss: float

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def loss_barrier(alphas: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Signed max of ``values - chord`` over the grid and the alpha where it is reached."""
    a = np.asarray(alphas, dtype=float)
    v = np.asarray(values, dtype=float)
    if a.shape != v.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError("alphas and values must be 1-D sequences of equal length >= 2")
    if a[0] != 0.0 or a[-1] != 1.0:
        raise ValueError("the alpha grid must start at 0 and end at 1 (the two endpoints)")
    gap = v - ((1 - a) * v[0] + a * v[-1])
    i = int(np.argmax(gap))
    return float(gap[i]), float(a[i])


def barrier(
    alphas: Sequence[float], losses: Sequence[float], accs: Sequence[float] | None = None
) -> Barrier:
    """All barrier numbers of one path from its per-alpha losses (and accuracies)."""
    b_loss, a_loss = loss_barrier(alphas, losses)
    mean_end = (losses[0] + losses[-1]) / 2
    normalized = b_loss / mean_end if mean_end >= NORMALIZED_MIN_LOSS else float("nan")
    b_acc, a_acc = float("nan"), float("nan")
    if accs is not None and not np.isnan(np.asarray(accs, dtype=float)).any():
        b_acc, a_acc = loss_barrier(alphas, [-x for x in accs])
    mean_loss = (
        float(np.trapezoid(losses, alphas))
        if hasattr(np, "trapezoid")
        else float(np.trapz(losses, alphas))
    )
    return Barrier(b_loss, normalized, b_acc, a_loss, a_acc, mean_loss)
