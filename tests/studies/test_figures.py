"""A study's figures: the ``figures:`` entries checked key by key, metrics checked against the
done jobs before drawing, and each kind drawn into PNG, PDF, SVG and the CSV of exactly what it
plots (means and t-intervals checked by hand; an exponential fit recovers its parameters)."""

from __future__ import annotations

import copy
import math
import xml.etree.ElementTree as ET

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from lmc.studies import StudyError
from lmc.studies.reporting.aggregate import series_table, stage_keys
from lmc.studies.reporting.figure_spec import FigureSpec, check_metrics, fit_exp, parse_figures
from lmc.studies.reporting.figures import render_figures
from lmc.studies.reporting.results import results
from tests.studies.conftest import WIDTH

EXAMPLE = """
figures:
  - name: barrier_vs_width
    kind: line
    stage: barrier
    x: model.init_args.net.init_args.width
    y: [barrier_loss_matched, barrier_loss_naive]
    xscale: log
    xlabel: student width (neurons)
    ylabel: loss barrier (0.5 MSE)
    references: [{x: 4, y: 0.0, label: "003: 0 at the teacher width"}]
"""
STAGES = {"train": [WIDTH, "seed_everything"], "barrier": [WIDTH, "seed_everything"]}
LINE = yaml.safe_load(EXAMPLE)["figures"][0]
HEATMAP = {"name": "h", "kind": "heatmap", "stage": "train", "x": WIDTH, "rows": "seed_everything",
           "y": ["train/loss"]}  # fmt: skip
CURVE = {"name": "c", "kind": "curve", "stage": "barrier", "series": "matched", "y": ["test/loss"]}
SCATTER = {"name": "s", "kind": "scatter", "stage": "train", "x": "train/loss", "y": "test/loss"}


def test_the_example_parses():
    (spec,) = parse_figures(yaml.safe_load(EXAMPLE)["figures"], STAGES)
    assert spec == FigureSpec(
        name="barrier_vs_width",
        kind="line",
        stage="barrier",
        y=("barrier_loss_matched", "barrier_loss_naive"),
        x=WIDTH,
        xscale="log",
        xlabel="student width (neurons)",
        ylabel="loss barrier (0.5 MSE)",
        references=((4.0, 0.0, "003: 0 at the teacher width"),),
    )
    specs = parse_figures([HEATMAP, CURVE, {**SCATTER, "fit": "exp", "hue": WIDTH}], STAGES)
    assert [s.kind for s in specs] == ["heatmap", "curve", "scatter"]
    assert specs[2].y == ("test/loss",) and specs[2].fit == "exp"
    assert parse_figures(None, STAGES) == ()


def _with(base, **changes):
    entry = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    return [entry]


