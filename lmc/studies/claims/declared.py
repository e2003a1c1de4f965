"""A paper's claims, declared in the study file and evaluated on the study's results.

Each claim is the paper's statement as a comparison or a trend over the study's metrics, with
where it comes from and, where the paper gives one in the study's own units, the paper's effect.
:mod:`lmc.studies.claims.verdicts` evaluates every claim over the independent replicates (seeds,
pairs, trials: those whose models are disjoint) with a 95 % Student-t interval
(:mod:`lmc.studies.claims.inference`) and gives a verdict:

* ``reproduced``: the interval excludes 0 on the side the paper states, and does not lie below
  the paper's ``effect`` (where one is given and the study can reach it);
* ``contradicted``: the interval lies on the other side of 0, or below the paper's effect;
* ``inconclusive``: otherwise; ``n_needed`` is then the number of independent replicates that
  would resolve it at 80 % power (two-sided 5 %) at the observed mean and spread.

``scale: log`` compares ``log`` of a positive metric (a difference is then a fold change);
``effect`` is a number in the metric's units or a relative change (``"-60%"``: ``a = 0.4 b``);
``lmc_setting`` says how the study's setting deviates from the paper's for this claim.

Tests (``test:``), each over cells of one stage, a cell being a value of every coordinate key
of the stage but the replicate axis (``replicate``, default the stage's, see
:func:`lmc.studies.reporting.aggregate.seed_keys`):

``equivalent``
    ``a`` and ``b`` equal within ``margin`` (a number in the metric's units, or relative:
    ``"10%"``): two one-sided tests (the 90 % interval within the margin: ``reproduced``; the
    95 % interval wholly outside it: ``contradicted``).
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmc.studies.claims.kinds import CLAIM_TESTS
from lmc.studies.spec.schema import NAME_PATTERN, Study, StudyError

TESTS = tuple(CLAIM_TESTS)
EXPECT = {name: kind.expects for name, kind in CLAIM_TESTS.items()}
FIT_MODELS = ("exp", "linear")
TEMPLATE = "{x}"
SCALES = ("raw", "log")
#: metrics that are never below 0 (``fnmatch`` patterns): losses, barriers, accuracies,
#: distances, norms, ratios. ``scale: log`` is for these only (a barrier of exactly 0 is left
#: out of a log-scale claim and counted), and an absolute fall larger than such a metric's
#: starting value is out of reach (:func:`lmc.studies.claims.inference.reachable`).
NONNEGATIVE = (
    "*loss*",
    "*barrier*",
    "*acc*",
    "*distance*",
    "*norm*",
    "*ratio*",
    "*overlap*",
    "*sparsity*",
    "*error*",
    "*pq*",
)
#: names of signed quantities, never non-negative whatever else they hold (a loss gap)
SIGNED = ("*gap*", "*delta*", "*diff*", "*slope*", "*change*", "*log*")
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
    "scale",
    "xscale",
    "margin",
    "lmc_setting",
)


def nonnegative(metric: str) -> bool:
    """Whether ``metric`` names a quantity that is never below 0 (:data:`NONNEGATIVE`)."""
    from fnmatch import fnmatchcase

    name = metric.lower()
    if any(fnmatchcase(name, p) for p in SIGNED):
        return False
    return any(fnmatchcase(name, p) for p in NONNEGATIVE)


def text_of(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise StudyError(
            f"{at} must be text saying how the study's setting deviates from the paper's, got "
            f"{value!r}"
        )
    return value


def effect_of(value: Any, at: str, what: str = "effect") -> tuple[float | None, float | None]:
    """``(absolute, relative)`` of a claim's ``effect`` (or ``margin``): a number in the
    metric's own units, or a relative change ``"-60%"`` of ``a`` against ``b``."""
    if value is None:
        return None, None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            rel = float(value.strip()[:-1]) / 100
        except ValueError:
            rel = math.nan
        if not math.isfinite(rel) or rel <= -1:
            raise StudyError(
                f"{at}.{what} {value!r} is not a relative change above -100 %: write e.g. "
                f"'-60%' (a falls to 40 % of b) or '+25%'"
            )
        return None, rel
    return number(value, f"{at}.{what}"), None


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
    replicate: dict[str, str | None]  # stage -> its replicate key (None: it has none)
    paper: str = ""
    effect: float | None = None
    x: str | None = None
    x_values: tuple[Any, ...] = ()
    peak: Any = None
    y: str | None = None
    model: str = "exp"
    min_r2: float | None = None
    #: ``raw`` or ``log``: a log-scale claim compares ``log`` of its metric (a difference is a
    #: fold change ``a / b``, a slope is of ``log y``)
    scale: str = "raw"
    #: the paper's effect as a relative change of ``a`` against ``b`` (``"-60%"`` -> -0.6)
    effect_relative: float | None = None
    #: an equivalence claim's margin: in the metric's units, or relative (``margin_relative``)
    margin: float | None = None
    margin_relative: float | None = None
    #: where the study runs lmc's setting, not the paper's, for this claim: how it deviates
    #: (the claim is then reported apart, not counted as a reproduction of the paper)
    lmc_setting: str = ""
    #: a trend's x axis: ``linear`` or ``log`` (with ``scale: log``, the slope is a power law's
    #: exponent: ``y ~ x^a``)
    xscale: str = "linear"

    @property
    def metrics(self) -> dict[str, set[str]]:
        """The metrics the claim reads, by stage."""
        out: dict[str, set[str]] = {}
        kind = CLAIM_TESTS[self.test]
        for cell in self.cells:
            names = {cell.metric}
            if kind.templated_x and TEMPLATE in cell.metric:
                names = {cell.metric.replace(TEMPLATE, str(v)) for v in self.x_values}
            if kind.reads_x_metric:
                names = {cell.metric, str(self.x)}
            out.setdefault(cell.stage, set()).update(names)
        return out


