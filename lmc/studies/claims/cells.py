"""Each claim test's cells, read from a claim's mapping in a study file (the ``cells`` part of
the kinds in :data:`lmc.studies.claims.kinds.CLAIM_TESTS`): two cells ``a`` and ``b``
(difference, equivalent), a list of cells (ordering), one cell over an x axis (trend), one
metric against another (fit)."""

from __future__ import annotations

from lmc.studies.claims.declared import (
    FIT_MODELS,
    TEMPLATE,
    Cell,
    CellSource,
    checked_where,
    distinct_cells,
    same_value,
)
from lmc.studies.claims.kinds import CLAIM_TESTS
from lmc.studies.spec.schema import StudyError


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
