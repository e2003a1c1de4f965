"""Loss and accuracy barriers along a path (000 Def. 2.1, §4.1; 004 §5), in two definitions.

The gap of a path is ``gap(α) = L(α) − chord(α)`` with ``chord(α) = (1 − α) L(0) + α L(1)``.

* ``chord``: ``sup_α gap(α)``, the largest rise above the chord (Entezari et al. 2021, eq. 1 of
  Ainsworth et al. 2023 "git re-basin", 004 §5). A path that stays below the chord has barrier 0.
* ``abs_chord``: ``sup_α |gap(α)|``, the largest distance from the chord on either side. 000
  Def. 2.1 (eq. 1) writes ``B(θ1, θ2) = |sup_α [L(αθ1 + (1 − α)θ2)] − αL(θ1) − (1 − α)L(θ2)|``:
  an absolute value around the gap, which its experiments need at initialisation (000 §4.1),
  where the path lies below the chord and ``chord`` would read 0 in almost every pair.
  ``abs_chord`` reads the absolute value inside the supremum, so a dip below the chord counts
  as much as a rise above it.

Both are always computed (``loss_chord``, ``loss_abs_chord`` and their normalised forms); the
``definition`` picks which one is ``loss`` / ``loss_normalized`` / ``acc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, cast

import numpy as np

BarrierDefinition = Literal["chord", "abs_chord"]
#: the barrier definitions, each with where it comes from
BARRIER_DEFINITIONS: dict[str, str] = {
    "chord": "sup_a [L(a) - chord(a)] (Entezari et al. 2021, git re-basin, 004)",
    "abs_chord": "sup_a |L(a) - chord(a)| (000 Def. 2.1, eq. 1)",
}


def check_definition(definition: object, where: str = "barrier") -> BarrierDefinition:
    """``definition`` if it names a barrier definition, else a ``ValueError`` naming both."""
    if definition not in BARRIER_DEFINITIONS:
        names = "; ".join(f"{k!r}: {v}" for k, v in BARRIER_DEFINITIONS.items())
        raise ValueError(f"{where}: unknown barrier definition {definition!r}; use one of {names}")
    return cast(BarrierDefinition, str(definition))


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

    ``loss_chord`` is max over alpha of L(alpha) − [(1−alpha) L(0) + alpha L(1)] (never
    negative: the endpoints are on the grid, where the difference is 0), ``loss_abs_chord`` the
    max of its absolute value; ``loss_normalized_*`` divide them by the mean endpoint loss (000
    §4.1) and are NaN (undefined) when that mean is below :data:`NORMALIZED_MIN_LOSS`.
    ``loss``, ``loss_normalized`` and ``acc`` (the chord accuracy minus A(alpha), or its
    absolute value) are in the chosen definition; ``alpha_loss``/``alpha_acc`` locate their
    maxima; ``mean_loss`` is the trapezoidal integral of L over the path.
    """

    loss: float
    loss_normalized: float
    acc: float
    alpha_loss: float
    alpha_acc: float
    mean_loss: float
    loss_chord: float
    loss_abs_chord: float
    loss_normalized_chord: float
    loss_normalized_abs_chord: float

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def loss_barrier(
    alphas: Sequence[float], values: Sequence[float], definition: BarrierDefinition = "chord"
) -> tuple[float, float]:
    """The barrier of ``values`` along ``alphas`` and the alpha where it is reached: the max of
    ``values - chord`` (``chord``) or of ``|values - chord|`` (``abs_chord``) over the grid."""
    check_definition(definition)
    a = np.asarray(alphas, dtype=float)
    v = np.asarray(values, dtype=float)
    if a.shape != v.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError("alphas and values must be 1-D sequences of equal length >= 2")
    if a[0] != 0.0 or a[-1] != 1.0:
        raise ValueError("the alpha grid must start at 0 and end at 1 (the two endpoints)")
    gap = v - ((1 - a) * v[0] + a * v[-1])
    if definition == "abs_chord":
        gap = np.abs(gap)
    i = int(np.argmax(gap))
    return float(gap[i]), float(a[i])


def barrier(
    alphas: Sequence[float],
    losses: Sequence[float],
    accs: Sequence[float] | None = None,
    definition: BarrierDefinition = "chord",
) -> Barrier:
    """All barrier numbers of one path from its per-alpha losses (and accuracies), ``loss``,
    ``loss_normalized`` and ``acc`` in ``definition`` (both definitions' loss barriers are
    kept)."""
    check_definition(definition)
    mean_end = (losses[0] + losses[-1]) / 2

    def normalize(b: float) -> float:
        return b / mean_end if mean_end >= NORMALIZED_MIN_LOSS else float("nan")

    chord, a_chord = loss_barrier(alphas, losses, "chord")
    absolute, a_abs = loss_barrier(alphas, losses, "abs_chord")
    b_loss, a_loss = (chord, a_chord) if definition == "chord" else (absolute, a_abs)
    b_acc, a_acc = float("nan"), float("nan")
    if accs is not None and not np.isnan(np.asarray(accs, dtype=float)).any():
        b_acc, a_acc = loss_barrier(alphas, [-x for x in accs], definition)
    # numpy >= 2 names it trapezoid, numpy 1.x only trapz (not in numpy 2's stubs)
    trapezoid = getattr(np, "trapezoid", None) or vars(np)["trapz"]
    mean_loss = float(trapezoid(losses, alphas))
    return Barrier(
        loss=b_loss,
        loss_normalized=normalize(b_loss),
        acc=b_acc,
        alpha_loss=a_loss,
        alpha_acc=a_acc,
        mean_loss=mean_loss,
        loss_chord=chord,
        loss_abs_chord=absolute,
        loss_normalized_chord=normalize(chord),
        loss_normalized_abs_chord=normalize(absolute),
    )
