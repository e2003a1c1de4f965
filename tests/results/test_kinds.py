"""Records of interpolation, merge and curve runs: the same series shape for every kind, the
legacy top-level layout, figures redrawn from the file, and what reaches the loggers."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from lmc.curves.evaluate import CurveEvaluation
from lmc.curves.plane import PlaneResult
from lmc.interpolation.study import PathResult, StudyResult
from lmc.merging.evaluate import MergeEvaluation, MergeSweep, OriginalStats
from lmc.results import RunRecord, Series, read_record, write_record
from lmc.results.figures import curve_figure, interpolation_figure, merge_figure, plane_figure
from lmc.results.logging import publish, step_rows, summary_metrics
from lmc.tasks.curve_report import curve_record
from lmc.tasks.merge_report import sweep_record
from lmc.tasks.report import study_record

ALPHAS = [0.0, 0.5, 1.0]


def _study() -> StudyResult:
    barrier = {"loss": 0.3, "acc": 0.1}
    paths = {
        name: PathResult(
            ALPHAS,
            {"test/loss": [0.1, peak, 0.2], "test/acc": [0.9, 0.5, math.nan]},
            {"test": barrier},
        )
        for name, peak in (("naive", 0.6), ("matched", 0.2))
    }
    return StudyResult(paths, {}, [], {"matching_seconds": 0.1}, {"barrier_loss_naive": 0.45})


def _sweep() -> MergeSweep:
    evs = [
        MergeEvaluation(m, n, {"test/acc": 0.5 + n / 10, "sharpness": 2.0}, [1.0, 1.1], [60.0])
        for m in ("stemm", "naive")
        for n in (2, 3)
    ][:-1]  # naive was not evaluated at n=3
    return MergeSweep(evs, OriginalStats([{"test/acc": 0.9}], [1.5]))


def _curve() -> tuple[CurveEvaluation, PlaneResult]:
    ev = CurveEvaluation(
        ALPHAS,
        {"test/loss": [0.1, 0.3, 0.2], "test/acc": [0.9, 0.7, 0.9], "train/loss": [0.1, 0.2, 0.1]},
        [0.25, 0.5, 0.25],
        {"test/acc_min": 0.7},
    )
    grid = [[0.1, 0.2], [0.3, 0.4]]
    plane = PlaneResult(
        [0.0, 1.0],
        [0.0, 1.0],
        {"test/loss": grid, "test/acc": grid},
        {"theta_1": (0.0, 0.0)},
        {"curve": [(0.0, 0.0), (1.0, 1.0)]},
    )
    return ev, plane


def _records() -> dict[str, RunRecord]:
    ev, plane = _curve()
    return {
        "interpolation": study_record(_study()),
        "merge": sweep_record(_sweep(), {"wm_method": "accelerated"}),
        "curve": curve_record(ev, plane, {"pam_objective_start": 1.0}),
    }


def _shape(series: Series) -> tuple:
    return (
        type(series.axis),
        type(series.x),
        type(series.values),
        frozenset(type(v) for v in series.values.values()),
        frozenset(len(v) == len(series.x) for v in series.values.values()),
    )


def test_every_kind_exposes_the_same_series_shape(tmp_path):
    records = _records()
    axes = {kind: {s.axis for s in r.series.values()} for kind, r in records.items()}
    assert axes == {"interpolation": {"alpha"}, "merge": {"n"}, "curve": {"t"}}
    for kind, record in records.items():
        assert record.kind == kind
        read = read_record(_write(tmp_path / kind, record))
        shapes = {_shape(s) for r in (record, read) for s in r.series.values()}
        assert shapes == {(str, list, dict, frozenset([list]), frozenset([True]))}, kind
        assert all(
            isinstance(v, (float, int, bool, str, type(None)))
            for v in read.scalar_summary().values()
        )


def _write(out, record):
    return write_record(out, record)


def test_merge_series_are_metrics_vs_n_with_gaps():
    series = _records()["merge"].series
    assert list(series) == ["stemm", "naive"]
    assert series["stemm"].x == series["naive"].x == [2, 3]
    assert series["stemm"].values["test/acc"] == pytest.approx([0.7, 0.8])
    assert series["naive"].values["test/acc"] == pytest.approx([0.7, None])


def test_each_kind_keeps_its_legacy_top_level_layout(tmp_path):
    records = _records()
    payloads = {k: json.loads(_write(tmp_path / k, r).read_text()) for k, r in records.items()}
    interp = payloads["interpolation"]
    assert interp["paths"]["naive"]["test/loss"] == [0.1, 0.6, 0.2]
    assert interp["paths"]["naive"]["alphas"] == ALPHAS
    assert interp["barriers"]["naive"]["test"]["loss"] == 0.3
    assert interp["summary"]["barrier_loss_naive"] == 0.45
    assert "/series/naive/values/test~1acc/2" in interp["nonfinite"]
    merge = payloads["merge"]
    assert {(e["method"], e["n"]) for e in merge["evaluations"]} == {
        ("stemm", 2),
        ("stemm", 3),
        ("naive", 2),
    }
    assert merge["summary"]["stemm/n3/test/acc"] == pytest.approx(0.8)
    assert merge["wm_method"] == "accelerated" and merge["originals"]["sharpness"] == [1.5]
    curve = payloads["curve"]
    assert curve["ts"] == ALPHAS and curve["arc_length_weights"] == [0.25, 0.5, 0.25]
    assert curve["summary"] == {"test/acc_min": 0.7, "pam_objective_start": 1.0}
    assert curve["plane"]["points"]["theta_1"] == [0.0, 0.0]


def test_figures_are_redrawn_from_the_file(tmp_path):
    records = {k: read_record(_write(tmp_path / k, r)) for k, r in _records().items()}
    paths = [
        interpolation_figure(records["interpolation"], tmp_path / "interpolation.png"),
        merge_figure(records["merge"], "test", tmp_path / "merge.png"),
        curve_figure(records["curve"], tmp_path / "curve.png"),
        plane_figure(records["curve"].details["plane"], tmp_path / "plane.png"),
    ]
    for path in paths:
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000


class _Logger:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.logged.append((step, dict(metrics)))


def test_step_rows_and_summary_keep_the_logged_keys():
    records = _records()
    rows = step_rows(records["interpolation"], "interp", {"naive": "naive", "matched": "matched"})
    assert rows[1] == {
        "interp/alpha": 0.5,
        "interp/naive/test/loss": 0.6,
        "interp/naive/test/acc": 0.5,
        "interp/matched/test/loss": 0.2,
        "interp/matched/test/acc": 0.5,
    }
    assert "interp/naive/test/acc" not in rows[2]  # NaN is not logged
    assert step_rows(records["curve"], "curve", {"curve": ""})[0] == {
        "curve/t": 0.0,
        "curve/test/loss": 0.1,
        "curve/test/acc": 0.9,
        "curve/train/loss": 0.1,
    }
    assert summary_metrics(records["merge"], "merge")["merge/stemm/n3/sharpness"] == 2.0


def test_publish_writes_the_record_and_figures_then_logs(tmp_path):
    record = _records()["interpolation"]
    logger = _Logger()
    trainer = SimpleNamespace(loggers=[logger], global_step=7)
    draw = {"figure": lambda path: interpolation_figure(record, path)}
    publish(trainer, record, tmp_path / "run", draw, "interp", steps={"naive": "naive"})
    assert read_record(tmp_path / "run").summary == record.summary
    assert (tmp_path / "run" / "interpolation.png").stat().st_size > 10_000
    assert [step for step, _ in logger.logged] == [0, 1, 2, 3]
    assert logger.logged[-1][1] == {"interp/barrier_loss_naive": 0.45}
    logger.logged.clear()
    publish(trainer, _records()["merge"], tmp_path / "merge", {"figure": lambda p: None}, "merge")
    [(step, summary)] = logger.logged
    assert step == 7 and summary["merge/naive/n2/test/acc"] == pytest.approx(0.7)
