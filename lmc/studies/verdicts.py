"""A study's claims (:mod:`lmc.studies.claims`) evaluated on its results: each claim's estimate
(a difference of two cells, a slope, a peak against the ends, a fit's slope) with its 95 %
Student-t interval over the replicates, and the verdict (reproduced, contradicted or
inconclusive, with the replicates that would resolve an inconclusive one)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from lmc.studies.aggregate import cell_key
from lmc.studies.claims import (
    TEMPLATE,
    Cell,
    Claim,
    check_claim_metrics,
    parse_claims,
    plan_ties,
    plan_values,
    same_value,
)

CONFIDENCE = 0.95
VERDICTS = ("reproduced", "contradicted", "inconclusive")
MAX_REPLICATES = 100_000


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------- statistics


def _t(n_df: int) -> float:
    return float(stats.t.ppf((1 + CONFIDENCE) / 2, n_df))


def verdict(lo: float, hi: float, sign: int, effect: float | None) -> str:
    """The verdict of an interval ``[lo, hi]`` for an effect expected on the side ``sign``
    (+1: positive) of 0, with the paper's ``effect`` (or ``None``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if sign * lo > 0 and sign * hi > 0:
        return "reproduced"
    if sign * lo < 0 and sign * hi < 0:
        return "contradicted"
    if effect is not None and not lo <= effect <= hi:
        return "contradicted"
    return "inconclusive"


def replicates_needed(
    estimate: float, spread: float, effect: float | None, df_offset: int = 1
) -> float:
    """The smallest number of replicates ``n`` whose interval ``± t_{n-df_offset} spread /
    sqrt(n)`` at the observed ``estimate`` excludes 0, or the paper's ``effect`` if that is
    farther (``inf`` when neither can be excluded, NaN without a spread)."""
    if not (math.isfinite(estimate) and math.isfinite(spread)) or spread <= 0:
        return math.nan
    distance = abs(estimate)
    if effect is not None:
        distance = max(distance, abs(estimate - effect))
    if distance == 0:
        return math.inf
    for n in range(df_offset + 1, MAX_REPLICATES):
        if _t(n - df_offset) * spread / math.sqrt(n) < distance:
            return float(n)
    return math.inf


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


def _cell_values(table: pd.DataFrame, cell: Cell, replicate: str | None) -> pd.Series:
    """The values of ``cell`` indexed by replicate (the row's job id without one)."""
    rows = _cell_rows(table, cell)
    values = pd.to_numeric(rows["value"], errors="coerce").to_numpy(dtype=float)
    index = (
        [cell_key(v) for v in rows[replicate]]
        if replicate and replicate in rows.columns
        else list(rows["job"])
    )
    series = pd.Series(values, index=index, dtype=float)
    series = series[np.isfinite(series.to_numpy())]
    return series[~series.index.duplicated(keep="first")]


def _difference(
    a: pd.Series, b: pd.Series, sign: int, effect: float | None
) -> tuple[dict[str, Any], str]:
    """``a - b``: paired over shared replicates when both cells have the same ones, else
    Welch's interval of the difference of means."""
    shared = [i for i in a.index if i in b.index]
    if shared and len(shared) == len(a) == len(b):
        d = a[shared].to_numpy() - b[shared].to_numpy()
        n = len(d)
        mean = float(d.mean())
        sd = float(d.std(ddof=1)) if n >= 2 else math.nan
        half = _t(n - 1) * sd / math.sqrt(n) if n >= 2 else math.nan
        spread, how = sd, "paired"
    else:
        na, nb = len(a), len(b)
        n = min(na, nb)
        mean = float(a.mean() - b.mean()) if na and nb else math.nan
        if na >= 2 and nb >= 2:
            va, vb = float(a.var(ddof=1)) / na, float(b.var(ddof=1)) / nb
            se = math.sqrt(va + vb)
            den = (va**2 / (na - 1) + vb**2 / (nb - 1)) if va + vb > 0 else 0.0
            df = (va + vb) ** 2 / den if den > 0 else na + nb - 2
            half = float(stats.t.ppf((1 + CONFIDENCE) / 2, df)) * se
            spread = math.sqrt(float(a.var(ddof=1)) + float(b.var(ddof=1)))
        else:
            half = spread = math.nan
        how = "unpaired (Welch)"
    lo, hi = mean - half, mean + half
    return (
        {
            "estimate": mean,
            "ci_low": lo,
            "ci_high": hi,
            "n": n,
            "verdict": verdict(lo, hi, sign, effect),
            "n_needed": replicates_needed(mean, spread, effect),
        },
        how,
    )


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
    return {**weakest, "verdict": overall, "n_needed": max(needed) if needed else None}


