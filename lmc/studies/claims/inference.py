"""The statistics behind a claim's verdict, each from :mod:`scipy.stats`: a mean's, a
difference's and a slope's 95 % interval, the verdict rule, two one-sided tests for an
equivalence, and the replicates a claim needs at 80 % power.

The verdict of an interval ``[lo, hi]`` for an effect expected on the side ``sign`` of 0 (read
on that side: ``s·lo``, ``s·hi``), with the paper's effect ``e`` when the claim states one in
the study's own units and it is reachable:

* ``reproduced``: the interval lies on the expected side of 0 and does not lie below ``e``
  (``s·hi ≥ s·e``): the effect is there, and not demonstrably smaller than the paper's;
* ``contradicted``: the interval lies on the other side of 0 (the direction is wrong), or it
  lies below ``e`` (``s·hi < s·e``: the effect is smaller than the paper's, whatever the side
  of 0);
* ``inconclusive``: otherwise (the interval holds 0, and ``e`` if any).

So excluding the paper's effect gives ``contradicted`` on either side of 0, and an effect that
cannot be reached (the paper's fall is larger than the study's starting value) is never
required: the claim is then judged on its direction alone (:func:`reachable`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
#: the power at which :func:`replicates_needed` sizes a claim (two-sided, 1 - CONFIDENCE)
POWER = 0.80
MAX_REPLICATES = 100_000


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided interval, from ``n`` replicates with ``df`` degrees of
    freedom; ``spread`` is one replicate's standard deviation (the standard error times
    ``sqrt(n)``), which :func:`replicates_needed` sizes a design with."""

    estimate: float
    lo: float
    hi: float
    n: int
    df: float = math.nan
    spread: float = math.nan


