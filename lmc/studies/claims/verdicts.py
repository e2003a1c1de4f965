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
    Cell,
    Claim,
    check_claim_metrics,
    parse_study_claims,
    same_value,
)
from lmc.studies.claims.kinds import CLAIM_TESTS
from lmc.studies.reporting.aggregate import cell_key

CONFIDENCE = inference.CONFIDENCE
VERDICTS = ("reproduced", "contradicted", "inconclusive")
#: ``replicates: auto``: the values of the replicate key the pilot ran (a replicate whose key is
#: among them is the first stage's), set while :func:`evaluate_claims` runs
PILOT: ContextVar[frozenset | None] = ContextVar("pilot", default=None)


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


def cell_rows(table: pd.DataFrame, cell: Cell) -> pd.DataFrame:
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


def cell_values(
    table: pd.DataFrame, cell: Cell, replicate: str | None, scale: str = "raw"
) -> Values:
    """The values of ``cell`` indexed by replicate (the row's job id without one)."""
    rows = cell_rows(table, cell)
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
        replicated = CLAIM_TESTS[claim.test].replicated
        replicate = claim.replicate.get(cell.stage) if replicated else None
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
    token = PILOT.set(None if pilot is None else frozenset(cell_key(v) for v in pilot))
    try:
        return [_evaluate(c, table) for c in claims]
    finally:
        PILOT.reset(token)


#: tests whose estimate is not a mean over replicates: no two-stage test; in a ``replicates:
#: auto`` study they are decided on the pilot alone (a design fixed before any data)
PILOT_ONLY = tuple(name for name, kind in CLAIM_TESTS.items() if kind.pilot_only)


def _evaluate(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    pilot = PILOT.get()
    kind = CLAIM_TESTS[claim.test]
    evaluate = kind.part("evaluate")
    if pilot is None or not kind.pilot_only:
        return evaluate(claim, table)
    keep = pd.Series(True, index=table.index)
    for stage, key in claim.replicate.items():
        if key in table:
            mine = table.stage == stage
            keep &= ~mine | table[key].map(lambda v: cell_key(v) in pilot)
    if keep.all():  # the second stage has not run yet
        return evaluate(claim, table)
    result = evaluate(claim, table[keep])
    result.design = (
        f"the pilot's replicates alone (replicates: auto): "
        f"{kind.called} takes no "
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
        if r.scale == "log" and CLAIM_TESTS[r.test].ratio_on_log and r.n:
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
