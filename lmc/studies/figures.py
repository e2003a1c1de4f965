"""A study's figures: declared under ``figures:`` in the study file, checked when it is read
(:func:`parse_figures`) and against the done jobs' metrics before drawing
(:func:`check_metrics`), drawn from the study folder's tables (:mod:`lmc.studies.aggregate`)
into PNG, PDF, SVG and the CSV of exactly the plotted data (:func:`render_figures`).

Kinds: ``line`` (a metric's mean over replicates vs a coordinate, 95 % t-interval band),
``bar`` (the same as grouped bars with interval error bars), ``scatter`` (one point per done
job: a metric vs another, optionally fitted by ``y = exp(a x + b)``, the form of 000's
``L = e^{aH+b}``), ``curve`` (a series of the jobs' ``summary.json``, e.g. the loss along the
matched interpolation path, mean and interval across jobs) and ``heatmap`` (a metric's mean over
two coordinates).

The study file parser imports this module, so pandas and matplotlib are imported only where a
figure is drawn.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmc.io import atomic_path
from lmc.studies.schema import StudyError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_KINDS = ("line", "bar", "scatter", "curve", "heatmap")
SCALES = ("linear", "log")
PNG_DPI = 150
MAX_TICKS = 12  # a line figure with at most this many x values gets them as its ticks
NO_DATA = "no finite values"
NO_JOB = "no done job of stage {!r}"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a study's report (see the module docstring and the study file layout in
    :mod:`lmc.studies.schema`)."""

    name: str
    kind: str
    stage: str
    y: tuple[str, ...]
    x: str | None = None
    hue: str | None = None
    rows: str | None = None
    series: str | None = None
    fit: str | None = None
    xscale: str = "linear"
    yscale: str = "linear"
    xlabel: str | None = None
    ylabel: str | None = None
    title: str | None = None
    references: tuple[tuple[float, float, str], ...] = ()


