"""A claim read from its mapping in a study file (:func:`read_claim`: the keys every test
shares, checked), and each claim test's cells (the ``cells`` part of the kinds in
:data:`lmc.studies.claims.kinds.CLAIM_TESTS`): two cells ``a`` and ``b`` (difference,
equivalent), a list of cells (ordering), one cell over an x axis (trend), one metric against
another (fit)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lmc.studies.claims.declared import (
    FIT_MODELS,
    SCALES,
    TEMPLATE,
    Cell,
    Claim,
    checked_where,
    default_replicate,
    distinct_cells,
    effect_of,
    nonnegative,
    number,
    same_value,
    text_of,
)
from lmc.studies.claims.kinds import CLAIM_TESTS
from lmc.studies.spec.schema import StudyError


@dataclass(frozen=True)
class CellSource:
    """What a kind's ``cells`` part reads (:mod:`lmc.studies.claims.cells`): the claim's
    mapping and place, its test and expectation, the study's coordinate values per stage, a
    function building a checked :class:`Cell` (``cell(spec, where_at, free_extra, axis)``) and
    the claim's x axis."""

    raw: Mapping[str, Any]
    at: str
    test: str
    expect: str
    values: dict[str, dict[str, list[Any]]]
    cell: Callable[..., Cell]
    x: Any
    x_values: tuple[Any, ...]
    peak: Any


def read_claim(
    raw: Mapping[str, Any],
    at: str,
    name: str,
    test: str,
    expect: str,
    study: Any,
    values: dict[str, dict[str, list[Any]]],
    ties: dict[str, dict[str, set[str]]],
) -> Claim:
    kind = CLAIM_TESTS[test]

    def cell(
        spec: Mapping[str, Any] | None, where_at: str, free_extra: set[str], axis: str | None = None
    ) -> Cell:
        spec = dict(spec or {})
        for key in spec:
            if key not in ("stage", "metric", "where"):
                raise StudyError(f"unknown key {key!r} in {where_at}; valid: stage, metric, where")
        stage = spec.get("stage", raw.get("stage"))
        metric = spec.get("metric", raw.get(kind.metric_key))
        if stage not in values:
            raise StudyError(
                f"{where_at}: stage {stage!r} is not a stage of the study; its stages: "
                f"{', '.join(values)}"
            )
        if not isinstance(metric, str) or not metric:
            raise StudyError(f"{where_at} needs a metric (a name the stage's jobs report)")
        replicate = raw.get("replicate") or default_replicate(study, stage)
        free = {replicate} if replicate else set()
        from lmc.studies.reporting.aggregate import seed_keys

        free |= set(seed_keys(study, stage)) | free_extra
        merged = {**dict(raw.get("where") or {}), **dict(spec.get("where") or {})}
        where = checked_where(merged, f"{where_at}.where", stage, values, free, ties, axis)
        return Cell(stage, metric, where)

    x, x_values, peak = raw.get("x"), tuple(raw.get("x_values") or ()), raw.get("peak")
    effect, effect_relative = effect_of(raw.get("effect"), at)
    margin, margin_relative = effect_of(raw.get("margin"), at, "margin")
    scale = raw.get("scale", "raw")
    if scale not in SCALES:
        raise StudyError(
            f"{at}: scale {scale!r}; valid scales: raw, log (log for positive quantities such "
            "as barriers and losses: a difference is then a fold change)"
        )
    if kind.takes_margin:
        if margin is None and margin_relative is None:
            raise StudyError(
                f"{at}: an equivalent claim needs a `margin`, the largest difference that "
                "still counts as equal: a number in the metric's units (margin: 0.01) or "
                "relative (margin: '10%'); two one-sided tests then decide"
            )
        if (
            margin is not None
            and margin <= 0
            or margin_relative is not None
            and margin_relative <= 0
        ):
            raise StudyError(f"{at}.margin must be above 0, got {raw['margin']!r}")
        if scale == "log" and margin is not None:
            raise StudyError(
                f"{at}: on scale: log the margin is a fold change: give it relative "
                f"(margin: '10%'), not in the metric's units ({raw['margin']!r})"
            )
    elif "margin" in raw:
        raise StudyError(f"{at}: `margin` belongs to an equivalent claim, not a {test} claim")
    if effect_relative is not None and not kind.relative_effect:
        raise StudyError(
            f"{at}: a relative effect ({raw['effect']!r}) is a change of a against b: it fits "
            f"a difference claim; give a {test} claim's effect in the units of its estimate"
        )
    if effect is not None and scale == "log" and kind.relative_effect_on_log:
        raise StudyError(
            f"{at}: on scale: log the effect is a fold change: give it relative "
            f"(effect: '-60%'), not in the metric's units ({raw['effect']!r})"
        )
    if not kind.takes_effect and raw.get("effect") is not None:
        raise StudyError(f"{at}: an {test} claim has a margin, not an effect")
    xscale = raw.get("xscale", "linear")
    if xscale not in ("linear", "log") or xscale == "log" and not kind.has_xscale:
        raise StudyError(
            f"{at}: xscale {xscale!r}: a trend claim's x axis is linear or log (the slope of "
            "log y against log x is a power law's exponent); other tests have no xscale"
        )
    if scale == "log" and not kind.has_scale:
        raise StudyError(
            f"{at}: a fit claim has no scale: model: exp already fits log y (model: linear y)"
        )
    cells = kind.part("cells")(CellSource(raw, at, test, expect, values, cell, x, x_values, peak))
    min_r2 = raw.get("min_r2")
    if min_r2 is not None:
        min_r2 = number(min_r2, f"{at}.min_r2")
    replicate = {c.stage: raw.get("replicate") or default_replicate(study, c.stage) for c in cells}
    for stage, key in replicate.items():
        if key is not None and key not in values[stage]:
            raise StudyError(
                f"{at}: replicate {key!r} is not a coordinate of stage {stage!r}; its keys: "
                f"{', '.join(values[stage])}"
            )
    if scale == "log":
        for c in cells:
            metrics = {c.metric}
            if TEMPLATE in c.metric:
                metrics = {c.metric.replace(TEMPLATE, str(v)) for v in x_values}
            for metric in sorted(metrics):
                if not nonnegative(metric):
                    raise StudyError(
                        f"{at} reads {metric!r} on scale: log, but {metric!r} can be 0 or "
                        "below (scale: log is for quantities above 0: losses, barriers, "
                        "accuracies, distances, norms, ratios); use scale: raw"
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
        scale=scale,
        effect_relative=effect_relative,
        margin=margin,
        margin_relative=margin_relative,
        lmc_setting=text_of(raw.get("lmc_setting", ""), f"{at}.lmc_setting"),
        xscale=xscale,
    )


