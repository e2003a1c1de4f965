"""A study's claims (:mod:`lmc.studies.claims.declared`) evaluated on its results: each claim's estimate
(a difference of two cells, a slope, a peak against the ends, a fit's slope) with its 95 %
Student-t interval over the replicates, and the verdict (reproduced, contradicted or
inconclusive, with the replicates that would resolve an inconclusive one)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lmc.studies.claims import inference
from lmc.studies.claims.declared import (
    TEMPLATE,
    Cell,
    Claim,
    check_claim_metrics,
    nonnegative,
    parse_study_claims,
    same_value,
)
from lmc.studies.reporting.aggregate import cell_key

CONFIDENCE = inference.CONFIDENCE
VERDICTS = ("reproduced", "contradicted", "inconclusive")
#: ``replicates: auto``: the values of the replicate key the pilot ran (a replicate whose key is
#: among them is the first stage's), set while :func:`evaluate_claims` runs
_PILOT: ContextVar[frozenset | None] = ContextVar("pilot", default=None)


@dataclass
class ClaimResult:
    """A claim's evaluation: the estimate (a difference, a slope) with its interval over
    ``n`` replicates, and the verdict."""

    name: str
    source: str
    claim: str
    paper: str
    test: str
    expect: str
    verdict: str
    estimate: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    n: int = 0
    effect: float | None = None
    n_needed: float | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``raw`` or ``log``: on ``log`` the estimate and interval are of ``log`` values (a
    #: difference's ``exp`` is the fold change ``a / b``)
    scale: str = "raw"
    #: how the replicates were analysed: independent, or the disjoint ones of a design whose
    #: replicates share endpoints
    design: str = "independent replicates"
    #: how the study's setting deviates from the paper's for this claim ("" when it is the
    #: paper's): such a claim is lmc's, not counted as a reproduction of the paper
    lmc_setting: str = ""
    #: the per-replicate values the estimate is the mean of (differences, slopes), where it is
    #: one; not part of the record (:meth:`as_dict`)
    values: Any = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("values")
        return out


# ------------------------------------------------------------------------------- statistics


def verdict(lo: float, hi: float, sign: int, effect: float | None) -> str:
    """The verdict of an interval (:func:`lmc.studies.claims.inference.verdict`)."""
    return inference.verdict(lo, hi, sign, effect)


def replicates_needed(
    estimate: float, spread: float, effect: float | None, df_offset: int = 1
) -> float:
    """The replicates that resolve a claim at 80 % power (two-sided 5 %): those that find the
    observed ``estimate``'s distance from 0, or from the paper's ``effect`` if that is farther
    (:func:`lmc.studies.claims.inference.replicates_needed`)."""
    if not math.isfinite(estimate):
        return math.nan
    distance = abs(estimate)
    if effect is not None:
        distance = max(distance, abs(estimate - effect))
    return inference.replicates_needed(distance, spread, df_offset)


@dataclass
class Values:
    """A cell's values by replicate, on the claim's scale, with the models (train job ids) each
    replicate's value was measured on, and how many values ``log`` left out (``<= 0``)."""

    series: pd.Series
    ends: dict[Any, frozenset[str]]
    left_out: int = 0