def fit_exp(x: Sequence[float], y: Sequence[float]) -> dict[str, float] | None:
    """Least squares of ``log y = a x + b`` over the points with finite ``x`` and finite,
    positive ``y``: ``{"a", "b", "r2"}`` (``r2``: coefficient of determination of ``log y``),
    or ``None`` with fewer than two distinct ``x``."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys) & (ys > 0)
    xs, logs = xs[keep], np.log(ys[keep])
    if np.unique(xs).size < 2:
        return None
    a, b = np.polyfit(xs, logs, 1)
    residual = float(np.sum((logs - (a * xs + b)) ** 2))
    total = float(np.sum((logs - logs.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else math.nan)
    return {"a": float(a), "b": float(b), "r2": r2}


#: fit name -> function of (x, y) giving its parameters; ``curve`` draws the fitted y at x
FITS: dict[str, Callable[[Sequence[float], Sequence[float]], dict[str, float] | None]] = {
    "exp": fit_exp
}
FIT_CURVES: dict[str, Callable[[dict[str, float], np.ndarray], np.ndarray]] = {
    "exp": lambda p, x: np.exp(p["a"] * x + p["b"])
}
FIT_LABELS: dict[str, Callable[[dict[str, float]], str]] = {
    "exp": lambda p: (
        f"fit y = exp({p['a']:.4g} x {'-' if p['b'] < 0 else '+'} {abs(p['b']):.4g}), "
        f"R² = {p['r2']:.4f}"
    )
}

# per kind: keys it needs beyond name/kind/stage/y, and the optional ones it takes
_COMMON = ("name", "kind", "stage", "y", "xlabel", "ylabel", "title")
_KIND_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "line": (("x",), ("hue", "xscale", "yscale", "references")),
    "bar": (("x",), ("hue", "yscale")),
    "scatter": (("x",), ("hue", "fit", "xscale", "yscale", "references")),
    "curve": (("series",), ("hue", "xscale", "yscale", "references")),
    "heatmap": (("x", "rows"), ()),
}
_ONE_Y = ("scatter", "heatmap")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise StudyError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _references(value: Any, where: str) -> tuple[tuple[float, float, str], ...]:
    if not isinstance(value, list):
        raise StudyError(f"{where} must be a list of {{x: .., y: .., label: ..}}, got {value!r}")
    out = []
    for i, ref in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(ref, Mapping) or set(ref) != {"x", "y", "label"}:
            raise StudyError(
                f"{at} must be a mapping with exactly the keys x, y, label, got {ref!r}"
            )
        for key in ("x", "y"):
            v = ref[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise StudyError(f"{at}.{key} must be a finite number, got {v!r}")
        out.append((float(ref["x"]), float(ref["y"]), _text(ref["label"], f"{at}.label")))
    return tuple(out)


def _parse_one(
    entry: Any, i: int, stages: Mapping[str, Collection[str]], names: set[str]
) -> FigureSpec:
    where = f"figures[{i}]"
    if not isinstance(entry, Mapping):
        raise StudyError(f"{where} must be a mapping (a figure), got {entry!r}")
    valid = [f.name for f in fields(FigureSpec)]
    for key in entry:
        if key not in valid:
            raise StudyError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}")
    for key in ("name", "kind", "stage", "y"):
        if key not in entry:
            raise StudyError(f"{where} needs the key {key!r} (valid keys: {', '.join(valid)})")
    name = entry["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise StudyError(
            f"{where}.name must be a folder-safe file name (letters, digits, _ . -), got {name!r}"
        )
    if name in names:
        raise StudyError(f"figure names must be unique: {name!r} is used twice")
    names.add(name)
    where = f"figure {name!r}"
    kind = entry["kind"]
    if kind not in FIGURE_KINDS:
        raise StudyError(f"{where}: unknown kind {kind!r}; valid kinds: {', '.join(FIGURE_KINDS)}")
    required, optional = _KIND_KEYS[kind]
    takes = (*_COMMON, *required, *optional)
    for key in entry:
        if key not in takes:
            raise StudyError(
                f"{where}: a {kind} figure takes no {key!r}; its keys: {', '.join(takes)}"
            )
    for key in required:
        if entry.get(key) is None:
            raise StudyError(f"{where}: a {kind} figure needs {key!r}")
    stage = entry["stage"]
    if stage not in stages:
        raise StudyError(
            f"{where}: stage {stage!r} is not a stage of the study; stages: {', '.join(stages)}"
        )
    keys = list(stages[stage])
    y = entry["y"]
    ys = (y,) if isinstance(y, str) else y
    if not isinstance(ys, (list, tuple)) or not ys or not all(isinstance(m, str) and m for m in ys):
        raise StudyError(f"{where}.y must be a metric name or a list of them, got {y!r}")
    if len(set(ys)) != len(ys):
        raise StudyError(f"{where}.y names a metric twice: {y!r}")
    if kind in _ONE_Y and len(ys) != 1:
        raise StudyError(f"{where}: a {kind} figure takes exactly one metric in y, got {y!r}")
    coords = ("x", "hue", "rows") if kind != "scatter" else ("hue",)
    for key in coords:
        value = entry.get(key)
        if value is not None and value not in keys:
            raise StudyError(
                f"{where}.{key} {value!r} is not a coordinate key of stage {stage!r}; its "
                f"keys: {', '.join(keys)}"
            )
    if kind == "scatter":
        _text(entry["x"], f"{where}.x (a metric name)")
    used = [entry.get(k) for k in coords if entry.get(k) is not None]
    if len(set(used)) != len(used):
        raise StudyError(f"{where}: x, hue and rows must be different keys, got {used}")
    fit = entry.get("fit")
    if fit is not None and fit not in FITS:
        raise StudyError(f"{where}.fit {fit!r}: valid fits: {', '.join(FITS)}")
    for key in ("xscale", "yscale"):
        if key in entry and entry[key] not in SCALES:
            raise StudyError(f"{where}.{key} {entry[key]!r}: valid scales: {', '.join(SCALES)}")
    for key in ("xlabel", "ylabel", "title", "series"):
        if entry.get(key) is not None:
            _text(entry[key], f"{where}.{key}")
    return FigureSpec(
        name=name,
        kind=kind,
        stage=stage,
        y=tuple(ys),
        x=entry.get("x"),
        hue=entry.get("hue"),
        rows=entry.get("rows"),
        series=entry.get("series"),
        fit=fit,
        xscale=entry.get("xscale", "linear"),
        yscale=entry.get("yscale", "linear"),
        xlabel=entry.get("xlabel"),
        ylabel=entry.get("ylabel"),
        title=entry.get("title"),
        references=_references(
            [] if entry.get("references") is None else entry["references"],
            f"{where}.references",
        ),
    )


def parse_figures(raw: Any, stages: Mapping[str, Collection[str]]) -> tuple[FigureSpec, ...]:
    """The ``figures:`` list of a study file, checked against its stages.

    Args:
        raw: the list as read from YAML (``None``: no figures).
        stages: stage name -> its coordinate keys (``Study.stage_keys()``,
            :func:`lmc.studies.aggregate.stage_keys`).

    Raises:
        StudyError: naming the figure, the key and the valid values: an unknown key, kind,
            stage, coordinate key, fit or scale; a key the kind does not take or a missing one;
            a duplicate name; a bad reference. Metric names are checked once jobs ran
            (:func:`check_metrics`).
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise StudyError(f"figures must be a list of figures, got {raw!r}")
    names: set[str] = set()
    return tuple(_parse_one(entry, i, stages, names) for i, entry in enumerate(raw))