# ---------------------------------------------------------------------------------- parsing


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StudyError(f"{where} must be a mapping, got {value!r}")
    return value


def stage_values(study: Study) -> dict[str, dict[str, list[Any]]]:
    """Every stage's coordinate keys with the values its jobs take (from its plan)."""
    return plan_values(_jobs(study))


def _jobs(study: Study) -> list[dict[str, Any]]:
    from lmc.studies.running.plan import plan

    return [job.to_json() for job in plan(study)]


def plan_ties(plan: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """Per stage, the keys each coordinate key determines: ``b`` is tied to ``a`` when every
    job of the stage with one value of ``a`` has one value of ``b`` (a zipped learning rate is
    tied to the width it goes with)."""
    from lmc.studies.reporting.aggregate import cell_key

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
            if not any(same_value(value, v) for v in seen):
                seen.append(value)
    return out


def default_replicate(study: Any, stage: str) -> str | None:
    from lmc.studies.reporting.aggregate import seed_keys

    keys = seed_keys(study, stage)
    return keys[0] if keys else None


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StudyError(f"{where} must be a number, got {value!r}")
    return float(value)


def checked_where(
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
        if v not in keys[key] and not any(same_value(v, w) for w in keys[key]):
            raise StudyError(
                f"{at}: {key}={v!r} is not a value the study runs; its values: {keys[key]!r}"
            )
    # a key tied to a replicate key (a federation's init seed zipped with its split seed) may
    # vary with it when the claim does not fix it
    with_replicates = {t for k in free for t in tied.get(k, ())}
    missing = [k for k in keys if k not in fixed and k not in free | with_replicates]
    if missing:
        raise StudyError(
            f"{at} must fix every coordinate of stage {stage!r} but the replicates "
            f"({', '.join(sorted(free)) or 'none'}): add {', '.join(missing)}"
        )
    return where


def same_value(a: Any, b: Any) -> bool:
    """Whether two coordinate values are equal as cells see them (``4 == 4.0``)."""
    from lmc.studies.reporting.aggregate import cell_key

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
            folder (:func:`lmc.studies.reporting.aggregate.seed_keys` reads its replicate axes).
        values: every stage's coordinate values (:func:`plan_values`); default
            :func:`stage_values` of ``study``.
        ties: the keys each key determines per stage (:func:`plan_ties`); default those of
            ``study``'s plan when ``values`` is not given, else none.

    Raises:
        StudyError: a claim with a wrong key, test, expectation, stage, coordinate or value.
    """
    from lmc.studies.claims.cells import read_claim

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
        if raw.get("test") == "equivalent":
            raw = {"expect": "equal", **raw}
        for key in ("name", "claim", "source", "test", "expect"):
            if key not in raw:
                raise StudyError(f"{at} needs the key {key!r}")
        name = raw["name"]
        if not isinstance(name, str) or not NAME_PATTERN.match(name) or name in names:
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
        claims.append(read_claim(raw, at, name, test, expect, study, values, ties or {}))
    return tuple(claims)


def parse_study_claims(text: str, plan: Sequence[Mapping[str, Any]]) -> tuple[Claim, ...]:
    """The claims of the study file ``text``, checked against a study folder's ``plan``
    (``plan.json``'s jobs, or the jobs a results table holds); ``()`` when it declares none.

    Raises:
        StudyError: a claim does not fit the study.
    """
    import yaml

    data = yaml.safe_load(text) or {}
    if not data.get("claims"):
        return ()
    return parse_claims(data["claims"], data, plan_values(plan), plan_ties(plan))


def distinct_cells(cells: Sequence[Cell], at: str, what: str) -> None:
    """Refuse cells that select the same values (stage, metric and where): a comparison of a
    cell with itself was evaluated as an inconclusive difference of 0."""
    seen = [repr((c.stage, c.metric, sorted(c.where.items(), key=str))) for c in cells]
    twice = sorted({s for s in seen if seen.count(s) > 1})
    if twice:
        raise StudyError(
            f"{at}: {what} select the same values ({twice[0]}); give them different `where` "
            "values, metrics or stages"
        )


def _not_produced(metric: str, known: set[str]) -> str | None:
    """``None`` when ``metric`` is among ``known`` (names or ``fnmatch`` patterns), else what
    the refusal adds: how many names there are and the closest ones."""
    import difflib
    from fnmatch import fnmatchcase

    if metric in known or any(fnmatchcase(metric, k) for k in known if "*" in k):
        return None
    close = difflib.get_close_matches(metric, sorted(known), n=5, cutoff=0.6)
    if close:
        return f"{len(known)} names; the closest it produces: {', '.join(close)}"
    listed = ", ".join(sorted(known)[:12]) + (", ..." if len(known) > 12 else "")
    return f"{len(known)} names; it produces: {listed}"


def check_claim_metrics(claims: Sequence[Claim], produced: Mapping[str, set[str] | None]) -> None:
    """Refuse a claim that reads a metric its stage does not produce (``produced``: stage ->
    the metrics its jobs report, names or ``fnmatch`` patterns, or ``None`` when that is only
    known once a job ran).

    Raises:
        StudyError: naming the claim, the metric and the stage's names closest to it.
    """
    for claim in claims:
        for stage, metrics in claim.metrics.items():
            known = produced.get(stage)
            if known is None:
                continue
            for metric in sorted(metrics):
                why = _not_produced(metric, known)
                if why:
                    raise StudyError(
                        f"claim {claim.name!r} reads {metric!r}, which stage {stage!r} does not "
                        f"produce ({why})"
                    )


def check_figure_metrics(figures: Sequence[Any], produced: Mapping[str, set[str] | None]) -> None:
    """Refuse a figure (not a curve: those draw series) that names a metric its stage does not
    produce, as :func:`check_claim_metrics` does for claims (a misspelt figure metric was found
    only once every job had run, and the report was not written).

    Raises:
        StudyError: naming the figure, the metric and the stage's closest names.
    """
    from lmc.studies.reporting.figure_spec import FIGURE_KINDS

    for spec in figures:
        known = produced.get(spec.stage)
        kind = FIGURE_KINDS[spec.kind]
        if known is None or kind.draws_series:
            continue
        for metric in [*spec.y, *([spec.x] if kind.x_metric else [])]:
            why = _not_produced(metric, known)
            if why:
                raise StudyError(
                    f"figure {spec.name!r} draws {metric!r}, which stage {spec.stage!r} does "
                    f"not produce ({why})"
                )