def _cell_rows(table: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    """The rows of ``table`` in ``cell``: its stage and metric, at every coordinate of
    ``where`` (none when a coordinate is not a column)."""
    rows = table[(table["stage"] == cell.stage) & (table["metric"] == cell.metric)]
    for key, value in cell.where.items():
        if key not in rows.columns:
            return rows.iloc[:0]
        want = cell_key(value)
        rows = rows.loc[np.array([cell_key(v) == want for v in rows[key]], dtype=bool)]
    return rows


def _ends(row: Mapping[str, Any]) -> frozenset[str]:
    """The models a row's value was measured on: its ``endpoints`` (space-separated train job
    ids, :func:`with_endpoints`), else its own job."""
    ends = row.get("endpoints")
    if isinstance(ends, str) and ends.strip():
        return frozenset(ends.split())
    return frozenset([str(row["job"])])


def _cell_values(
    table: pd.DataFrame, cell: Cell, replicate: str | None, scale: str = "raw"
) -> Values:
    """The values of ``cell`` indexed by replicate (the row's job id without one)."""
    rows = _cell_rows(table, cell)
    values = pd.to_numeric(rows["value"], errors="coerce").to_numpy(dtype=float)
    index = (
        [cell_key(v) for v in rows[replicate]]
        if replicate and replicate in rows.columns
        else list(rows["job"])
    )
    records = rows.to_dict("records")
    left_out = 0
    if scale == "log":
        positive = values > 0
        left_out = int((np.isfinite(values) & ~positive).sum())
        values = np.where(positive, np.log(np.where(positive, values, 1.0)), np.nan)
    keep = np.isfinite(values)
    series = pd.Series(values[keep], index=[i for i, k in zip(index, keep) if k], dtype=float)
    ends = {i: _ends(r) for i, r, k in zip(index, records, keep) if k}
    series = series[~series.index.duplicated(keep="first")]
    return Values(series, ends, left_out)


def independent(ends: Mapping[Any, frozenset[str]]) -> list[Any]:
    """The replicates kept for an analysis that assumes independent ones: in order, each whose
    models none kept before it shares (all of them when no two share a model; one per
    reference in a design that pairs one reference with every other seed)."""
    kept: list[Any] = []
    used: set[str] = set()
    for key, models in ends.items():
        if not models & used:
            kept.append(key)
            used |= models
    return kept


def shared_replicates(claim: Claim, plan: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(kept, all)``: how many of the claim's replicates in ``plan`` (``plan.json``'s jobs)
    have disjoint models, of all of them; ``kept < all`` when they share endpoints (a
    reference paired with every other seed), which ``lmc study plan`` warns about."""
    from lmc.studies.reporting.results import endpoints

    ends: dict[Any, frozenset[str]] = {}
    for cell in claim.cells:
        replicate = None if claim.test == "fit" else claim.replicate.get(cell.stage)
        for job in plan:
            coords = job["coordinates"]
            if job["stage"] != cell.stage or not all(
                k in coords and same_value(coords[k], v) for k, v in cell.where.items()
            ):
                continue
            key = cell_key(coords.get(replicate)) if replicate else job["id"]
            ends[key] = ends.get(key, frozenset()) | frozenset(endpoints(job).split())
    return len(independent(ends)), len(ends)


def sharing_warnings(claims: Sequence[Claim], plan: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per claim whose replicates share models (:func:`shared_replicates`)."""
    lines = []
    for claim in claims:
        kept, total = shared_replicates(claim, plan)
        if kept < total:
            lines.append(
                f"warning: claim {claim.name!r}: its {total} replicates share models (e.g. one "
                f"reference in every pair), so only {kept} of them are independent and its verdict "
                "rests on those; pairs with `reference: consecutive` (disjoint pairs 0-1, 2-3, "
                "...) or trials over disjoint seeds make every replicate count"
            )
    return lines


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
    pilot = _PILOT.get()
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
    bounded = claim.test == "difference" and (
        nonnegative(claim.cells[-1].metric) or bool(len(b.series) and (b.series >= 0).all())
    )
    if claim.test == "difference" and not inference.reachable(claim.effect, sign, start, bounded):
        return None, (
            f"; the paper's effect {claim.effect:.4g} is out of reach here (b's mean is "
            f"{start:.4g} and the quantity is never below 0): judged on the direction alone"
        )
    return claim.effect, ""


def _evaluate_difference(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect in ("greater", "descending") else -1
    a, b = (_cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells)
    effect, note = _paper_effect(claim, b)
    stat, how = _difference(a, b, sign, effect)
    what = "log a - log b" if claim.scale == "log" else "a - b"
    detail = (
        f"a = {claim.cells[0].label()}: {_mean_text(a, claim.scale)}; b = "
        f"{claim.cells[1].label()}: {_mean_text(b, claim.scale)}; {what} {how}{note}"
    )
    return _result(claim, stat, detail, effect=effect)


def _evaluate_equivalent(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    a, b = (_cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells)
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


def _evaluate_ordering(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect == "descending" else -1
    series = [
        _cell_values(table, c, claim.replicate.get(c.stage), claim.scale) for c in claim.cells
    ]
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
            columns[v] = _cell_values(
                table, Cell(cell.stage, metric, cell.where), replicate, claim.scale
            )
    else:
        if claim.x_values:
            axis = sorted(float(v) for v in claim.x_values)
        else:  # the x values the cell has results at
            xs = pd.to_numeric(_cell_rows(table, cell)[claim.x], errors="coerce").dropna()
            axis = sorted({float(v) for v in xs})
        for v in axis:
            columns[v] = _cell_values(
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


def _evaluate_trend(claim: Claim, table: pd.DataFrame) -> ClaimResult:
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


def _evaluate_fit(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    cell = claim.cells[0]
    ys = _cell_values(table, cell, None)
    xs = _cell_values(table, Cell(cell.stage, str(claim.x), cell.where), None)
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


_EVALUATE = {
    "difference": _evaluate_difference,
    "equivalent": _evaluate_equivalent,
    "ordering": _evaluate_ordering,
    "trend": _evaluate_trend,
    "fit": _evaluate_fit,
}


def evaluate_claims(
    claims: Sequence[Claim], table: pd.DataFrame, pilot: Sequence[Any] | None = None
) -> list[ClaimResult]:
    """Each claim evaluated on a study's tidy results (:func:`lmc.studies.reporting.results.results`);
    ``pilot``: in a ``replicates: auto`` study, the replicate values of its first stage (a
    claim over both stages is then decided by the two-stage test).

    Raises:
        StudyError: a claim reads a metric no done job of its stage reports (naming what the
            stage does report).
    """
    produced: dict[str, set[str]] = {}
    for stage, rows in table.groupby("stage"):
        produced[str(stage)] = set(rows["metric"])
    check_claim_metrics(claims, {s: produced.get(s) for c in claims for s in c.metrics})
    token = _PILOT.set(None if pilot is None else frozenset(cell_key(v) for v in pilot))
    try:
        return [_evaluate(c, table) for c in claims]
    finally:
        _PILOT.reset(token)


#: tests whose estimate is not a mean over replicates: no two-stage test; in a ``replicates:
#: auto`` study they are decided on the pilot alone (a design fixed before any data)
PILOT_ONLY = ("fit", "equivalent")


def _evaluate(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    pilot = _PILOT.get()
    if pilot is None or claim.test not in PILOT_ONLY:
        return _EVALUATE[claim.test](claim, table)
    keep = pd.Series(True, index=table.index)
    for stage, key in claim.replicate.items():
        if key in table:
            mine = table.stage == stage
            keep &= ~mine | table[key].map(lambda v: cell_key(v) in pilot)
    if keep.all():  # the second stage has not run yet
        return _EVALUATE[claim.test](claim, table)
    result = _EVALUATE[claim.test](claim, table[keep])
    result.design = (
        f"the pilot's replicates alone (replicates: auto): "
        f"{'an equivalence' if claim.test == 'equivalent' else 'a fit'} claim takes no "
        f"two-stage test, so the added replicates, sized on the pilot, do not decide it; "
        f"{result.design}"
    )
    return result


def format_claims(results: Sequence[ClaimResult]) -> str:
    """The claims' results as plain text, one block per claim."""
    lines = []
    for r in results:
        ci = f"[{r.ci_low:.4g}, {r.ci_high:.4g}]"
        needed = ""
        if r.n == 0:  # nothing to evaluate yet: not a statement about the spread
            needed = (
                "; no values yet: its jobs are pending, failed or damaged (`lmc study status`), "
                "`lmc study run` runs them"
            )
        elif r.verdict == "inconclusive" and r.n_needed is not None:
            needed = (
                f"; about {r.n_needed:.0f} independent replicates would resolve it at 80 % power"
            )
            if not math.isfinite(r.n_needed):
                needed = "; no number of replicates resolves it at this spread and mean"
        fold = ""
        if r.scale == "log" and r.test in ("difference", "equivalent") and r.n:
            fold = (
                f" (log scale: a / b = {math.exp(r.estimate):.4g} "
                f"[{math.exp(r.ci_low):.4g}, {math.exp(r.ci_high):.4g}])"
                if math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
                else " (log scale)"
            )
        elif r.scale == "log":
            fold = " (log scale)"
        lines.append(f"{r.name}: {r.verdict.upper()}  ({r.source})")
        lines.append(f"  paper: {r.claim}" + (f" ({r.paper})" if r.paper else ""))
        if r.lmc_setting:
            lines.append(f"  lmc's setting, not the paper's: {r.lmc_setting}")
        lines.append(
            f"  here: {r.test} {r.expect}, estimate {r.estimate:.4g} {ci} over n = {r.n}{fold}"
            + (f", paper effect {r.effect:.4g}" if r.effect is not None else "")
            + needed
        )
        if r.design != "independent replicates":
            lines.append(f"  {r.design}")
        lines.append(f"  {r.detail}")
    return "\n".join(lines)


def evaluate_study_claims(
    text: str,
    plan: Sequence[Mapping[str, Any]],
    tidy: pd.DataFrame,
    pilot: Sequence[Any] | None = None,
) -> list[ClaimResult]:
    """The claims of the study file ``text`` evaluated on its folder's ``plan`` (``plan.json``'s
    jobs) and tidy results (:func:`lmc.studies.reporting.results.results`); ``[]`` when it declares none.

    Raises:
        StudyError: a claim does not fit the study.
    """
    claims = parse_study_claims(text, plan)
    return evaluate_claims(claims, tidy, pilot) if claims else []


def study_claims(root: Any) -> list[ClaimResult]:
    """The claims of the study folder ``root`` (its copy of the study file), evaluated on its
    done jobs; ``[]`` when the study declares none.

    Raises:
        StudyError: ``root`` is no study folder, or a claim does not fit the study.
    """

    from lmc.studies.reporting.results import results
    from lmc.studies.running.replicates import pilot_replicates
    from lmc.studies.running.store import read_plan, read_study_copy, study_folder

    root = study_folder(root)
    plan = read_plan(root)["jobs"]
    return evaluate_study_claims(read_study_copy(root), plan, results(root), pilot_replicates(root))