BAD = [
    ({"name": "x"}, "figures must be a list of figures"),
    (["line"], r"figures\[0\] must be a mapping"),
    (_with(LINE, colour="red"), r"unknown key 'colour' in figures\[0\]; valid keys: name, kind"),
    (_with(LINE, y=None), r"figures\[0\] needs the key 'y'"),
    (_with(LINE, name="a/b"), "folder-safe file name"),
    (_with(LINE) * 2, "'barrier_vs_width' is used twice"),
    (_with(LINE, kind="pie"), "unknown kind 'pie'; valid kinds: line, bar, scatter, curve, heatmap"),
    (_with(LINE, stage="merge"), "stage 'merge' is not a stage of the study; stages: train, barrier"),
    (_with(LINE, x="depth"), f"x 'depth' is not a coordinate key of stage 'barrier'; its keys: {WIDTH}"),
    (_with(LINE, hue="depth"), "hue 'depth' is not a coordinate key"),
    (_with(LINE, hue=WIDTH), "x, hue and rows must be different keys"),
    (_with(LINE, rows="seed_everything"), "a line figure takes no 'rows'; its keys: name"),
    (_with(LINE, x=None), "a line figure needs 'x'"),
    (_with(LINE, kind="bar", xscale=None, references=None, fit="exp"), "a bar figure takes no 'fit'"),
    (_with(HEATMAP, series="naive"), "a heatmap figure takes no 'series'"),
    (_with(HEATMAP, rows=None), "a heatmap figure needs 'rows'"),
    (_with(HEATMAP, y=["a", "b"]), "a heatmap figure takes exactly one metric in y"),
    (_with(CURVE, x=WIDTH), "a curve figure takes no 'x'"),
    (_with(CURVE, series=None), "a curve figure needs 'series'"),
    (_with(SCATTER, y=["a", "b"]), "a scatter figure takes exactly one metric in y"),
    (_with(SCATTER, fit="poly"), "fit 'poly': valid fits: exp"),
    (_with(LINE, y=[]), "y must be a metric name or a list of them"),
    (_with(LINE, y=["a", "a"]), "y names a metric twice"),
    (_with(LINE, xscale="symlog"), "xscale 'symlog': valid scales: linear, log"),
    (_with(LINE, title=3), "title must be a non-empty string"),
    (_with(LINE, references={"x": 1}), "references must be a list"),
    (_with(LINE, references=[{"x": 1, "y": 2}]), r"references\[0\] must be a mapping with exactly the keys x, y, label"),
    (_with(LINE, references=[{"x": 1, "y": "high", "label": "a"}]), r"references\[0\].y must be a finite number"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_bad_figures_are_refused_naming_the_figure_and_the_valid_values(raw, message):
    with pytest.raises(StudyError, match=message):
        parse_figures(raw, STAGES)


def test_errors_name_the_figure():
    with pytest.raises(StudyError, match="^figure 'barrier_vs_width': a line figure takes no"):
        parse_figures(_with(LINE, fit="exp"), STAGES)


# ------------------------------------------------------------ on the tiny study's results


@pytest.fixture(scope="module")
def tables(tiny_run):
    _, root = tiny_run
    return results(root), series_table(root)


def test_check_metrics_lists_the_available_ones(tables):
    tidy, series = tables
    specs = parse_figures([LINE, HEATMAP, CURVE, SCATTER], STAGES)
    assert check_metrics(specs, tidy, series) is None
    bad = parse_figures(_with(LINE, y=["barrier_loss_matchd"]), STAGES)
    with pytest.raises(StudyError) as err:
        check_metrics(bad, tidy, series)
    message = str(err.value)
    assert message.startswith(
        "figure 'barrier_vs_width': no done job of stage 'barrier' has the metric "
        "'barrier_loss_matchd'; its metrics: "
    )
    assert "barrier_loss_matched" in message and "test/mse" not in message  # train's only
    assert message.endswith("(did you mean 'barrier_loss_matched'?)")
    with pytest.raises(StudyError, match="has the series 'aligned'; its series: naive, matched"):
        check_metrics(parse_figures(_with(CURVE, series="aligned"), STAGES), tidy, series)
    with pytest.raises(StudyError, match="series 'matched' of stage 'barrier' has the metric 'x/"):
        check_metrics(parse_figures(_with(CURVE, y=["x/loss"]), STAGES), tidy, series)
    with pytest.raises(StudyError, match="has the metric 'val/los'"):
        check_metrics(parse_figures(_with(SCATTER, x="val/los"), STAGES), tidy, series)
    # a stage without a done job: nothing to check against (the figure is drawn empty)
    assert check_metrics(bad, tidy[tidy.stage == "train"], series.iloc[:0]) is None
    assert check_metrics(parse_figures(_with(CURVE, series="x"), STAGES), tidy, None) is None


def test_a_bad_metric_fails_before_anything_is_drawn(tiny_run, tmp_path):
    _, root = tiny_run
    specs = parse_figures([HEATMAP, *_with(LINE, y=["nope"])], stage_keys(root))
    with pytest.raises(StudyError, match="'nope'"):
        render_figures(specs, root, tmp_path / "figures")
    assert not (tmp_path / "figures").exists()


def _check_files(fig):
    for path in (fig.png, fig.pdf, fig.svg, fig.csv):
        assert path.is_file() and path.stat().st_size > 0, path
        assert path.stem == fig.spec.name
    assert fig.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.pdf.read_bytes()[:5] == b"%PDF-"
    root = ET.parse(fig.svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_render_figures_of_a_study(tiny_run, tables, tmp_path):
    _, root = tiny_run
    tidy, series = tables
    raw = [
        LINE,
        {"name": "test_loss", "kind": "line", "stage": "train", "x": WIDTH, "y": ["test/loss"]},
        {**CURVE, "hue": WIDTH},
        HEATMAP,
        {"name": "bars", "kind": "bar", "stage": "train", "x": WIDTH, "y": ["test/loss"],
         "hue": "seed_everything"},
    ]  # fmt: skip
    before = plt.get_fignums()
    figures = render_figures(parse_figures(raw, stage_keys(root)), root, tmp_path)
    assert plt.get_fignums() == before  # nothing left open
    assert [f.spec.name for f in figures] == [e["name"] for e in raw]
    for fig in figures:
        _check_files(fig)
        assert fig.fit is None
    line, train, curve, heat, bars = figures

    # the barrier per width: one pair of seeds per width, so n = 1 and no interval
    data = pd.read_csv(line.csv)
    assert data.columns.tolist() == [
        "x", "hue", "metric", "n", "n_nonfinite", "mean", "std", "ci_low", "ci_high"
    ]  # fmt: skip
    assert data.metric.tolist() == ["barrier_loss_matched"] * 2 + ["barrier_loss_naive"] * 2
    assert data.x.tolist() == [4, 8, 4, 8] and (data.n == 1).all()
    want = tidy[(tidy.stage == "barrier") & (tidy.metric == "barrier_loss_naive")]
    want = want[want[WIDTH] == 8].value.item()
    assert data[(data.metric == "barrier_loss_naive") & (data.x == 8)]["mean"].item() == want
    assert line.n_points == 4

    # test loss per width over the two seeds: mean and t-interval by hand
    data = pd.read_csv(train.csv)
    values = tidy[(tidy.stage == "train") & (tidy.metric == "test/loss") & (tidy[WIDTH] == 4)]
    a, b = values.value.tolist()
    half = stats.t.ppf(0.975, 1) * (abs(a - b) / math.sqrt(2)) / math.sqrt(2)
    cell = data[data.x == 4].iloc[0]
    assert cell.n == 2 and cell["mean"] == pytest.approx((a + b) / 2, rel=1e-12)
    assert (cell.ci_low, cell.ci_high) == pytest.approx(((a + b) / 2 - half, (a + b) / 2 + half))

    # the matched path of each width, along alpha
    data = pd.read_csv(curve.csv)
    assert data.x.tolist() == [0.0, 0.5, 1.0] * 2 and data.hue.tolist() == [4] * 3 + [8] * 3
    path = series[(series.series == "matched") & (series.metric == "test/loss")]
    mid = path[(path[WIDTH] == 8) & (path.x == 0.5)].value.item()
    assert data[(data.hue == 8) & (data.x == 0.5)]["mean"].item() == pytest.approx(mid)
    assert curve.n_points == 6

    # the heatmap: one training per cell
    data = pd.read_csv(heat.csv)
    assert data.columns.tolist()[:3] == ["x", "row", "metric"] and (data.n == 1).all()
    job = tidy[(tidy.stage == "train") & (tidy.metric == "train/loss")]
    job = job[(job[WIDTH] == 8) & (job.seed_everything == 1)].value.item()
    assert data[(data.x == 8) & (data.row == 1)]["mean"].item() == pytest.approx(job)
    assert heat.n_points == 4

    data = pd.read_csv(bars.csv)
    assert len(data) == 4 and (data.n == 1).all() and bars.n_points == 4


def _synthetic(h, loss, hue=None):
    """A tidy table of one stage: job i has metrics h[i] and L = loss[i]."""
    rows = []
    for i, (x, y) in enumerate(zip(h, loss)):
        group = hue[i] if hue is not None else 0
        rows.append({"stage": "s", "job": f"j{i}", "g": group, "metric": "h", "value": x})
        rows.append({"stage": "s", "job": f"j{i}", "g": group, "metric": "L", "value": y})
    return pd.DataFrame(rows)


def test_scatter_fit_recovers_an_exponential(tmp_path):
    h = np.linspace(0.0, 2.0, 7)
    loss = np.exp(2 * h + 1)
    # diverged jobs: left out of the plot and the fit
    tidy = _synthetic([*h, 1.0, 1.5], [*loss, math.nan, math.inf], hue=[0, 1] * 4 + [0])
    raw = [{"name": "law", "kind": "scatter", "stage": "s", "x": "h", "y": ["L"], "hue": "g",
            "fit": "exp", "yscale": "log", "references": [{"x": 0, "y": 2.7, "label": "e"}]}]  # fmt: skip
    (fig,) = render_figures(parse_figures(raw, {"s": ["g"]}), None, tmp_path, tidy=tidy)
    _check_files(fig)
    assert fig.fit == pytest.approx({"a": 2.0, "b": 1.0, "r2": 1.0}, abs=1e-6)
    assert fig.n_points == 7
    data = pd.read_csv(fig.csv)
    assert data.columns.tolist() == ["job", "hue", "x", "y"]
    assert data.job.tolist() == [f"j{i}" for i in range(7)]
    assert data.y.to_numpy() == pytest.approx(loss) and data.x.to_numpy() == pytest.approx(h)


def test_fit_exp_known_answers():
    x = np.array([0.0, 1.0, 2.0, 3.0])
    noisy = np.exp(-0.5 * x + 0.25) * np.array([1.1, 0.9, 1.05, 0.95])
    fit = fit_exp(x, noisy)
    a, b = np.polyfit(x, np.log(noisy), 1)
    assert (fit["a"], fit["b"]) == pytest.approx((a, b))
    assert 0.9 < fit["r2"] < 1.0
    assert fit_exp([1.0, 1.0], [2.0, 3.0]) is None  # one x: no line
    assert fit_exp([0.0, 1.0, 2.0], [1.0, -1.0, 0.0]) is None  # one positive y


def test_a_stage_without_done_jobs_is_drawn_empty(tables, tmp_path):
    tidy, series = tables
    tidy, series = tidy[tidy.stage == "train"], series.iloc[:0]  # every barrier job failed
    specs = parse_figures([LINE, CURVE], STAGES)
    figures = render_figures(specs, None, tmp_path, tidy=tidy, series=series)
    for fig in figures:
        _check_files(fig)
        assert fig.n_points == 0 and pd.read_csv(fig.csv).empty


def test_a_figure_without_finite_values_is_drawn_empty(tmp_path):
    tidy = _synthetic([1.0, 2.0], [math.nan, math.nan])
    raw = [
        {"name": "empty_line", "kind": "line", "stage": "s", "x": "g", "y": ["L"]},
        {"name": "empty_bar", "kind": "bar", "stage": "s", "x": "g", "y": ["L"]},
        {"name": "empty_scatter", "kind": "scatter", "stage": "s", "x": "h", "y": ["L"],
         "fit": "exp"},
        {"name": "empty_heatmap", "kind": "heatmap", "stage": "s", "x": "g", "rows": "k",
         "y": ["L"]},
    ]  # fmt: skip
    tidy["k"] = "a"
    figures = render_figures(parse_figures(raw, {"s": ["g", "k"]}), None, tmp_path, tidy=tidy)
    for fig in figures:
        _check_files(fig)
        assert fig.n_points == 0 and fig.fit is None
    line = pd.read_csv(figures[0].csv)
    assert (line.n.tolist(), line.n_nonfinite.tolist()) == ([0], [2])
    assert line["mean"].isna().all()
    assert pd.read_csv(figures[2].csv).empty


@pytest.mark.parametrize("group", [list, tuple], ids=["lists", "tuples as results() gives"])
def test_categorical_and_list_valued_coordinates(group, tmp_path):
    # merge-like rows: the coordinate is a list of seeds, the hue a method name
    tidy = pd.DataFrame(
        {
            "stage": "merge",
            "job": list("abcd"),
            "group": [group(g) for g in ([0, 1], [0, 1], [0, 1, 2], [0, 1, 2])],
            "method": ["weight", "naive"] * 2,
            "metric": "loss",
            "value": [1.0, 2.0, 3.0, 4.0],
        }
    )
    raw = [
        {"name": "merges", "kind": "line", "stage": "merge", "x": "group", "y": ["loss"],
         "hue": "method"},
        {"name": "by_method", "kind": "bar", "stage": "merge", "x": "method", "y": ["loss"],
         "hue": "group"},
    ]  # fmt: skip
    specs = parse_figures(raw, {"merge": ["group", "method"]})
    line, bar = render_figures(specs, None, tmp_path, tidy=tidy)
    data = pd.read_csv(line.csv)
    assert data.x.tolist() == ["[0, 1]", "[0, 1, 2]"] * 2
    assert data.hue.tolist() == ["weight", "weight", "naive", "naive"]
    assert data["mean"].tolist() == [1.0, 3.0, 2.0, 4.0] and line.n_points == 4
    data = pd.read_csv(bar.csv)
    assert data.hue.tolist() == ["[0, 1]", "[0, 1]", "[0, 1, 2]", "[0, 1, 2]"]
    assert data["mean"].tolist() == [1.0, 2.0, 3.0, 4.0] and bar.n_points == 4


def test_a_redrawn_figure_is_the_same_file(tmp_path):
    tidy = pd.DataFrame(
        {"stage": "s", "job": list("abcd"), "h": [1, 1, 2, 2], "metric": "L",
         "value": [2.0, 2.5, 4.0, 4.5]}
    )  # fmt: skip
    specs = parse_figures(
        [{"name": "f", "kind": "line", "stage": "s", "x": "h", "y": ["L"]}], {"s": ["h"]}
    )
    (one,) = render_figures(specs, None, tmp_path / "one", tidy=tidy)
    (two,) = render_figures(specs, None, tmp_path / "two", tidy=tidy)
    for a, b in ((one.svg, two.svg), (one.pdf, two.pdf), (one.csv, two.csv)):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_a_log_axis_band_stops_above_zero(tmp_path):
    """A t-interval reaching below zero (issue 31: filled down to 1e-14 on a log axis) is drawn
    to half the line's smallest positive value."""
    tidy = _synthetic([0.0] * 4, [0.01, 0.5, 0.2, 0.2001], hue=[1, 1, 2, 2])
    raw = [{"name": "log", "kind": "line", "stage": "s", "x": "g", "y": ["L"], "yscale": "log"}]
    (fig,) = render_figures(parse_figures(raw, {"s": ["g"]}), None, tmp_path, tidy=tidy)
    data = pd.read_csv(fig.csv)
    assert data.ci_low.iloc[0] < 0  # the interval itself is kept in the CSV
    from lmc.studies.reporting.figures import _log_floor

    low = _log_floor(data.ci_low.to_numpy(), data["mean"].to_numpy())
    assert low[0] == pytest.approx(min(data.ci_low.iloc[1], data["mean"].min()) / 2)
    assert low[1] == data.ci_low.iloc[1] > 0