def _available(frame: pd.DataFrame | None, **where: Any) -> list[str]:
    if frame is None or not len(frame):
        return []
    keep = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        keep &= (frame[column] == value).to_numpy()
    return list(dict.fromkeys(frame.loc[keep, "metric"]))


def _stage_rows(spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame | None) -> bool:
    """Whether a done job of the figure's stage left rows in the table the figure draws."""
    table = series if spec.kind == "curve" else tidy
    return table is not None and bool(len(table)) and bool((table["stage"] == spec.stage).any())


def check_metrics(
    specs: Sequence[FigureSpec], tidy: pd.DataFrame, series: pd.DataFrame | None
) -> None:
    """Check that every metric (and a curve's series) a figure names is had by some done job
    of its stage. A figure whose stage has no done job (with rows in the table it draws) is
    not checked: it is drawn empty, with a note, beside the report's failed jobs.

    Args:
        tidy: the study's tidy table (:func:`lmc.studies.results.results`).
        series: its series (:func:`lmc.studies.aggregate.series_table`).

    Raises:
        StudyError: naming the figure and the missing metric, and listing the available ones.
    """
    for spec in specs:
        if not _stage_rows(spec, tidy, series):
            continue
        where = f"figure {spec.name!r}"
        if spec.kind == "curve":
            assert series is not None
            names = list(dict.fromkeys(series.loc[series["stage"] == spec.stage, "series"]))
            if spec.series not in names:
                raise StudyError(
                    f"{where}: no done job of stage {spec.stage!r} has the series "
                    f"{spec.series!r}; its series: {', '.join(map(str, names))}"
                )
            have = _available(series, stage=spec.stage, series=spec.series)
            what = f"series {spec.series!r} of stage {spec.stage!r}"
        else:
            have = _available(tidy, stage=spec.stage)
            what = f"stage {spec.stage!r}"
        wanted = [*spec.y, *([spec.x] if spec.kind == "scatter" else [])]
        for metric in wanted:
            if metric not in have:
                close = difflib.get_close_matches(metric, have, n=1)
                raise StudyError(
                    f"{where}: no done job of {what} has the metric {metric!r}; its metrics: "
                    f"{', '.join(have)}" + (f" (did you mean {close[0]!r}?)" if close else "")
                )


@dataclass
class RenderedFigure:
    """A drawn figure: its spec, files and, for a fitted scatter, the fit's parameters."""

    spec: FigureSpec
    png: Path
    pdf: Path
    svg: Path
    csv: Path
    fit: dict[str, float] | None
    n_points: int


# ---------------------------------------------------------------- drawing


def _key(value: Any) -> Any:
    """:func:`lmc.studies.aggregate.cell_key` (a hashable stand-in for a coordinate value)."""
    from lmc.studies.aggregate import cell_key

    return cell_key(value)


def _matches(column: pd.Series, value: Any) -> np.ndarray:
    """Where ``column`` equals ``value`` (lists compared as values, not element-wise)."""
    key = _key(value)
    return np.array([_key(v) == key for v in column], dtype=bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))