def _none(estimate: float, n: int) -> Interval:
    return Interval(estimate, math.nan, math.nan, n)


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` with its Student-t interval (``scipy.stats.ttest_1samp``): a
    paired difference's interval when ``values`` are the per-replicate differences."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return _none(float(x.mean()) if n else math.nan, n)
    res = stats.ttest_1samp(x, 0.0)
    ci = res.confidence_interval(confidence)
    sd = float(x.std(ddof=1))
    return Interval(float(x.mean()), float(ci.low), float(ci.high), n, float(res.df), sd)


def welch_interval(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> Interval:
    """``mean(a) - mean(b)`` with Welch's interval (``scipy.stats.ttest_ind``, unequal
    variances): two cells without shared replicates."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = min(len(x), len(y))
    estimate = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2:
        return _none(estimate, n)
    res = stats.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(confidence)
    spread = math.sqrt(float(x.var(ddof=1)) + float(y.var(ddof=1)))
    lo, hi = float(ci.low), float(ci.high)
    if not (math.isfinite(lo) and math.isfinite(hi)) and spread == 0:
        lo = hi = estimate  # no spread at all: scipy's df is 0/0
    return Interval(estimate, lo, hi, n, float(res.df), spread)


def slope_interval(
    x: Sequence[float], y: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[Interval, float, float]:
    """The least-squares slope of ``y`` on ``x`` with its interval (``scipy.stats.linregress``,
    Student t with ``n - 2`` degrees of freedom), the intercept and R²."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    if n < 3 or np.ptp(xs) == 0:
        return _none(math.nan, n), math.nan, math.nan
    fit = stats.linregress(xs, ys)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 2)) * float(fit.stderr)
    slope = float(fit.slope)
    interval = Interval(
        slope, slope - half, slope + half, n, float(n - 2), float(fit.stderr) * math.sqrt(n)
    )
    return interval, float(fit.intercept), float(fit.rvalue) ** 2


def verdict(lo: float, hi: float, sign: int, effect: float | None = None) -> str:
    """The verdict of an interval for an effect expected on the side ``sign`` (+1: above 0),
    with the paper's reachable ``effect`` in the same units or ``None`` (module docstring)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    low, high = sorted((sign * lo, sign * hi))
    if high < 0:
        return "contradicted"
    if effect is not None and high < sign * effect:
        return "contradicted"
    if low > 0:
        return "reproduced"
    return "inconclusive"


def equivalence_verdict(values: Interval, inner: Interval, margin: float) -> str:
    """Two one-sided tests at 5 % each: ``reproduced`` (equivalent) when the 90 % interval
    ``inner`` lies within ``(-margin, margin)``, ``contradicted`` when the 95 % interval
    ``values`` lies wholly outside ``[-margin, margin]`` (the difference is larger than the
    margin), else ``inconclusive``."""
    if not all(math.isfinite(v) for v in (inner.lo, inner.hi, values.lo, values.hi)):
        return "inconclusive"
    if -margin < inner.lo and inner.hi < margin:
        return "reproduced"
    if values.lo > margin or values.hi < -margin:
        return "contradicted"
    return "inconclusive"


def power(n: int, distance: float, spread: float, df_offset: int = 1, one_sided: bool = False):
    """The power of a t test on ``n`` replicates (``n - df_offset`` degrees of freedom) at level
    ``1 - CONFIDENCE`` (two-sided, or one-sided) to find a true ``distance`` from the tested value
    when one replicate's standard deviation is ``spread`` (the noncentral t,
    ``scipy.stats.nct``)."""
    df = n - df_offset
    if df < 1:
        return 0.0
    alpha = 1 - CONFIDENCE
    nc = abs(distance) * math.sqrt(n) / spread
    if one_sided:
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, nc))
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    # the other tail, P(T < -crit) = P(T' > crit) for T' with noncentrality -nc: scipy's cdf
    # gives NaN there for a large nc, where it is ~0
    other = float(stats.nct.sf(crit, df, -nc))
    upper = float(stats.nct.sf(crit, df, nc))
    if not math.isfinite(upper):  # the normal approximation where scipy's series fails
        upper = float(stats.norm.sf(crit - nc))
    return upper + (other if math.isfinite(other) else 0.0)


def replicates_needed(
    distance: float,
    spread: float,
    df_offset: int = 1,
    target: float = POWER,
    one_sided: bool = False,
) -> float:
    """The fewest replicates whose t test finds a true ``distance`` (from 0, or from the paper's
    effect) with probability ``target`` (80 %) at level 5 % two-sided, one replicate's standard
    deviation being ``spread`` (:func:`power`); ``inf`` at distance 0, NaN without a spread."""
    if not (math.isfinite(distance) and math.isfinite(spread)) or spread <= 0:
        return math.nan
    if distance == 0:
        return math.inf
    lo, hi = df_offset + 1, df_offset + 1
    while power(hi, distance, spread, df_offset, one_sided) < target:
        if hi >= MAX_REPLICATES:
            return math.inf
        lo, hi = hi, min(hi * 2, MAX_REPLICATES)
    while lo < hi:  # power grows with n: the first n reaching the target
        mid = (lo + hi) // 2
        if power(mid, distance, spread, df_offset, one_sided) >= target:
            hi = mid
        else:
            lo = mid + 1
    return float(hi)


def reachable(effect: float, sign: int, start: float, bounded_below: bool) -> bool:
    """Whether an absolute ``effect`` (the paper's change of a quantity, ``a - b``) can be
    reached from the study's own ``start`` (``b``'s mean): a fall larger than ``start`` cannot,
    when the quantity is never below 0 (a barrier, a loss)."""
    if not bounded_below or sign > 0 or not math.isfinite(start):
        return True
    return start + effect >= 0


# ------------------------------------------------------------------ adaptive (replicates: auto)


def stage_replicates(pilot: Sequence[float], budget: int) -> int:
    """The replicates a second stage adds to a ``pilot`` (the first stage's per-replicate
    values: differences, slopes) so that the whole claim has 80 % power at the pilot's mean and
    spread, capped by ``budget`` replicates in all; at least 2 (a stage needs a spread)."""
    first = mean_interval(pilot)
    if len(pilot) >= budget:
        return 0
    needed = replicates_needed(abs(first.estimate), first.spread)
    if not math.isfinite(needed):
        needed = budget
    return int(min(max(needed - len(pilot), 2), budget - len(pilot)))


def two_stage_verdict(
    pilot: Sequence[float], second: Sequence[float], sign: int, weight: float = math.sqrt(0.5)
) -> tuple[str, float]:
    """The verdict of an adaptive two-stage design whose second stage's size was chosen from the
    first (:func:`stage_replicates`): the inverse-normal combination of the two stages' own
    one-sided t tests (Lehmacher and Wassmer 1999), ``z = w Φ⁻¹(1 - p1) + sqrt(1 - w²) Φ⁻¹(1 -
    p2)`` with the weight ``w`` fixed in advance, compared with the two-sided 5 % bound on
    each side. Whatever the data made the second stage's size, each side's error stays at
    2.5 %: a naive t test over both stages together does not (the second stage is larger
    exactly when the first looked null). Returns the verdict (``reproduced`` on the side
    ``sign``, ``contradicted`` on the other) and the combined z on the side ``sign``."""
    bound = float(stats.norm.ppf(1 - (1 - CONFIDENCE) / 2))

    def z(values: Sequence[float]) -> float:
        x = np.asarray(values, dtype=float)
        if len(x) < 2 or float(x.std(ddof=1)) == 0:
            return 0.0  # a stage that cannot be tested counts as p = 1/2
        p = float(stats.ttest_1samp(x, 0.0, alternative="greater" if sign > 0 else "less").pvalue)
        return float(stats.norm.isf(p))

    combined = weight * z(pilot) + math.sqrt(1 - weight**2) * z(second)
    if combined > bound:
        return "reproduced", combined
    if combined < -bound:
        return "contradicted", combined
    return "inconclusive", combined
