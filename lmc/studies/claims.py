"""A paper's claims, declared in the study file and evaluated on the study's results.

Each claim is the paper's statement as a comparison or a trend over the study's metrics, with
where it comes from and, where the paper gives one in the study's own units, the paper's effect.
The report evaluates every claim over the replicates (seeds, pairs, trials) with a 95 %
Student-t interval and gives a verdict:

* ``reproduced``: the interval excludes 0 on the side the paper states;
* ``contradicted``: the interval excludes 0 on the other side, or contains 0 but excludes the
  paper's ``effect`` (the effect, if any, is smaller than the paper's);
* ``inconclusive``: the interval contains 0 and the paper's effect (or no effect is given), or
  there are too few replicates for an interval; ``n_needed`` is then the number of replicates
  that would resolve it at the observed mean and spread (the interval's half-width below the
  distance from the mean to 0, or to the paper's effect if that is farther).

Tests (``test:``), each over cells of one stage, a cell being a value of every coordinate key
of the stage but the replicate axis (``replicate``, default the stage's, see
:func:`lmc.studies.aggregate.seed_keys`):

``difference``
    ``a - b`` of two cells (``a`` and ``b`` each a ``where`` mapping, and optionally their own
    ``stage`` / ``metric``), paired over the replicates both cells have (else Welch's interval
    of the difference of means); ``expect: greater`` or ``less`` (than ``b``).
``ordering``
    ``cells: [c1, c2, ...]`` expected in descending (``expect: descending``) or ascending
    order: each consecutive pair as a ``difference``; the verdict is ``contradicted`` if a pair
    is, ``reproduced`` if every pair is, else ``inconclusive`` (estimate and interval: the
    weakest pair's).
``trend``
    the metric against a numeric coordinate ``x`` (over the values of ``x`` its cells run, or
    the part ``x_values`` of them), or against ``x_values`` substituted into a metric template
    such as ``stemm/n{x}/test/acc``: ``expect: increasing`` / ``decreasing``
    (the least-squares slope per replicate, interval over the replicates), ``peaked`` /
    ``valley`` (the interior point with the largest (smallest) mean, or the paper's ``peak``,
    against each end, paired over replicates: both differences must be on the stated side).
    Choosing the interior point by its mean favours a peak; give ``peak`` where the paper
    predicts where it is.
``fit``
    ``y = e^{a x + b}`` (``model: exp``) or ``y = a x + b`` (``model: linear``) over the jobs
    of a stage, ``x`` and ``y`` two metrics of each job (``log y`` of the positive values; the
    others are counted and left out); ``expect: increasing`` / ``decreasing`` is about ``a``,
    whose interval is the regression's; ``min_r2`` optionally also requires R² of at least it.

Example::

    claims:
      - name: pruning_lowers_barrier
        claim: prune + fine-tune lowers the weight-matched test loss barrier
        source: 000 Table 1
        paper: MLP CIFAR-10 0.1048 -> 0.0732
        test: difference
        stage: barrier
        metric: barrier_loss_matched
        a: {where: {strategy: finetune_once, rate: 0.2}}
        b: {where: {strategy: finetune_once, rate: 0.0}}
        expect: less
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from lmc.studies.schema import Study, StudyError

CONFIDENCE = 0.95
TESTS = ("difference", "ordering", "trend", "fit")
EXPECT = {
    "difference": ("greater", "less"),
    "ordering": ("descending", "ascending"),
    "trend": ("increasing", "decreasing", "peaked", "valley"),
    "fit": ("increasing", "decreasing"),
}
VERDICTS = ("reproduced", "contradicted", "inconclusive")
FIT_MODELS = ("exp", "linear")
MAX_REPLICATES = 100_000
_TEMPLATE = "{x}"
_CLAIM_KEYS = (
    "name",
    "claim",
    "source",
    "paper",
    "effect",
    "test",
    "stage",
    "metric",
    "where",
    "replicate",
    "a",
    "b",
    "cells",
    "expect",
    "x",
    "x_values",
    "peak",
    "y",
    "model",
    "min_r2",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Cell:
    """One cell of a stage: ``metric`` at the coordinates ``where`` (all but the replicates)."""

    stage: str
    metric: str
    where: dict[str, Any]

    def label(self) -> str:
        where = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.where.items())
        return f"{self.stage}:{self.metric}" + (f" [{where}]" if where else "")


@dataclass(frozen=True)
class Claim:
    """A paper's claim as a test over the study's results (see the module docstring)."""

    name: str
    claim: str
    source: str
    test: str
    expect: str
    cells: tuple[Cell, ...]
    replicate: dict[str, str]  # stage -> its replicate key
    paper: str = ""
    effect: float | None = None
    x: str | None = None
    x_values: tuple[Any, ...] = ()
    peak: Any = None
    y: str | None = None
    model: str = "exp"
    min_r2: float | None = None

    @property
    def metrics(self) -> dict[str, set[str]]:
        """The metrics the claim reads, by stage."""
        out: dict[str, set[str]] = {}
        for cell in self.cells:
            names = {cell.metric}
            if self.test == "trend" and _TEMPLATE in cell.metric:
                names = {cell.metric.replace(_TEMPLATE, str(v)) for v in self.x_values}
            if self.test == "fit":
                names = {cell.metric, str(self.x)}
            out.setdefault(cell.stage, set()).update(names)
        return out


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


# ---------------------------------------------------------------------------------- parsing


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StudyError(f"{where} must be a mapping, got {value!r}")
    return value


def stage_values(study: Study) -> dict[str, dict[str, list[Any]]]:
    """Every stage's coordinate keys with the values its jobs take (from its plan)."""
    return plan_values(_jobs(study))