def _ordered(values: Sequence[Any]) -> list[Any]:
    """The distinct values (a list value once), numbers ascending, else in first-seen order."""
    seen: dict[Any, Any] = {}
    for v in values:
        seen.setdefault(_key(v), v)
    distinct = list(seen.values())
    if distinct and all(_is_number(v) and not math.isnan(v) for v in distinct):
        return sorted(distinct)
    return distinct


def _as_list(value: Any) -> Any:
    """A tuple-valued coordinate (a merge's members, :func:`lmc.studies.results.results`) as
    the list the study file and ``plan.json`` write."""
    return [_as_list(v) for v in value] if isinstance(value, tuple) else value


def _label(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(_as_list(value))


def _positions(values: Sequence[Any]) -> tuple[dict[Any, float], bool]:
    """Axis positions of the ``values`` (their own when all are numbers, else 0, 1, ...) and
    whether the axis is categorical."""
    order = _ordered(values)
    if all(_is_number(v) for v in order):
        return {_key(v): float(v) for v in order}, False
    return {_key(v): float(i) for i, v in enumerate(order)}, True


def _note(ax: Axes, text: str = NO_DATA) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="gray")


def _draw_references(ax: Axes, spec: FigureSpec) -> None:
    labelled: set[str] = set()
    for x, y, label in spec.references:
        ax.plot(
            [x],
            [y],
            linestyle="none",
            marker="*",
            markersize=13,
            color="black",
            label=None if label in labelled else label,
            zorder=5,
        )
        labelled.add(label)


def _frame_of(spec: FigureSpec, tidy: pd.DataFrame) -> pd.DataFrame:
    return tidy[(tidy["stage"] == spec.stage) & tidy["metric"].isin(spec.y)]


def _lines(spec: FigureSpec, summary: pd.DataFrame) -> list[tuple[str, Any, pd.DataFrame]]:
    """(metric, hue value, its rows) per line or bar group, in the order of ``spec.y`` and
    the hue values."""
    hues = _ordered(list(summary["hue"])) if spec.hue else [None]
    out = []
    for metric in spec.y:
        for hue in hues:
            keep = summary["metric"] == metric
            if spec.hue:
                keep &= _matches(summary["hue"], hue)
            out.append((metric, hue, summary[keep]))
    return out


def _line_label(spec: FigureSpec, metric: str, hue: Any) -> str:
    if spec.hue is None:
        return metric
    hue_text = f"{spec.hue.rsplit('.', 1)[-1]}={_label(hue)}"
    return hue_text if len(spec.y) == 1 else f"{metric}, {hue_text}"


