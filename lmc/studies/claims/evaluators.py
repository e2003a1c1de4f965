"""Each claim test's evaluation (the ``evaluate`` part of the kinds in
:data:`lmc.studies.claims.kinds.CLAIM_TESTS`): its estimate with the 95 % Student-t interval
over the replicates and the verdict, as a :class:`~lmc.studies.claims.verdicts.ClaimResult`
(a difference or equivalence of two cells, an ordering of several, a trend's slope or peak
against the ends, a fit's slope)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from lmc.studies.claims import inference
from lmc.studies.claims.declared import TEMPLATE, Cell, Claim, nonnegative, same_value
from lmc.studies.claims.kinds import CLAIM_TESTS
from lmc.studies.claims.verdicts import (
    CONFIDENCE,
    PILOT,
    ClaimResult,
    Values,
    cell_rows,
    cell_values,
    independent,
    replicates_needed,
    verdict,
)
from lmc.studies.reporting.aggregate import cell_key


def _design(n_all: int, n_kept: int) -> str:
    if n_kept == n_all:
        return "independent replicates"
    return (
        f"shared endpoints: {n_kept} of {n_all} replicates kept, those with disjoint models (the "
        "others share a model with a kept one, so their errors are not independent)"
    )


def _difference(
    a: Values, b: Values, sign: int, effect: float | None
) -> tuple[dict[str, Any], str]:
    """``a - b``: paired over shared replicates when both cells have the same ones, else
    Welch's interval of the difference of means; over replicates with disjoint models."""
    shared = [i for i in a.series.index if i in b.series.index]
    if shared and len(shared) == len(a.series) == len(b.series):
        ends = {i: a.ends[i] | b.ends[i] for i in shared}
        kept = independent(ends)
        d = a.series[kept].to_numpy() - b.series[kept].to_numpy()
        interval = inference.mean_interval(d)
        stat = _stat(interval, sign, effect, len(ends), len(kept))
        return _two_stage(stat, list(kept), d, sign), "paired"
    xa, xb, ends, kept = _unpaired(a, b)
    interval = inference.welch_interval(xa, xb)
    return _stat(interval, sign, effect, len(ends), len(kept)), "unpaired (Welch)"


def _two_stage(stat: dict[str, Any], keys: list[Any], values: Any, sign: int) -> dict[str, Any]:
    """``stat`` with the replicates' ``values`` (by replicate ``keys``) kept for
    :mod:`lmc.studies.running.replicates`, and, in a study whose second stage ran (``replicates:
    auto``), the verdict of the two-stage test (:func:`lmc.studies.claims.inference.two_stage_verdict`)
    in place of the interval's."""
    values = np.asarray(values, dtype=float)
    stat["values"] = values
    pilot = PILOT.get()
    if pilot is None:
        return stat
    first = np.array([cell_key(k) in pilot for k in keys], dtype=bool)
    if first.all():  # the second stage has not run yet: the pilot's own analysis
        return stat
    result, z = inference.two_stage_verdict(values[first], values[~first], sign)
    stat["verdict"] = result
    # still inconclusive with the budget spent: the replicates a design at the pooled mean and
    # spread would need (a study file sizing a new run reads it)
    pooled = inference.mean_interval(values)
    stat["n_needed"] = (
        replicates_needed(pooled.estimate, pooled.spread, None)
        if result == "inconclusive"
        else None
    )
    stat["design"] = (
        f"two stages (replicates: auto): {int(first.sum())} pilot and {int((~first).sum())} "
        f"added replicates, decided by the inverse-normal combination of their one-sided t "
        f"tests (z = {z:.3g} against ±1.96); the interval shown pools both stages"
    )
    return stat


def _unpaired(a: Values, b: Values) -> tuple[np.ndarray, np.ndarray, dict, list]:
    """Two cells without shared replicates: the values of each whose models no value kept
    before it shares, with every value's models and the kept ones."""
    ends = {("a", i): a.ends[i] for i in a.series.index}
    ends |= {("b", i): b.ends[i] for i in b.series.index}
    kept = independent(ends)
    xa = a.series[[i for s, i in kept if s == "a"]].to_numpy()
    xb = b.series[[i for s, i in kept if s == "b"]].to_numpy()
    return xa, xb, ends, kept