def _mean_text(series: pd.Series) -> str:
    return f"{series.mean():.4g} (n={len(series)})" if len(series) else "no values"


def _evaluate_difference(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect in ("greater", "descending") else -1
    a, b = (_cell_values(table, c, claim.replicate.get(c.stage)) for c in claim.cells)
    stat, how = _difference(a, b, sign, claim.effect)
    detail = (
        f"a = {claim.cells[0].label()}: {_mean_text(a)}; b = {claim.cells[1].label()}: "
        f"{_mean_text(b)}; a - b {how}"
    )
    return _result(claim, stat, detail)


def _evaluate_ordering(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    sign = 1 if claim.expect == "descending" else -1
    series = [_cell_values(table, c, claim.replicate.get(c.stage)) for c in claim.cells]
    pairs = [_difference(series[i], series[i + 1], sign, None)[0] for i in range(len(series) - 1)]
    stat = _all_of(pairs, sign)
    detail = "; ".join(f"{c.label()}: {_mean_text(s)}" for c, s in zip(claim.cells, series))
    return _result(claim, stat, detail)


def _trend_matrix(claim: Claim, table: pd.DataFrame) -> tuple[list[Any], pd.DataFrame]:
    """Rows: replicates; columns: x values; the metric per cell."""
    cell = claim.cells[0]
    replicate = claim.replicate.get(cell.stage)
    columns = {}
    if TEMPLATE in cell.metric:
        axis = list(claim.x_values)
        for v in axis:
            metric = cell.metric.replace(TEMPLATE, str(v))
            columns[v] = _cell_values(table, Cell(cell.stage, metric, cell.where), replicate)
    else:
        if claim.x_values:
            axis = sorted(float(v) for v in claim.x_values)
        else:  # the x values the cell has results at
            xs = pd.to_numeric(_cell_rows(table, cell)[claim.x], errors="coerce").dropna()
            axis = sorted({float(v) for v in xs})
        for v in axis:
            columns[v] = _cell_values(
                table, Cell(cell.stage, cell.metric, {**cell.where, claim.x: v}), replicate
            )
    frame = pd.DataFrame(columns)
    return axis, frame


def _evaluate_trend(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    axis, frame = _trend_matrix(claim, table)
    means = frame.mean(axis=0)
    text = ", ".join(f"{x}: {m:.4g}" for x, m in means.items())
    complete = frame.dropna()
    if claim.expect in ("increasing", "decreasing"):
        sign = 1 if claim.expect == "increasing" else -1
        xs = np.asarray([float(x) for x in axis])
        slopes = [
            float(np.polyfit(xs, row.to_numpy(dtype=float), 1)[0]) for _, row in complete.iterrows()
        ]
        n = len(slopes)
        mean = float(np.mean(slopes)) if n else math.nan
        sd = float(np.std(slopes, ddof=1)) if n >= 2 else math.nan
        half = _t(n - 1) * sd / math.sqrt(n) if n >= 2 else math.nan
        lo, hi = mean - half, mean + half
        stat = {
            "estimate": mean,
            "ci_low": lo,
            "ci_high": hi,
            "n": n,
            "verdict": verdict(lo, hi, sign, claim.effect),
            "n_needed": replicates_needed(mean, sd, claim.effect),
        }
        return _result(claim, stat, f"slope per replicate over x = {claim.x}; means {text}")
    sign = 1 if claim.expect == "peaked" else -1
    interior = list(axis[1:-1])
    if len(axis) < 3 or not len(frame) or means.reindex(axis).isna().any():
        stat = {"n": 0, "verdict": "inconclusive", "n_needed": math.nan}
        return _result(claim, stat, f"not every x has results yet; means {text}")
    if claim.peak is not None:
        top = next(x for x in interior if same_value(x, claim.peak))
        chosen = "the paper's"
    else:
        inner = means[interior]
        top = inner.idxmax() if sign > 0 else inner.idxmin()
        chosen = "the interior mean's " + ("largest" if sign > 0 else "smallest")
    ends = (axis[0], axis[-1])
    parts = [_difference(frame[top].dropna(), frame[e].dropna(), sign, None)[0] for e in ends]
    stat = _all_of(parts, sign)
    detail = (
        f"peak x = {top} ({chosen}) against x = {ends[0]} and {ends[1]}, the weaker "
        f"difference shown; means {text}"
    )
    return _result(claim, stat, detail, {"peak_x": top})


def _evaluate_fit(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    cell = claim.cells[0]
    ys = _cell_values(table, cell, None)
    xs = _cell_values(table, Cell(cell.stage, str(claim.x), cell.where), None)
    shared = [j for j in ys.index if j in xs.index]
    x = xs[shared].to_numpy(dtype=float)
    y = ys[shared].to_numpy(dtype=float)
    left_out = 0
    if claim.model == "exp":
        keep = y > 0
        left_out = int((~keep).sum())
        x, y = x[keep], np.log(y[keep])
    n = len(x)
    sign = 1 if claim.expect == "increasing" else -1
    extra: dict[str, Any] = {"left_out": left_out, "jobs": len(shared)}
    if n < 3 or np.ptp(x) == 0:
        stat = {"estimate": math.nan, "n": n, "verdict": "inconclusive", "n_needed": math.nan}
        return _result(claim, stat, f"{n} usable jobs: too few for a fit", extra)
    fit = stats.linregress(x, y)
    half = _t(n - 2) * float(fit.stderr)
    lo, hi = float(fit.slope) - half, float(fit.slope) + half
    r2 = float(fit.rvalue) ** 2
    result = verdict(lo, hi, sign, claim.effect)
    if claim.min_r2 is not None and result == "reproduced" and r2 < claim.min_r2:
        result = "inconclusive"
    spread = float(fit.stderr) * math.sqrt(n)
    stat = {
        "estimate": float(fit.slope),
        "ci_low": lo,
        "ci_high": hi,
        "n": n,
        "verdict": result,
        "n_needed": replicates_needed(float(fit.slope), spread, claim.effect, df_offset=2),
    }
    extra.update({"intercept": float(fit.intercept), "r2": r2})
    form = "log y = a x + b" if claim.model == "exp" else "y = a x + b"
    detail = (
        f"{form} over {n} jobs ({left_out} with y <= 0 left out): a = {fit.slope:.4g}, "
        f"b = {fit.intercept:.4g}, R^2 = {r2:.3f}"
    )
    return _result(claim, stat, detail, extra)


def _result(
    claim: Claim, stat: Mapping[str, Any], detail: str, extra: dict[str, Any] | None = None
) -> ClaimResult:
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
        effect=claim.effect,
        n_needed=needed,
        detail=detail,
        extra=extra or {},
    )


_EVALUATE = {
    "difference": _evaluate_difference,
    "ordering": _evaluate_ordering,
    "trend": _evaluate_trend,
    "fit": _evaluate_fit,
}


def evaluate_claims(claims: Sequence[Claim], table: pd.DataFrame) -> list[ClaimResult]:
    """Each claim evaluated on a study's tidy results (:func:`lmc.studies.results.results`).

    Raises:
        StudyError: a claim reads a metric no done job of its stage reports (naming what the
            stage does report).
    """
    produced: dict[str, set[str]] = {}
    for stage, rows in table.groupby("stage"):
        produced[str(stage)] = set(rows["metric"])
    check_claim_metrics(claims, {s: produced.get(s) for c in claims for s in c.metrics})
    return [_EVALUATE[c.test](c, table) for c in claims]


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
            needed = f"; about {r.n_needed:.0f} replicates would resolve it"
            if not math.isfinite(r.n_needed):
                needed = "; no number of replicates resolves it at this spread and mean"
        lines.append(f"{r.name}: {r.verdict.upper()}  ({r.source})")
        lines.append(f"  paper: {r.claim}" + (f" ({r.paper})" if r.paper else ""))
        lines.append(
            f"  here: {r.test} {r.expect}, estimate {r.estimate:.4g} {ci} over n = {r.n}"
            + (f", paper effect {r.effect:.4g}" if r.effect is not None else "")
            + needed
        )
        lines.append(f"  {r.detail}")
    return "\n".join(lines)


def evaluate_study_claims(
    text: str, plan: Sequence[Mapping[str, Any]], tidy: pd.DataFrame
) -> list[ClaimResult]:
    """The claims of the study file ``text`` evaluated on its folder's ``plan`` (``plan.json``'s
    jobs) and tidy results (:func:`lmc.studies.results.results`); ``[]`` when it declares none.

    Raises:
        StudyError: a claim does not fit the study.
    """
    import yaml

    data = yaml.safe_load(text) or {}
    if not data.get("claims"):
        return []
    claims = parse_claims(data["claims"], data, plan_values(plan), plan_ties(plan))
    return evaluate_claims(claims, tidy)


def study_claims(root: Any) -> list[ClaimResult]:
    """The claims of the study folder ``root`` (its copy of the study file), evaluated on its
    done jobs; ``[]`` when the study declares none.

    Raises:
        StudyError: ``root`` is no study folder, or a claim does not fit the study.
    """

    from lmc.studies.results import results
    from lmc.studies.store import read_plan, read_study_copy, study_folder

    root = study_folder(root)
    plan = read_plan(root)["jobs"]
    return evaluate_study_claims(read_study_copy(root), plan, results(root))