def _jobs(study: Study) -> list[dict[str, Any]]:
    from lmc.studies.plan import plan

    return [job.to_json() for job in plan(study)]


def plan_ties(plan: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """Per stage, the keys each coordinate key determines: ``b`` is tied to ``a`` when every
    job of the stage with one value of ``a`` has one value of ``b`` (a zipped learning rate is
    tied to the width it goes with)."""
    from lmc.studies.aggregate import cell_key

    by_stage: dict[str, list[Mapping[str, Any]]] = {}
    for job in plan:
        by_stage.setdefault(job["stage"], []).append(job["coordinates"])
    out: dict[str, dict[str, set[str]]] = {}
    for stage, coords in by_stage.items():
        keys = list(dict.fromkeys(k for c in coords for k in c))
        ties: dict[str, set[str]] = {}
        for a in keys:
            for b in keys:
                if a == b:
                    continue
                seen: dict[Any, Any] = {}
                if all(
                    seen.setdefault(cell_key(c.get(a)), cell_key(c.get(b))) == cell_key(c.get(b))
                    for c in coords
                ):
                    ties.setdefault(a, set()).add(b)
        out[stage] = ties
    return out


def plan_values(plan: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Every stage's coordinate keys with the values its jobs take, from a study folder's plan
    (``plan.json``'s jobs)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for job in plan:
        keys = out.setdefault(job["stage"], {})
        for key, value in job["coordinates"].items():
            seen = keys.setdefault(key, [])
            if not any(_same(value, v) for v in seen):
                seen.append(value)
    return out


def default_replicate(study: Any, stage: str) -> str | None:
    from lmc.studies.aggregate import seed_keys

    keys = seed_keys(study, stage)
    return keys[0] if keys else None


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StudyError(f"{where} must be a number, got {value!r}")
    return float(value)


def _where(
    value: Any,
    at: str,
    stage: str,
    values: dict[str, dict[str, list[Any]]],
    free: set[str],
    ties: dict[str, dict[str, set[str]]] | None = None,
    axis: str | None = None,
) -> dict[str, Any]:
    where = dict(_mapping(value or {}, at))
    keys = values[stage]
    tied = (ties or {}).get(stage, {})
    # a key tied to the x axis (a zipped learning rate) varies with it, one tied to a fixed key
    # is fixed with it
    free = free | (tied.get(axis, set()) if axis else set())
    fixed = set(where) | {t for k in where for t in tied.get(k, ())}
    for key, v in where.items():
        if key not in keys:
            raise StudyError(
                f"{at} names {key!r}, not a coordinate of stage {stage!r}; its keys: "
                f"{', '.join(keys)}"
            )
        if key in free:
            raise StudyError(
                f"{at} fixes {key!r}, which the claim varies (the replicates or its x axis)"
            )
        if v not in keys[key] and not any(_same(v, w) for w in keys[key]):
            raise StudyError(
                f"{at}: {key}={v!r} is not a value the study runs; its values: {keys[key]!r}"
            )
    missing = [k for k in keys if k not in fixed and k not in free]
    if missing:
        raise StudyError(
            f"{at} must fix every coordinate of stage {stage!r} but the replicates "
            f"({', '.join(sorted(free)) or 'none'}): add {', '.join(missing)}"
        )
    return where


def _same(a: Any, b: Any) -> bool:
    from lmc.studies.aggregate import cell_key

    return cell_key(a) == cell_key(b)


def parse_claims(
    value: Any,
    study: Any,
    values: dict[str, dict[str, list[Any]]] | None = None,
    ties: dict[str, dict[str, set[str]]] | None = None,
) -> tuple[Claim, ...]:
    """The study file's ``claims:`` list, checked against the study's stages, coordinate keys
    and values (the metrics against what the stages produce: :func:`check_claim_metrics`).

    Args:
        value: the ``claims:`` list.
        study: the :class:`Study`, or (with ``values``) a study file's plain YAML or a study
            folder (:func:`lmc.studies.aggregate.seed_keys` reads its replicate axes).
        values: every stage's coordinate values (:func:`plan_values`); default
            :func:`stage_values` of ``study``.
        ties: the keys each key determines per stage (:func:`plan_ties`); default those of
            ``study``'s plan when ``values`` is not given, else none.

    Raises:
        StudyError: a claim with a wrong key, test, expectation, stage, coordinate or value.
    """
    if not isinstance(value, list):
        raise StudyError(f"claims must be a list of claims, got {value!r}")
    if values is None:
        jobs = _jobs(study)
        values, ties = plan_values(jobs), plan_ties(jobs)
    claims, names = [], set()
    for i, raw in enumerate(value):
        at = f"claims[{i}]"
        raw = _mapping(raw, at)
        for key in raw:
            if key not in _CLAIM_KEYS:
                raise StudyError(
                    f"unknown key {key!r} in {at}; valid keys: {', '.join(_CLAIM_KEYS)}"
                )
        for key in ("name", "claim", "source", "test", "expect"):
            if key not in raw:
                raise StudyError(f"{at} needs the key {key!r}")
        name = raw["name"]
        if not isinstance(name, str) or not _NAME.match(name) or name in names:
            raise StudyError(f"{at}.name must be a unique folder-safe name, got {name!r}")
        names.add(name)
        at = f"claim {name!r}"
        test, expect = raw["test"], raw["expect"]
        if test not in TESTS:
            raise StudyError(f"{at}: unknown test {test!r}; valid tests: {', '.join(TESTS)}")
        if expect not in EXPECT[test]:
            raise StudyError(
                f"{at}: a {test} claim expects one of {', '.join(EXPECT[test])}, got {expect!r}"
            )
        claims.append(_claim(raw, at, name, test, expect, study, values, ties or {}))
    return tuple(claims)


def _claim(
    raw: Mapping[str, Any],
    at: str,
    name: str,
    test: str,
    expect: str,
    study: Any,
    values: dict[str, dict[str, list[Any]]],
    ties: dict[str, dict[str, set[str]]],
) -> Claim:
    def cell(
        spec: Mapping[str, Any] | None, where_at: str, free_extra: set[str], axis: str | None = None
    ) -> Cell:
        spec = dict(spec or {})
        for key in spec:
            if key not in ("stage", "metric", "where"):
                raise StudyError(f"unknown key {key!r} in {where_at}; valid: stage, metric, where")
        stage = spec.get("stage", raw.get("stage"))
        metric = spec.get("metric", raw.get("metric") if test != "fit" else raw.get("y"))
        if stage not in values:
            raise StudyError(
                f"{where_at}: stage {stage!r} is not a stage of the study; its stages: "
                f"{', '.join(values)}"
            )
        if not isinstance(metric, str) or not metric:
            raise StudyError(f"{where_at} needs a metric (a name the stage's jobs report)")
        replicate = raw.get("replicate") or default_replicate(study, stage)
        free = {replicate} if replicate else set()
        from lmc.studies.aggregate import seed_keys

        free |= set(seed_keys(study, stage)) | free_extra
        merged = {**dict(raw.get("where") or {}), **dict(spec.get("where") or {})}
        where = _where(merged, f"{where_at}.where", stage, values, free, ties, axis)
        return Cell(stage, metric, where)

    x, x_values, peak = raw.get("x"), tuple(raw.get("x_values") or ()), raw.get("peak")
    effect = raw.get("effect")
    if effect is not None:
        effect = _number(effect, f"{at}.effect")
    if test in ("difference",):
        if "a" not in raw or "b" not in raw:
            raise StudyError(f"{at}: a difference claim needs cells `a` and `b`")
        cells = (cell(raw["a"], f"{at}.a", set()), cell(raw["b"], f"{at}.b", set()))
    elif test == "ordering":
        given = raw.get("cells")
        if not isinstance(given, list) or len(given) < 2:
            raise StudyError(f"{at}: an ordering claim needs `cells`, a list of 2 or more")
        cells = tuple(cell(c, f"{at}.cells[{j}]", set()) for j, c in enumerate(given))
    elif test == "trend":
        if x is None:
            raise StudyError(f"{at}: a trend claim needs `x` (a coordinate key or a label)")
        templated = _TEMPLATE in str(raw.get("metric", ""))
        if templated and len(x_values) < 3:
            raise StudyError(
                f"{at}: a metric template holding {_TEMPLATE} needs x_values (3 or more), the "
                f"values put in it, e.g. metric: stemm/n{_TEMPLATE}/test/acc, x_values: [2, 4, 8]"
            )
        stage = raw.get("stage")
        if not templated and stage in values and x not in values[stage]:
            raise StudyError(
                f"{at}: x {x!r} is not a coordinate of stage {stage!r}; its keys: "
                f"{', '.join(values[stage])}"
            )
        c = cell(None, at, set() if templated else {x}, None if templated else x)
        if not templated:
            xs = values[c.stage][x]
            if len(xs) < 3 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs
            ):
                raise StudyError(f"{at}: x {x!r} needs 3 or more numeric values, got {xs!r}")
            if x_values and (
                len(x_values) < 3 or any(not any(_same(v, w) for w in xs) for v in x_values)
            ):
                raise StudyError(
                    f"{at}: x_values {list(x_values)!r} must be 3 or more values of {x} the "
                    f"study runs ({xs!r}): the part of the axis the claim is about"
                )
        axis = x_values if x_values else tuple(values[c.stage][x])
        if peak is not None and (expect not in ("peaked", "valley") or peak not in axis[1:-1]):
            raise StudyError(
                f"{at}: peak {peak!r} must be an interior x value of a peaked/valley claim "
                f"(interior values: {list(axis[1:-1])!r})"
            )
        cells = (c,)
    else:  # fit
        if not isinstance(x, str) or not isinstance(raw.get("y"), str):
            raise StudyError(f"{at}: a fit claim needs `x` and `y`, two metrics of one stage")
        model = raw.get("model", "exp")
        if model not in FIT_MODELS:
            raise StudyError(f"{at}: model {model!r}; valid models: {', '.join(FIT_MODELS)}")
        stage = raw.get("stage")
        if stage not in values:
            raise StudyError(
                f"{at}: stage {stage!r} is not a stage of the study; its stages: "
                f"{', '.join(values)}"
            )
        free = set(values[stage]) - set(raw.get("where") or {})
        c = Cell(stage, raw["y"], _where(raw.get("where"), f"{at}.where", stage, values, free))
        cells = (c,)
    min_r2 = raw.get("min_r2")
    if min_r2 is not None:
        min_r2 = _number(min_r2, f"{at}.min_r2")
    replicate = {c.stage: raw.get("replicate") or default_replicate(study, c.stage) for c in cells}
    for stage, key in replicate.items():
        if key is not None and key not in values[stage]:
            raise StudyError(
                f"{at}: replicate {key!r} is not a coordinate of stage {stage!r}; its keys: "
                f"{', '.join(values[stage])}"
            )
    return Claim(
        name=name,
        claim=str(raw["claim"]),
        source=str(raw["source"]),
        test=test,
        expect=expect,
        cells=cells,
        replicate=replicate,
        paper=str(raw.get("paper", "")),
        effect=effect,
        x=x,
        x_values=x_values,
        peak=peak,
        y=raw.get("y"),
        model=raw.get("model", "exp"),
        min_r2=min_r2,
    )


def check_claim_metrics(claims: Sequence[Claim], produced: Mapping[str, set[str] | None]) -> None:
    """Refuse a claim that reads a metric its stage does not produce (``produced``: stage ->
    the metrics its jobs report, or ``None`` when that is only known once a job ran).

    Raises:
        StudyError: naming the claim, the metric and what the stage produces.
    """
    for claim in claims:
        for stage, metrics in claim.metrics.items():
            known = produced.get(stage)
            if known is None:
                continue
            for metric in sorted(metrics):
                if metric not in known:
                    raise StudyError(
                        f"claim {claim.name!r} reads {metric!r}, which stage {stage!r} does not "
                        f"produce; it produces: {', '.join(sorted(known))}"
                    )


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


def _cell_values(table: pd.DataFrame, cell: Cell, replicate: str | None) -> pd.Series:
    """The values of ``cell`` indexed by replicate (the row's job id without one)."""
    from lmc.studies.aggregate import cell_key

    rows = table[(table["stage"] == cell.stage) & (table["metric"] == cell.metric)]
    for key, value in cell.where.items():
        if key not in rows.columns:
            return pd.Series(dtype=float)
        want = cell_key(value)
        rows = rows.loc[np.array([cell_key(v) == want for v in rows[key]], dtype=bool)]
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
    verdicts = [p["verdict"] for p in pairs]
    if "contradicted" in verdicts:
        overall = "contradicted"
    elif all(v == "reproduced" for v in verdicts):
        overall = "reproduced"
    else:
        overall = "inconclusive"
    weakest = min(
        pairs, key=lambda p: sign * p["ci_low"] if math.isfinite(p["ci_low"]) else -math.inf
    )
    needed = [p["n_needed"] for p in pairs if p["verdict"] == "inconclusive"]
    stat = {**weakest, "verdict": overall, "n_needed": max(needed) if needed else None}
    detail = "; ".join(f"{c.label()}: {_mean_text(s)}" for c, s in zip(claim.cells, series))
    return _result(claim, stat, detail)


def _trend_matrix(claim: Claim, table: pd.DataFrame) -> tuple[list[Any], pd.DataFrame]:
    """Rows: replicates; columns: x values; the metric per cell."""
    cell = claim.cells[0]
    replicate = claim.replicate.get(cell.stage)
    columns = {}
    if _TEMPLATE in cell.metric:
        axis = list(claim.x_values)
        for v in axis:
            metric = cell.metric.replace(_TEMPLATE, str(v))
            columns[v] = _cell_values(table, Cell(cell.stage, metric, cell.where), replicate)
    else:
        from lmc.studies.aggregate import cell_key

        rows = table[(table["stage"] == cell.stage) & (table["metric"] == cell.metric)]
        for key, value in cell.where.items():
            mask = [cell_key(v) == cell_key(value) for v in rows[key]]
            rows = rows.loc[np.array(mask, dtype=bool)]
        present = {float(v) for v in pd.to_numeric(rows[claim.x], errors="coerce").dropna()}
        axis = sorted(float(v) for v in claim.x_values) if claim.x_values else sorted(present)
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
    if claim.peak is not None:
        top = next(x for x in interior if _same(x, claim.peak))
        chosen = "the paper's"
    else:
        inner = means[interior]
        top = inner.idxmax() if sign > 0 else inner.idxmin()
        chosen = "the interior mean's " + ("largest" if sign > 0 else "smallest")
    ends = (axis[0], axis[-1])
    parts = [_difference(frame[top].dropna(), frame[e].dropna(), sign, None)[0] for e in ends]
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
    stat = {**weakest, "verdict": overall, "n_needed": max(needed) if needed else None}
    detail = (
        f"peak x = {top} ({chosen}) against x = {ends[0]} and {ends[1]}, the weaker "
        f"difference shown; means {text}"
    )
    return _result(claim, stat, detail, {"peak_x": top})


def _evaluate_fit(claim: Claim, table: pd.DataFrame) -> ClaimResult:
    cell = claim.cells[0]
    rows = table[table["stage"] == cell.stage]
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
    del rows
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
        if r.verdict == "inconclusive" and r.n_needed is not None:
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


def study_claims(root: Any) -> list[ClaimResult]:
    """The claims of the study folder ``root`` (its copy of the study file), evaluated on its
    done jobs; ``[]`` when the study declares none.

    Raises:
        StudyError: ``root`` is no study folder, or a claim does not fit the study.
    """
    import json

    import yaml

    from lmc.studies.results import results
    from lmc.studies.store import PLAN_FILE, STUDY_FILE, study_folder

    root = study_folder(root)
    data = yaml.safe_load((root / STUDY_FILE).read_text()) or {}
    if not data.get("claims"):
        return []
    plan = json.loads((root / PLAN_FILE).read_text())["jobs"]
    claims = parse_claims(data["claims"], data, plan_values(plan), plan_ties(plan))
    return evaluate_claims(claims, results(root))
