"""A study's figures drawn: from the study folder's tables (:mod:`lmc.studies.reporting.aggregate`)
into PNG, PDF, SVG and the CSV of exactly the plotted data (:func:`render_figures`), each kind
of :mod:`lmc.studies.reporting.figure_spec` as it declares it. pandas and matplotlib are imported here
only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmc.io import atomic_path
from lmc.studies.reporting.figure_spec import (
    FIGURE_KINDS,
    FIT_CURVES,
    FIT_LABELS,
    FITS,
    MAX_TICKS,
    NO_DATA,
    NO_JOB,
    PNG_DPI,
    FigureSpec,
    check_metrics,
    stage_has_rows,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


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
    """:func:`lmc.studies.reporting.aggregate.cell_key` (a hashable stand-in for a coordinate value)."""
    from lmc.studies.reporting.aggregate import cell_key

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
    """A tuple-valued coordinate (a merge's members, :func:`lmc.studies.reporting.results.results`) as
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
    """Per (x, hue, metric): :func:`~lmc.studies.reporting.aggregate.summarize` of ``data`` with the
    columns renamed to ``x``, ``hue``; the CSV of line, bar and curve figures."""
    from lmc.studies.reporting.aggregate import summarize

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
    if categorical or (FIGURE_KINDS[spec.kind].grid_ticks and 0 < len(order) <= MAX_TICKS):
        # the grid's values as ticks, plainly labelled (no 4 x 10^0 on a log axis)
        ax.set_xticks([where[_key(v)] for v in order], [_label(v) for v in order])
        ax.xaxis.set_minor_formatter(NullFormatter())
    return drawn


def _line(ax: Axes, spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame) -> Any:
    assert spec.x is not None  # a line figure requires x
    summary = _aggregate(spec, _frame_of(spec, tidy), spec.x)
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
    assert spec.x is not None  # a bar figure requires x
    summary = _aggregate(spec, _frame_of(spec, tidy), spec.x)
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
    from lmc.studies.reporting.aggregate import summarize

    assert spec.x is not None and spec.rows is not None  # a heatmap requires x and rows
    data = _frame_of(spec, tidy).drop(columns=["stage"], errors="ignore")
    summary = summarize(data, [spec.x, spec.rows])
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
    ax.set_ylabel(spec.ylabel or spec.rows or "")
    return summary, int(finite.sum()), None


for _kind, _draw in (
    ("line", _line),
    ("bar", _bar),
    ("scatter", _scatter),
    ("curve", _curve),
    ("heatmap", _heatmap),
):
    FIGURE_KINDS[_kind].render("matplotlib", _draw)


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

    fig = Figure(figsize=FIGURE_KINDS[spec.kind].figsize)
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
    kind = FIGURE_KINDS[spec.kind]
    if kind.axes:  # before drawing, so the drawers' ticks stay
        ax.set_xscale(spec.xscale)
        ax.set_yscale(spec.yscale)
    data, n_points, fit = kind.renderer("matplotlib")(ax, spec, tidy, series)
    if n_points == 0:
        _note(ax, NO_DATA if stage_has_rows(spec, tidy, series) else NO_JOB.format(spec.stage))
    if spec.references:
        _draw_references(ax, spec)
    if kind.axes:
        ax.grid(alpha=0.3)
        if not kind.draws_series:  # a series' x label is its axis
            ax.set_xlabel(spec.xlabel or spec.x or "")
        ax.set_ylabel(spec.ylabel or (spec.y[0] if len(spec.y) == 1 else "value"))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    else:
        ax.set_xlabel(spec.xlabel or spec.x or "")
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
        from lmc.studies.reporting.aggregate import series_table
        from lmc.studies.reporting.results import results

        tidy = results(root) if tidy is None else tidy
        series = series_table(root) if series is None else series
    elif tidy is None:
        raise ValueError("render_figures needs a study folder or the tidy table")
    check_metrics(specs, tidy, series)
    return [render_figure(spec, tidy, series, out_dir) for spec in specs]