def _stat(
    interval: inference.Interval, sign: int, effect: float | None, n_all: int, n_kept: int
) -> dict[str, Any]:
    result = verdict(interval.lo, interval.hi, sign, effect)
    return {
        "estimate": interval.estimate,
        "ci_low": interval.lo,
        "ci_high": interval.hi,
        "n": interval.n,
        "verdict": result,
        "n_needed": replicates_needed(interval.estimate, interval.spread, effect)
        if result == "inconclusive"
        else None,
        "design": _design(n_all, n_kept),
    }


def _all_of(parts: list[dict[str, Any]], sign: int) -> dict[str, Any]:
    """Several differences that must all hold: ``contradicted`` if one is, ``reproduced`` if
    all are, else ``inconclusive``; the estimate and interval of the weakest (the lowest bound
    on the expected side), the most replicates any inconclusive one needs."""
    verdicts = [p["verdict"] for p in parts]
    if "contradicted" in verdicts:
        overall = "contradicted"
    elif all(v == "reproduced" for v in verdicts):
        overall = "reproduced"
    else:
        overall = "inconclusive"
    weakest = min(
        parts, key=lambda p: sign * p["ci_low"] if math.isfinite(p["ci_low"]) else -math.inf
    )
    needed = [p["n_needed"] for p in parts if p["verdict"] == "inconclusive"]
    designs = [p["design"] for p in parts if p.get("design") != "independent replicates"]
    return {
        **weakest,
        "verdict": overall,
        "n_needed": max(needed) if needed else None,
        "design": designs[0] if designs else "independent replicates",
    }


def _mean_text(values: Values, scale: str = "raw") -> str:
    series = values.series
    if not len(series):
        return "no values"
    mean = f"{series.mean():.4g}"
    if scale == "log":  # the geometric mean
        mean = f"{math.exp(series.mean()):.4g} (geometric)"
    out = f"{mean} (n={len(series)})"
    if values.left_out:
        out += f"; {values.left_out} values <= 0 left out"
    return out


def _paper_effect(claim: Claim, b: Values) -> tuple[float | None, str]:
    """The paper's effect in the units of the claim's estimate, or ``None`` where it has none
    or it is out of reach (with the reason)."""
    sign = 1 if claim.expect in ("greater", "descending", "increasing", "peaked") else -1
    if claim.effect_relative is not None:
        if claim.scale == "log":
            return math.log1p(claim.effect_relative), ""
        start = float(b.series.mean()) if len(b.series) else math.nan
        return claim.effect_relative * start, ""
    if claim.effect is None:
        return None, ""
    start = float(b.series.mean()) if len(b.series) else math.nan
    kind = CLAIM_TESTS[claim.test]
    bounded = kind.bounded_effect and (
        nonnegative(claim.cells[-1].metric) or bool(len(b.series) and (b.series >= 0).all())
    )
    if kind.bounded_effect and not inference.reachable(claim.effect, sign, start, bounded):
        return None, (
            f"; the paper's effect {claim.effect:.4g} is out of reach here (b's mean is "
            f"{start:.4g} and the quantity is never below 0): judged on the direction alone"
        )
    return claim.effect, ""