def _aggregate(spec: FigureSpec, data: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per (x, hue, metric): :func:`~lmc.studies.aggregate.summarize` of ``data`` with the
    columns renamed to ``x``, ``hue``; the CSV of line, bar and curve figures."""
    from lmc.studies.aggregate import summarize

    by = [x, *([spec.hue] if spec.hue else [])]
    summary = summarize(data.drop(columns=["stage"], errors="ignore"), by)
    summary = summary.rename(columns={x: "x", **({spec.hue: "hue"} if spec.hue else {})})
    if not spec.hue:
        summary.insert(1, "hue", None)
    columns = ["x", "hue", "metric", "n", "n_nonfinite", "mean", "std", "ci_low", "ci_high"]
    return _sorted(summary[columns], spec, ("metric", "hue", "x"))


def _sorted(frame: pd.DataFrame, spec: FigureSpec, columns: Sequence[str]) -> pd.DataFrame:
    """``frame`` in the order it is drawn: metrics as ``spec.y`` lists them, coordinate values
    as :func:`_ordered` gives them."""
    ranks = {}
    for column in columns:
        order = list(spec.y) if column == "metric" else _ordered(list(frame[column]))
        rank = {_key(v): i for i, v in enumerate(order)}
        ranks[f"_{column}"] = [rank.get(_key(v), len(rank)) for v in frame[column]]
    keys = list(ranks)
    return frame.assign(**ranks).sort_values(keys, kind="stable").drop(columns=keys)


def _log_floor(low: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Interval lower bounds for a log axis: one at or below zero (a t-interval of small
    positive values) is drawn to half the line's smallest positive value instead of filling
    the axis down to 1e-14; ``nan`` where the line has no positive value."""
    values = np.concatenate([low, mean])
    positive = values[np.isfinite(values) & (values > 0)]
    floor = positive.min() / 2 if positive.size else np.nan
    return np.where(low > 0, low, np.where(np.isfinite(low), floor, low))


def _draw_lines(ax: Axes, spec: FigureSpec, summary: pd.DataFrame) -> int:
    """Mean lines with markers and interval bands; returns the number of finite points."""
    from matplotlib.ticker import NullFormatter

    where, categorical = _positions(list(summary["x"]))
    drawn = 0
    for metric, hue, rows in _lines(spec, summary):
        rows = rows.assign(_pos=[where[_key(v)] for v in rows["x"]]).sort_values("_pos")
        mean = rows["mean"].to_numpy(dtype=float)
        if not np.isfinite(mean).any():
            continue
        pos = rows["_pos"].to_numpy(dtype=float)
        (line,) = ax.plot(pos, mean, marker="o", markersize=4, label=_line_label(spec, metric, hue))
        low, high = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
        if spec.yscale == "log":
            low = _log_floor(low, mean)
        has_ci = np.isfinite(low) & np.isfinite(high)
        if has_ci.any():
            ax.fill_between(pos, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            # a band needs two neighbours with intervals: a lone interval is an error bar
            padded = np.concatenate([[False], has_ci, [False]])
            lone = has_ci & ~padded[:-2] & ~padded[2:]
            if lone.any():
                ax.errorbar(
                    pos[lone],
                    mean[lone],
                    yerr=[mean[lone] - low[lone], high[lone] - mean[lone]],
                    fmt="none",
                    ecolor=line.get_color(),
                    capsize=3,
                    alpha=0.6,
                )
        drawn += int(np.isfinite(mean).sum())
    order = _ordered(list(summary["x"]))
    if categorical or (spec.kind == "line" and 0 < len(order) <= MAX_TICKS):
        # the grid's values as ticks, plainly labelled (no 4 x 10^0 on a log axis)
        ax.set_xticks([where[_key(v)] for v in order], [_label(v) for v in order])
        ax.xaxis.set_minor_formatter(NullFormatter())
    return drawn


def _line(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    summary = _aggregate(spec, _frame_of(spec, tidy), spec.x)  # type: ignore[arg-type]
    return summary, _draw_lines(ax, spec, summary), None


def _curve(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    data = series[
        (series["stage"] == spec.stage)
        & (series["series"] == spec.series)
        & series["metric"].isin(spec.y)
    ]
    axis = str(data["axis"].iloc[0]) if len(data) else "x"
    data = data.drop(columns=["series", "axis"]).rename(columns={"x": "_x"})
    summary = _aggregate(spec, data, "_x")
    ax.set_xlabel(spec.xlabel or axis)
    return summary, _draw_lines(ax, spec, summary), None


def _bar(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    summary = _aggregate(spec, _frame_of(spec, tidy), spec.x)  # type: ignore[arg-type]
    order = _ordered(list(summary["x"]))
    index = {_key(v): i for i, v in enumerate(order)}
    groups = _lines(spec, summary)
    width = 0.8 / max(len(groups), 1)
    drawn = 0
    for g, (metric, hue, rows) in enumerate(groups):
        rows = rows[np.isfinite(rows["mean"].to_numpy(dtype=float))]
        if not len(rows):
            continue
        pos = np.array([index[_key(v)] for v in rows["x"]], dtype=float)
        mean = rows["mean"].to_numpy(dtype=float)
        low = mean - rows["ci_low"].to_numpy(dtype=float)
        high = rows["ci_high"].to_numpy(dtype=float) - mean
        has_ci = np.isfinite(low).any()  # no error bar where n < 2
        ax.bar(
            pos - 0.4 + width * (g + 0.5),
            mean,
            width,
            yerr=[np.nan_to_num(low), np.nan_to_num(high)] if has_ci else None,
            capsize=3,
            label=_line_label(spec, metric, hue),
        )
        drawn += len(rows)
    ax.set_xticks(range(len(order)), [_label(v) for v in order])
    return summary, drawn, None


def _scatter(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    import pandas as pd

    x_metric, y_metric = spec.x, spec.y[0]
    data = tidy[(tidy["stage"] == spec.stage) & tidy["metric"].isin([x_metric, y_metric])]
    jobs = list(dict.fromkeys(data["job"]))
    first = data.drop_duplicates("job").set_index("job")
    rows = []
    for job in jobs:
        values = data[data["job"] == job]
        get = dict(zip(values["metric"], pd.to_numeric(values["value"], errors="coerce")))
        rows.append(
            {
                "job": job,
                "hue": first.at[job, spec.hue] if spec.hue else None,
                "x": float(get.get(x_metric, math.nan)),
                "y": float(get.get(y_metric, math.nan)),
            }
        )
    points = pd.DataFrame(rows, columns=["job", "hue", "x", "y"])
    finite = np.isfinite(points["x"].to_numpy(dtype=float)) & np.isfinite(
        points["y"].to_numpy(dtype=float)
    )
    left_out = int((~finite).sum())
    points = points[finite]
    hues = _ordered(list(points["hue"])) if spec.hue else [None]
    for hue in hues:
        part = points[_matches(points["hue"], hue)] if spec.hue else points
        label = f"{spec.hue.rsplit('.', 1)[-1]}={_label(hue)}" if spec.hue else None
        ax.scatter(part["x"], part["y"], s=18, label=label)
    fit = None
    if spec.fit is not None and len(points):
        fit = FITS[spec.fit](points["x"], points["y"])
        if fit is not None:
            lo, hi = float(points["x"].min()), float(points["x"].max())
            grid = (
                np.geomspace(lo, hi, 200)
                if spec.xscale == "log" and lo > 0
                else np.linspace(lo, hi, 200)
            )
            ax.plot(
                grid,
                FIT_CURVES[spec.fit](fit, grid),
                "k--",
                linewidth=1,
                label=FIT_LABELS[spec.fit](fit),
            )
    if left_out and len(points):
        ax.text(
            0.01, 0.01, f"{left_out} job(s) with non-finite values not shown",
            transform=ax.transAxes, fontsize=7, color="gray",
        )  # fmt: skip
    return points, len(points), fit


def _heatmap(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    from lmc.studies.aggregate import summarize

    data = _frame_of(spec, tidy).drop(columns=["stage"], errors="ignore")
    summary = summarize(data, [spec.x, spec.rows])  # type: ignore[list-item]
    summary = summary.rename(columns={spec.x: "x", spec.rows: "row"})
    columns = ["x", "row", "metric", "n", "n_nonfinite", "mean", "std", "ci_low", "ci_high"]
    summary = _sorted(summary[columns], spec, ("row", "x"))
    cols, rows = _ordered(list(summary["x"])), _ordered(list(summary["row"]))
    col_of = {_key(v): i for i, v in enumerate(cols)}
    row_of = {_key(v): i for i, v in enumerate(rows)}
    grid = np.full((len(rows), len(cols)), math.nan)
    for x, row, mean in zip(summary["x"], summary["row"], summary["mean"]):
        grid[row_of[_key(row)], col_of[_key(x)]] = mean
    finite = np.isfinite(grid)
    if finite.any():
        image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", origin="lower")
        ax.figure.colorbar(image, ax=ax, label=spec.y[0])
        middle = (np.nanmin(grid) + np.nanmax(grid)) / 2
        for (r, c), value in np.ndenumerate(grid):
            text = f"{value:.3g}" if math.isfinite(value) else "n/a"
            colour = "black" if math.isfinite(value) and value > middle else "white"
            ax.text(c, r, text, ha="center", va="center", fontsize=8, color=colour)
        ax.set_facecolor("lightgray")
    ax.set_xticks(range(len(cols)), [_label(v) for v in cols])
    ax.set_yticks(range(len(rows)), [_label(v) for v in rows])
    ax.set_ylabel(spec.ylabel or spec.rows)
    return summary, int(finite.sum()), None


_DRAW: dict[str, Callable[..., Any]] = {
    "line": _line,
    "bar": _bar,
    "scatter": _scatter,
    "curve": _curve,
    "heatmap": _heatmap,
}


# no date in the files, so a figure redrawn from the same results is the same file
SAVED = {"png": {}, "pdf": {"CreationDate": None}, "svg": {"Date": None}}


def _save(fig: Figure, path: Path, salt: str) -> Path:
    """Save ``fig`` atomically in the format of ``path``'s suffix; SVG ids are salted with the
    figure's name, so several SVGs inlined into one page never share an id."""
    from matplotlib import rc_context

    fmt = path.suffix.lstrip(".")
    with rc_context({"svg.hashsalt": salt}), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=PNG_DPI, metadata=SAVED[fmt])
    return path


def _figure(spec: FigureSpec) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4) if spec.kind != "heatmap" else (6.4, 4.8))
    return fig, fig.subplots()


def render_figure(
    spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame | None, out_dir: str | Path
) -> RenderedFigure:
    """Draw ``spec`` from the tables and save ``<out_dir>/<name>.png`` (150 dpi), ``.pdf``,
    ``.svg`` and ``.csv`` (the plotted data: per ``x``, ``hue`` (or ``row``) and ``metric``,
    ``n``, ``n_nonfinite``, ``mean``, ``std``, ``ci_low``, ``ci_high``; a scatter's per-job
    points ``job``, ``hue``, ``x``, ``y``). Non-finite values are left out of the means (and
    counted in the CSV); a figure without a finite value shows a note. Files are written
    atomically; the figure is built without pyplot, so nothing stays open."""
    out_dir = Path(out_dir)
    if series is None:
        import pandas as pd

        series = pd.DataFrame(columns=["stage", "job", "series", "axis", "x", "metric", "value"])
    fig, ax = _figure(spec)
    if spec.kind != "heatmap":  # before drawing, so the drawers' ticks stay
        ax.set_xscale(spec.xscale)
        ax.set_yscale(spec.yscale)
    data, n_points, fit = _DRAW[spec.kind](ax, spec, tidy, series)
    if n_points == 0:
        _note(ax, NO_DATA if _stage_rows(spec, tidy, series) else NO_JOB.format(spec.stage))
    if spec.references:
        _draw_references(ax, spec)
    if spec.kind != "heatmap":
        ax.grid(alpha=0.3)
        if spec.kind != "curve":  # a curve's x label is its series' axis
            ax.set_xlabel(spec.xlabel or spec.x)
        ax.set_ylabel(spec.ylabel or (spec.y[0] if len(spec.y) == 1 else "value"))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    else:
        ax.set_xlabel(spec.xlabel or spec.x)
    ax.set_title(spec.title or spec.name, fontsize=10)
    fig.tight_layout()
    paths = {suffix: _save(fig, out_dir / f"{spec.name}.{suffix}", spec.name) for suffix in SAVED}
    csv = out_dir / f"{spec.name}.csv"
    with atomic_path(csv) as tmp:
        data.apply(lambda column: column.map(_as_list)).to_csv(tmp, index=False)
    return RenderedFigure(
        spec, paths["png"], paths["pdf"], paths["svg"], csv, fit=fit, n_points=n_points
    )


def render_figures(
    specs: Sequence[FigureSpec],
    root: str | Path | None,
    out_dir: str | Path,
    tidy: pd.DataFrame | None = None,
    series: pd.DataFrame | None = None,
) -> list[RenderedFigure]:
    """Check the figures' metrics (:func:`check_metrics`), then draw each into ``out_dir``
    (:func:`render_figure`).

    Args:
        root: the study folder whose tables are drawn (the tidy table and its series), or
            ``None`` to draw only the tables given.
        tidy: the tidy table to draw instead of ``root``'s (tests, other sources).
        series: the series table to draw instead of ``root``'s (none: no curve figure).

    Raises:
        StudyError: a figure names a metric or series no done job of its stage has, before
            anything is drawn.
    """
    if not specs:
        return []
    if root is not None:
        from lmc.studies.aggregate import series_table
        from lmc.studies.results import results

        tidy = results(root) if tidy is None else tidy
        series = series_table(root) if series is None else series
    elif tidy is None:
        raise ValueError("render_figures needs a study folder or the tidy table")
    check_metrics(specs, tidy, series)
    return [render_figure(spec, tidy, series, out_dir) for spec in specs]
