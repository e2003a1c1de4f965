"""A study's figures as declared: the ``figures:`` entries of a study file parsed and checked
when it is read (:func:`parse_figures`), and against the done jobs' metrics before drawing
(:func:`check_metrics`); the fits a scatter figure may draw. :mod:`lmc.studies.reporting.figures` draws
them.

Kinds: ``line`` (a metric's mean over replicates vs a coordinate, 95 % t-interval band),
``bar`` (the same as grouped bars with interval error bars), ``scatter`` (one point per done
job: a metric vs another, optionally fitted by ``y = exp(a x + b)``, the form of 000's
``L = e^{aH+b}``), ``curve`` (a series of the jobs' ``summary.json``, e.g. the loss along the
matched interpolation path, mean and interval across jobs) and ``heatmap`` (a metric's mean over
two coordinates).

The study file parser imports this module, so pandas is imported only where a figure is
checked against results or drawn.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from lmc.studies.spec.schema import NAME_PATTERN, StudyError

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class FigureKind:
    """A kind of report figure, in one place: the keys its study-file entry needs and may
    take, whether it plots one y only, and its renderers, registered by the modules that draw:
    ``matplotlib`` (:mod:`lmc.studies.reporting.figures`: the report's PNG/PDF/SVG) and ``wandb``
    (:mod:`lmc.studies.reporting.wandb_spec`: the W&B Report panel). What sets a kind apart is
    declared on it: ``x_metric`` (its ``x`` is a metric the stage reports, not a coordinate),
    ``draws_series`` (drawn from the stage's series, whose axis labels its x), ``axes`` (x and y
    axes with scales, a grid and labels), ``grid_ticks`` (the grid's values as its x ticks),
    ``wandb_hue`` (its W&B panel draws ``hue``) and ``figsize``."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    one_y: bool = False
    x_metric: bool = False
    draws_series: bool = False
    axes: bool = True
    grid_ticks: bool = False
    wandb_hue: bool = False
    figsize: tuple[float, float] = (6.4, 4.4)
    renderers: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def render(self, to: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` as this kind's renderer ``to``; returns ``fn`` (a decorator's use)."""
        self.renderers[to] = fn
        return fn

    def renderer(self, to: str) -> Callable[..., Any]:
        """The renderer ``to`` of this kind (its module imported)."""
        if to not in self.renderers:
            import importlib

            importlib.import_module(RENDERER_MODULES[to])
        return self.renderers[to]


#: renderer name -> the module that registers it for every kind
RENDERER_MODULES = {
    "matplotlib": "lmc.studies.reporting.figures",
    "wandb": "lmc.studies.reporting.wandb_spec",
}
#: kind name -> :class:`FigureKind`; a new kind is one entry here and one renderer per module
FIGURE_KINDS: dict[str, FigureKind] = {
    k.name: k
    for k in (
        FigureKind("line", ("x",), ("hue", "xscale", "yscale", "references"), grid_ticks=True),
        FigureKind("bar", ("x",), ("hue", "yscale")),
        FigureKind("scatter", ("x",), ("hue", "fit", "xscale", "yscale", "references"), True, True),
        FigureKind(
            "curve",
            ("series",),
            ("hue", "xscale", "yscale", "references"),
            draws_series=True,
            wandb_hue=True,
        ),
        FigureKind("heatmap", ("x", "rows"), (), True, axes=False, figsize=(6.4, 4.8)),
    )
}
SCALES = ("linear", "log")
PNG_DPI = 150
MAX_TICKS = 12  # a line figure with at most this many x values gets them as its ticks
NO_DATA = "no finite values"
NO_JOB = "no done job of stage {!r}"


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a study's report (see the module docstring and the study file layout in
    :mod:`lmc.studies.spec.schema`)."""

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
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
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
    required, optional = FIGURE_KINDS[kind].required, FIGURE_KINDS[kind].optional
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
    if FIGURE_KINDS[kind].one_y and len(ys) != 1:
        raise StudyError(f"{where}: a {kind} figure takes exactly one metric in y, got {y!r}")
    coords = ("x", "hue", "rows") if not FIGURE_KINDS[kind].x_metric else ("hue",)
    for key in coords:
        value = entry.get(key)
        if value is not None and value not in keys:
            raise StudyError(
                f"{where}.{key} {value!r} is not a coordinate key of stage {stage!r}; its "
                f"keys: {', '.join(keys)}"
            )
    if FIGURE_KINDS[kind].x_metric:
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
            :func:`lmc.studies.reporting.aggregate.stage_keys`).

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


def stage_has_rows(spec: FigureSpec, tidy: pd.DataFrame, series: pd.DataFrame | None) -> bool:
    """Whether a done job of the figure's stage left rows in the table the figure draws."""
    table = series if FIGURE_KINDS[spec.kind].draws_series else tidy
    return table is not None and bool(len(table)) and bool((table["stage"] == spec.stage).any())


def check_metrics(
    specs: Sequence[FigureSpec], tidy: pd.DataFrame, series: pd.DataFrame | None
) -> None:
    """Check that every metric (and a curve's series) a figure names is had by some done job
    of its stage. A figure whose stage has no done job (with rows in the table it draws) is
    not checked: it is drawn empty, with a note, beside the report's failed jobs.

    Args:
        tidy: the study's tidy table (:func:`lmc.studies.reporting.results.results`).
        series: its series (:func:`lmc.studies.reporting.aggregate.series_table`).

    Raises:
        StudyError: naming the figure and the missing metric, and listing the available ones.
    """
    for spec in specs:
        if not stage_has_rows(spec, tidy, series):
            continue
        where = f"figure {spec.name!r}"
        if FIGURE_KINDS[spec.kind].draws_series:
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
        wanted = list(spec.y)
        if FIGURE_KINDS[spec.kind].x_metric:
            assert spec.x is not None  # a kind whose x is a metric requires x
            wanted.append(spec.x)
        for metric in wanted:
            if metric not in have:
                close = difflib.get_close_matches(metric, have, n=1)
                raise StudyError(
                    f"{where}: no done job of {what} has the metric {metric!r}; its metrics: "
                    f"{', '.join(have)}" + (f" (did you mean {close[0]!r}?)" if close else "")
                )