@CLAIM_TESTS["difference"].register("evaluate")
def evaluate_difference(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect in ("greater", "descending") else -1
    a, b = (cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells)
    effect, note = _paper_effect(claim, b)
    stat, how = _difference(a, b, sign, effect)
    what = "log a - log b" if claim.scale == "log" else "a - b"
    detail = (
        f"a = {claim.cells[0].label()}: {_mean_text(a, claim.scale)}; b = "
        f"{claim.cells[1].label()}: {_mean_text(b, claim.scale)}; {what} {how}{note}"
    )
    return _result(claim, stat, detail, effect=effect)


@CLAIM_TESTS["equivalent"].register("evaluate")
def evaluate_equivalent(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    a, b = (cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells)
    if claim.margin_relative is not None:
        margin = (
            math.log1p(claim.margin_relative)
            if claim.scale == "log"
            else claim.margin_relative * abs(float(b.series.mean()))
            if len(b.series)
            else math.nan
        )
    else:
        assert claim.margin is not None  # parse_claims: an equivalent claim has one of the two
        margin = float(claim.margin)
    stat, how = _difference(a, b, 1, None)
    # the same replicates' 90 % interval: two one-sided tests at 5 % each
    shared = [i for i in a.series.index if i in b.series.index]
    if how == "paired":
        kept = independent({i: a.ends[i] | b.ends[i] for i in shared})
        inner = inference.mean_interval(
            a.series[kept].to_numpy() - b.series[kept].to_numpy(), 1 - 2 * (1 - CONFIDENCE)
        )
    else:  # the values _difference kept: those with disjoint models
        xa, xb, _, _ = _unpaired(a, b)
        inner = inference.welch_interval(xa, xb, 1 - 2 * (1 - CONFIDENCE))
    outer = inference.Interval(stat["estimate"], stat["ci_low"], stat["ci_high"], stat["n"])
    stat["verdict"] = (
        inference.equivalence_verdict(outer, inner, margin)
        if math.isfinite(margin)
        else "inconclusive"
    )
    est = abs(stat["estimate"])
    spread = inner.spread
    stat["n_needed"] = (
        None
        if stat["verdict"] != "inconclusive"
        else inference.replicates_needed(margin - est, spread, one_sided=True)
        if est < margin
        else inference.replicates_needed(est - margin, spread)
    )
    what = "log a - log b" if claim.scale == "log" else "a - b"
    detail = (
        f"a = {claim.cells[0].label()}: {_mean_text(a, claim.scale)}; b = "
        f"{claim.cells[1].label()}: {_mean_text(b, claim.scale)}; {what} {how}, margin "
        f"±{margin:.4g}, 90 % interval [{inner.lo:.4g}, {inner.hi:.4g}] (two one-sided tests)"
    )
    return _result(claim, stat, detail, {"margin": margin})


@CLAIM_TESTS["ordering"].register("evaluate")
def evaluate_ordering(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect == "descending" else -1
    series = [cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells]
    pairs = [_difference(series[i], series[i + 1], sign, None)[0] for i in range(len(series) - 1)]
    stat = _all_of(pairs, sign)
    detail = "; ".join(
        f"{c.label()}: {_mean_text(s, claim.scale)}" for c, s in zip(claim.cells, series)
    )
    return _result(claim, stat, detail)


def _trend_matrix(
    claim: Claim, table: pd.DataFrame
) -> tuple[list[Any], pd.DataFrame, dict[Any, frozenset[str]], int]:
    """Rows: replicates; columns: x values; the metric per cell (on the claim's scale); the
    models each replicate's row was measured on; the values ``log`` left out."""
    cell = claim.cells[0]
    assert claim.x is not None  # a trend claim has x
    replicate = claim.replicate.get(cell.stage)
    columns: dict[Any, Values] = {}
    if TEMPLATE in cell.metric:
        axis = list(claim.x_values)
        for v in axis:
            metric = cell.metric.replace(TEMPLATE, str(v))
            columns[v] = cell_values(
                table, Cell(cell.stage, metric, cell.where), replicate, claim.scale
            )
    else:
        if claim.x_values:
            axis = sorted(float(v) for v in claim.x_values)
        else:  # the x values the cell has results at
            xs = pd.to_numeric(cell_rows(table, cell)[claim.x], errors="coerce").dropna()
            axis = sorted({float(v) for v in xs})
        for v in axis:
            columns[v] = cell_values(
                table,
                Cell(cell.stage, cell.metric, {**cell.where, claim.x: v}),
                replicate,
                claim.scale,
            )
    frame = pd.DataFrame({v: c.series for v, c in columns.items()})
    ends: dict[Any, frozenset[str]] = {}
    for c in columns.values():
        for i, models in c.ends.items():
            ends[i] = ends.get(i, frozenset()) | models
    return axis, frame, ends, sum(c.left_out for c in columns.values())


@CLAIM_TESTS["trend"].register("evaluate")
def evaluate_trend(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    axis, frame, ends, left_out = _trend_matrix(claim, table)
    means = frame.mean(axis=0)
    shown = means.map(math.exp) if claim.scale == "log" else means
    text = ", ".join(f"{x}: {m:.4g}" for x, m in shown.items())
    if claim.scale == "log":
        text = f"geometric means {text}"
    else:
        text = f"means {text}"
    if left_out:
        text += f"; {left_out} values <= 0 left out"
    complete = frame.dropna()
    kept = independent({i: ends[i] for i in complete.index})
    of = "log y" if claim.scale == "log" else "y"
    if claim.expect in ("increasing", "decreasing"):
        sign = 1 if claim.expect == "increasing" else -1
        xs = np.asarray([float(x) for x in axis])
        if claim.xscale == "log":
            xs = np.log(xs)
        slopes = [float(np.polyfit(xs, complete.loc[i].to_numpy(dtype=float), 1)[0]) for i in kept]
        interval = inference.mean_interval(slopes)
        stat = _stat(interval, sign, claim.effect, len(complete), len(kept))
        stat = _two_stage(stat, list(kept), slopes, sign)
        over = f"log x, x = {claim.x}" if claim.xscale == "log" else f"x = {claim.x}"
        return _result(claim, stat, f"slope of {of} per replicate over {over}; {text}")
    sign = 1 if claim.expect == "peaked" else -1
    interior = list(axis[1:-1])
    if len(axis) < 3 or not len(frame) or means.reindex(axis).isna().any():
        stat = {"n": 0, "verdict": "inconclusive", "n_needed": math.nan}
        return _result(claim, stat, f"not every x has results yet; {text}")
    if claim.peak is not None:
        top = next(x for x in interior if same_value(x, claim.peak))
        chosen = "the paper's"
    else:
        inner = means[interior]
        top = inner.idxmax() if sign > 0 else inner.idxmin()
        chosen = "the interior mean's " + ("largest" if sign > 0 else "smallest")
    ends_x = (axis[0], axis[-1])

    def column(x: Any) -> Values:
        series = frame[x].dropna()
        return Values(series, {i: ends[i] for i in series.index})

    parts = [_difference(column(top), column(e), sign, None)[0] for e in ends_x]
    stat = _all_of(parts, sign)
    detail = (
        f"peak x = {top} ({chosen}) against x = {ends_x[0]} and {ends_x[1]} ({of}), the weaker "
        f"difference shown; {text}"
    )
    return _result(claim, stat, detail, {"peak_x": top})


@CLAIM_TESTS["fit"].register("evaluate")
def evaluate_fit(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    cell = claim.cells[0]
    ys = cell_values(table, cell, None)
    xs = cell_values(table, Cell(cell.stage, str(claim.x), cell.where), None)
    shared = [j for j in ys.series.index if j in xs.series.index]
    kept = independent({j: ys.ends[j] | xs.ends[j] for j in shared})
    x = xs.series[kept].to_numpy(dtype=float)
    y = ys.series[kept].to_numpy(dtype=float)
    left_out = 0
    if claim.model == "exp":
        keep = y > 0
        left_out = int((~keep).sum())
        x, y = x[keep], np.log(y[keep])
    n = len(x)
    sign = 1 if claim.expect == "increasing" else -1
    design = _design(len(shared), len(kept))
    extra: dict[str, Any] = {"left_out": left_out, "jobs": len(shared)}
    if n < 3 or np.ptp(x) == 0:
        stat = {"estimate": math.nan, "n": n, "verdict": "inconclusive", "n_needed": math.nan}
        return _result(
            claim, {**stat, "design": design}, f"{n} usable jobs: too few for a fit", extra
        )
    interval, intercept, r2 = inference.slope_interval(x, y)
    stat = _stat(interval, sign, claim.effect, len(shared), len(kept))
    if claim.min_r2 is not None and stat["verdict"] == "reproduced" and r2 < claim.min_r2:
        stat["verdict"] = "inconclusive"
    stat["n_needed"] = replicates_needed(interval.estimate, interval.spread, claim.effect, 2)
    extra.update({"intercept": intercept, "r2": r2})
    form = "log y = a x + b" if claim.model == "exp" else "y = a x + b"
    detail = (
        f"{form} over {n} jobs ({left_out} with y <= 0 left out): a = {interval.estimate:.4g}, "
        f"b = {intercept:.4g}, R^2 = {r2:.3f}"
    )
    return _result(claim, stat, detail, extra)


def _result(
    claim: Claim,
    stat: Mapping[str, Any],
    detail: str,
    extra: dict[str, Any] | None = None,
    effect: Any = "claim",
) -> ClaimResult:
    """The claim's result; ``effect`` the paper's effect in the estimate's units as used (``None``
    where it is out of reach), by default the claim's."""
    needed = stat.get("n_needed")
    if stat["verdict"] != "inconclusive":
        needed = None
    return ClaimResult(
        name=claim.name,
        source=claim.source,
        claim=claim.claim,
        paper=claim.paper,
        test=claim.test,
        expect=claim.expect,
        verdict=stat["verdict"],
        estimate=float(stat.get("estimate", math.nan)),
        ci_low=float(stat.get("ci_low", math.nan)),
        ci_high=float(stat.get("ci_high", math.nan)),
        n=int(stat.get("n", 0)),
        effect=claim.effect if effect == "claim" else effect,
        n_needed=needed,
        detail=detail,
        extra=extra or {},
        scale=claim.scale,
        design=str(stat.get("design", "independent replicates")),
        lmc_setting=claim.lmc_setting,
        values=stat.get("values"),
    )