@CLAIM_TESTS["difference"].register("cells")
@CLAIM_TESTS["equivalent"].register("cells")
def two_cells(src: CellSource) -> tuple[Cell, ...]:
    """Cells ``a`` and ``b``, distinct."""
    raw, at, cell = src.raw, src.at, src.cell
    if "a" not in raw or "b" not in raw:
        raise StudyError(f"{at}: a {src.test} claim needs cells `a` and `b`")
    cells = (cell(raw["a"], f"{at}.a", set()), cell(raw["b"], f"{at}.b", set()))
    distinct_cells(cells, at, "a and b")
    return cells


@CLAIM_TESTS["ordering"].register("cells")
def ordered_cells(src: CellSource) -> tuple[Cell, ...]:
    """``cells``: two or more distinct cells, in the claimed order."""
    given = src.raw.get("cells")
    if not isinstance(given, list) or len(given) < 2:
        raise StudyError(f"{src.at}: an ordering claim needs `cells`, a list of 2 or more")
    cells = tuple(src.cell(c, f"{src.at}.cells[{j}]", set()) for j, c in enumerate(given))
    distinct_cells(cells, src.at, "its cells")
    return cells


@CLAIM_TESTS["trend"].register("cells")
def axis_cell(src: CellSource) -> tuple[Cell, ...]:
    """One cell over ``x``: a coordinate of 3 or more numeric values, or the values
    ``x_values`` put in a metric template holding ``{x}``; a peak among the interior ones."""
    raw, at, values, x, x_values, peak = src.raw, src.at, src.values, src.x, src.x_values, src.peak
    if x is None:
        raise StudyError(f"{at}: a trend claim needs `x` (a coordinate key or a label)")
    templated = TEMPLATE in str(raw.get("metric", ""))
    if templated and len(x_values) < 3:
        raise StudyError(
            f"{at}: a metric template holding {TEMPLATE} needs x_values (3 or more), the "
            f"values put in it, e.g. metric: stemm/n{TEMPLATE}/test/acc, x_values: [2, 4, 8]"
        )
    stage = raw.get("stage")
    if not templated and stage in values and x not in values[stage]:
        raise StudyError(
            f"{at}: x {x!r} is not a coordinate of stage {stage!r}; its keys: "
            f"{', '.join(values[stage])}"
        )
    c = src.cell(None, at, set() if templated else {x}, None if templated else x)
    if not templated:
        xs = values[c.stage][x]
        if len(xs) < 3 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs
        ):
            raise StudyError(f"{at}: x {x!r} needs 3 or more numeric values, got {xs!r}")
        if x_values and (
            len(x_values) < 3 or any(not any(same_value(v, w) for w in xs) for v in x_values)
        ):
            raise StudyError(
                f"{at}: x_values {list(x_values)!r} must be 3 or more values of {x} the "
                f"study runs ({xs!r}): the part of the axis the claim is about"
            )
    axis = x_values if x_values else tuple(values[c.stage][x])
    if peak is not None and (src.expect not in ("peaked", "valley") or peak not in axis[1:-1]):
        raise StudyError(
            f"{at}: peak {peak!r} must be an interior x value of a peaked/valley claim "
            f"(interior values: {list(axis[1:-1])!r})"
        )
    return (c,)


@CLAIM_TESTS["fit"].register("cells")
def fit_cell(src: CellSource) -> tuple[Cell, ...]:
    """One metric ``y`` against another ``x`` of one stage, under a ``model`` (every
    coordinate not fixed by ``where`` varies: the fit is over all its jobs)."""
    raw, at, values, x = src.raw, src.at, src.values, src.x
    if not isinstance(x, str) or not isinstance(raw.get("y"), str):
        raise StudyError(f"{at}: a fit claim needs `x` and `y`, two metrics of one stage")
    model = raw.get("model", "exp")
    if model not in FIT_MODELS:
        raise StudyError(f"{at}: model {model!r}; valid models: {', '.join(FIT_MODELS)}")
    stage = raw.get("stage")
    if stage not in values:
        raise StudyError(
            f"{at}: stage {stage!r} is not a stage of the study; its stages: {', '.join(values)}"
        )
    free = set(values[stage]) - set(raw.get("where") or {})
    c = Cell(stage, raw["y"], checked_where(raw.get("where"), f"{at}.where", stage, values, free))
    return (c,)
