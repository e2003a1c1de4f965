"""The W&B Report of a study (``lmc study report DIR --wandb ENTITY/PROJECT``): its spec from the
tiny study, the spec file, the wandb-workspaces objects built from it for an explicit entity,
and every way the upload can fail, short of the network call itself."""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lmc.studies import StudyError
from lmc.studies.reporting import wandb_report as wbr
from lmc.studies.reporting.figure_spec import FigureSpec
from lmc.studies.reporting.wandb_spec import EVALUATE_PREFIX
from tests.studies.conftest import WIDTH, copy_run

FIGURES = (
    FigureSpec(
        "barrier_vs_width",
        "line",
        "barrier",
        ("barrier_loss_matched", "barrier_loss_naive"),
        x=WIDTH,
        xscale="log",
        references=((4.0, 0.0, "003: 0 at the teacher width"),),
    ),
    FigureSpec("loss_by_width", "bar", "train", ("test/loss",), x=WIDTH, hue="seed_everything"),
    FigureSpec(
        "matched_vs_naive",
        "scatter",
        "barrier",
        ("barrier_loss_matched",),
        x="barrier_loss_naive",
        fit="exp",
    ),  # fmt: skip
    FigureSpec("loss_map", "heatmap", "train", ("test/loss",), x=WIDTH, rows="seed_everything"),
    FigureSpec("paths", "curve", "barrier", ("test/loss",), series="matched"),
)
TABLES = {"summary: train": [{"metric": "test/loss", "mean": 0.5, "n": 2, "ci": float("nan")}]}


@pytest.fixture(autouse=True)
def _wandb_offline(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture
def spec(tiny_run) -> dict:
    return wbr.report_spec(tiny_run[1], FIGURES, TABLES)


def _panel(spec: dict, name: str) -> dict:
    return next(p for p in spec["panels"] if p["figure"] == name)


# ------------------------------------------------------------------ the spec (no wandb-workspaces)


def test_spec_of_the_tiny_study(spec, tiny_run):
    assert spec["schema"] == "lmc.wandb_report" and spec["version"] == 1
    assert spec["study"] == spec["group"] == "tiny" and "tiny" in spec["title"]
    assert spec["stages"] == ["train", "barrier"]
    assert spec["jobs"] == {
        "train": {"planned": 4, "done": 4},
        "barrier": {"planned": 2, "done": 2},
    }
    assert spec["runsets"] == [
        {"name": "train", "group": "tiny", "job_type": "train"},
        {"name": "barrier", "group": "tiny", "job_type": "barrier"},
    ]
    assert spec["study_file"] == tiny_run[0].read_text()  # verbatim
    assert json.loads(json.dumps(spec, allow_nan=False)) == spec  # plain JSON
    assert [p["figure"] for p in spec["panels"]] == [f.name for f in FIGURES]
    assert spec["tables"] == [
        {
            "name": "summary: train",
            "columns": ["metric", "mean", "n", "ci"],
            "rows": [["test/loss", 0.5, 2, None]],
        }  # fmt: skip
    ]


def test_each_figure_kind_maps_to_its_wandb_panel_and_keys(spec):
    line = _panel(spec, "barrier_vs_width")
    assert line["panel"] == "ScatterPlot" and line["log_x"] and not line["log_y"]
    # an evaluate job's coordinates are read from its `study` config entry; its metrics are
    # logged under the task's prefix
    assert line["x"] == {"config": f"study.coordinates.{WIDTH}"}
    assert line["y"] == [
        {"summary": "interp/barrier_loss_matched"},
        {"summary": "interp/barrier_loss_naive"},
    ]
    assert any("003: 0 at the teacher width" in n for n in line["notes"])
    bar = _panel(spec, "loss_by_width")
    assert bar["panel"] == "BarPlot"
    assert bar["x"] == {"config": WIDTH}  # a training coordinate is the config key itself
    assert bar["y"] == [{"summary": "test/loss"}]
    assert bar["hue"] == {"config": "seed_everything"} and any("hue" in n for n in bar["notes"])
    scatter = _panel(spec, "matched_vs_naive")
    assert scatter["panel"] == "ScatterPlot"
    assert scatter["x"] == {"summary": "interp/barrier_loss_naive"}
    assert scatter["y"] == [{"summary": "interp/barrier_loss_matched"}]
    assert any("exp fit" in n for n in scatter["notes"])
    heat = _panel(spec, "loss_map")
    assert heat["panel"] == "ParallelCoordinatesPlot"
    assert (heat["rows"], heat["x"]) == ({"config": "seed_everything"}, {"config": WIDTH})
    curve = _panel(spec, "paths")
    assert curve["panel"] == "MediaBrowser" and curve["media"] == ["interp/figure"]
    assert any("'matched'" in n and "test/loss" in n for n in curve["notes"])
    assert curve["source"]["series"] == "matched"


def test_evaluate_prefixes_are_the_tasks_logging_prefixes():
    from lmc.tasks.curve_report import log_curve
    from lmc.tasks.merge_report import log_merge
    from lmc.tasks.report import log_study

    def default(fn) -> str:
        return inspect.signature(fn).parameters["prefix"].default

    assert EVALUATE_PREFIX == {
        "barrier": default(log_study),
        "curve": default(log_curve),
        "merge": default(log_merge),
    }


def test_panels_ask_for_the_keys_the_stage_s_tasks_logged(tiny_run, tmp_path):
    """A stage's metrics are asked for under the prefix its jobs' run records say they were
    logged under (the fusion tasks log ``fusion/...`` in a merge stage, whose kind's own prefix
    is ``merge``: the 000_fusion Report's panels were empty)."""
    from tests.studies.conftest import copy_run

    out = copy_run(tiny_run, tmp_path)
    for summary in (out / "jobs" / "barrier").rglob("summary.json"):
        record = json.loads(summary.read_text())
        assert record["logged_as"] == "interp"  # what log_study wrote
        summary.write_text(json.dumps({**record, "logged_as": "fusion"}))
    spec = wbr.report_spec(out, FIGURES, TABLES)
    assert _panel(spec, "barrier_vs_width")["y"] == [
        {"summary": "fusion/barrier_loss_matched"},
        {"summary": "fusion/barrier_loss_naive"},
    ]
    assert _panel(spec, "paths")["media"] == ["fusion/figure"]
    assert _panel(spec, "loss_by_width")["y"] == [{"summary": "test/loss"}]  # train: no prefix


def test_spec_refuses_a_figure_of_a_stage_without_jobs_and_a_non_study_folder(tiny_run, tmp_path):
    bad = FigureSpec("f", "line", "merge", ("x",), x=WIDTH)
    with pytest.raises(StudyError, match=r"figure 'f': stage 'merge'.*stages: train, barrier"):
        wbr.report_spec(tiny_run[1], [bad])
    with pytest.raises(StudyError, match="no plan.json and no study.yaml"):
        wbr.report_spec(tmp_path, [])


def test_spec_file_round_trips_and_refuses_other_files(spec, tmp_path):
    path = wbr.write_spec(spec, tmp_path / "report" / wbr.SPEC_FILE)
    assert path == wbr.spec_path(tmp_path / "report")
    assert wbr.read_spec(path) == spec
    assert not [p for p in path.parent.iterdir() if p != path]  # atomic: no temporary left
    for change, message in (
        ({"schema": "something.else"}, r"no W&B report spec of lmc \(schema 'something.else'"),
        ({"version": 99}, r"version 99; this lmc reads version 1"),
    ):
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({**spec, **change}))
        with pytest.raises(StudyError, match=message):
            wbr.read_spec(wrong)
    wrong.write_text("{not json")
    with pytest.raises(StudyError, match="not valid JSON"):
        wbr.read_spec(wrong)
    with pytest.raises(StudyError, match="no W&B report spec at"):
        wbr.read_spec(tmp_path / "missing.json")


@pytest.mark.parametrize("target", ["lmc", "a/b/c", "/lmc", "me/", "me lmc", ""])
def test_a_wrong_target_is_refused_before_anything_else(spec, target, monkeypatch):
    def no_network(*_, **__):
        raise AssertionError("reached the W&B report")

    monkeypatch.setattr(wbr, "build_report", no_network)
    with pytest.raises(StudyError, match="ENTITY/PROJECT"):
        wbr.publish(spec, target)
    assert wbr.parse_target(" team-1/lmc.x ") == ("team-1", "lmc.x")


def test_without_wandb_workspaces_the_error_says_how_to_install(spec, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", None)
    with pytest.raises(StudyError, match=r'pip install -e "\.\[reports\]"'):
        wbr.build_report(spec, "someone", "lmc")


def test_a_study_that_logged_to_csv_only_is_refused_naming_the_fix(tiny_run, tmp_path):
    """The tiny study's runs log to CSV: a W&B report would chart runs that do not exist."""
    report = _lmc_report(tmp_path)
    with pytest.raises(StudyError, match=r"logged to CSV only .* add configs/loggers/wandb.yaml"):
        wbr.publish_or_save(tiny_run[1], report, "someone/lmc")
    assert not (tmp_path / "report" / wbr.SPEC_FILE).exists()
    out = copy_run(tiny_run, tmp_path)  # one run that logged to W&B is enough
    config = next(out.rglob("config.yaml"))
    saved = yaml.safe_load(config.read_text())
    saved["trainer"]["logger"] = {"class_path": "lmc.loggers.WandbLogger", "init_args": {}}
    config.write_text(yaml.safe_dump(saved))
    assert not wbr.logged_to_wandb(tiny_run[1]) and wbr.logged_to_wandb(out)


def test_publish_or_save_writes_the_spec_even_without_wandb_workspaces(tiny_run, tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.setattr(wbr, "logged_to_wandb", lambda root: True)
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", None)
    report = _lmc_report(tmp_path)
    with pytest.raises(StudyError, match=r"pip install.*the W&B report spec is at .*wandb_report"):
        wbr.publish_or_save(tiny_run[1], report, "someone/lmc")
    spec = wbr.read_spec(tmp_path / "report" / wbr.SPEC_FILE)
    assert [p["figure"] for p in spec["panels"]] == ["barrier_vs_width"]
    assert [t["name"] for t in spec["tables"]] == ["summary: train", "summary: barrier"]
    barrier = spec["tables"][1]
    assert barrier["columns"] == [WIDTH, "metric", "mean"]  # its empty column dropped
    assert barrier["rows"] == [[4, "barrier_loss_matched", 0.25]]


def _lmc_report(tmp_path: Path) -> SimpleNamespace:
    """What lmc.studies.reporting.report.write_report returns, as far as publish_or_save reads it."""
    out = tmp_path / "report"
    (out / "tables").mkdir(parents=True)
    summary = out / "tables" / "summary.csv"
    summary.write_text(
        f"stage,{WIDTH},seed_everything,metric,mean\n"
        "train,4,,test/loss,0.5\n"
        "barrier,4,,barrier_loss_matched,0.25\n"
    )
    return SimpleNamespace(
        html=out / "report.html",
        figures=[SimpleNamespace(spec=FIGURES[0])],
        tables={"summary": summary, "jobs": out / "tables" / "jobs.csv"},
    )


# ------------------------------------------------------------------ wandb-workspaces objects


def _wr():
    pytest.importorskip("wandb_workspaces", reason="the W&B Report needs wandb-workspaces")
    import wandb_workspaces.reports.v2 as wr

    return wr


def test_build_report_for_an_explicit_entity(spec, tiny_run):
    wr = _wr()
    from wandb_workspaces import expr

    report = wbr.build_report(spec, entity="someone", project="lmc")
    assert isinstance(report, wr.Report)
    assert (report.entity, report.project, report.title) == ("someone", "lmc", "lmc study tiny")
    code = [b for b in report.blocks if isinstance(b, wr.CodeBlock)]
    assert len(code) == 1 and code[0].code == tiny_run[0].read_text()
    assert code[0].language == "yaml"
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert len(grids) == 1 + len(FIGURES)  # the runs, then one per figure
    assert [rs.name for rs in grids[0].runsets] == ["tiny: train", "tiny: barrier"]
    for grid in grids:
        for rs in grid.runsets:
            assert (rs.entity, rs.project) == ("someone", "lmc")
            stage = rs.name.split(": ")[1]
            assert expr.string_to_filterexpr_list(rs.filters) == [
                expr.Metric("Group") == "tiny",
                expr.Metric("JobType") == stage,
            ]
    by_figure = dict(zip([f.name for f in FIGURES], grids[1:]))
    for name, grid in by_figure.items():
        stage = next(f.stage for f in FIGURES if f.name == name)
        assert [rs.name for rs in grid.runsets] == [f"tiny: {stage}"]
    line = by_figure["barrier_vs_width"].panels
    assert [type(p) for p in line] == [wr.ScatterPlot, wr.ScatterPlot]  # one per metric
    assert line[0].x == wr.Config(f"study.coordinates.{WIDTH}") and line[0].log_x
    assert [p.y for p in line] == [
        wr.SummaryMetric("interp/barrier_loss_matched"),
        wr.SummaryMetric("interp/barrier_loss_naive"),
    ]
    (bar,) = by_figure["loss_by_width"].panels
    assert isinstance(bar, wr.BarPlot) and bar.groupby == wr.Config(WIDTH)
    assert bar.metrics == [wr.SummaryMetric("test/loss")] and bar.groupby_aggfunc == "mean"
    (scatter,) = by_figure["matched_vs_naive"].panels
    assert isinstance(scatter, wr.ScatterPlot)
    assert scatter.x == wr.SummaryMetric("interp/barrier_loss_naive")
    (heat,) = by_figure["loss_map"].panels
    assert isinstance(heat, wr.ParallelCoordinatesPlot)
    assert [c.metric for c in heat.columns] == [
        wr.Config("seed_everything"),
        wr.Config(WIDTH),
        wr.SummaryMetric("test/loss"),
    ]
    (media,) = by_figure["paths"].panels
    assert isinstance(media, wr.MediaBrowser) and media.media_keys == ["interp/figure"]
    # the panels serialise without a connection (only the runsets look their project up)
    models = [p._to_model() for g in grids for p in g.panels]
    assert models[0].config.x_axis == f"config:study.value.coordinates.{WIDTH}"
    assert models[0].config.y_axis == "summary:interp/barrier_loss_matched"
    assert models[2].config.group_by == "model.value.init_args.net.init_args.width"
    text = " ".join(b.text for b in report.blocks if isinstance(b, wr.MarkdownBlock))
    assert "| metric | mean | n | ci |" in text and "| test/loss | 0.5 | 2 |  |" in text


def test_publish_without_a_connection_says_where_the_spec_stays(spec, tmp_path, monkeypatch):
    wr = _wr()
    seen = {}

    def offline(self, *_, **__):
        seen["silent"] = os.environ.get("WANDB_SILENT")
        raise ConnectionError("no route to host")

    monkeypatch.delenv("WANDB_SILENT", raising=False)
    monkeypatch.setattr(wr.Report, "save", offline)
    path = wbr.write_spec(spec, tmp_path / wbr.SPEC_FILE)
    with pytest.raises(RuntimeError) as err:
        wbr.publish(path, "someone/lmc")  # a spec file: its path is named
    message = str(err.value)
    assert str(path) in message and "someone/lmc" in message and "no route to host" in message
    assert "lmc study report DIR --wandb ENTITY/PROJECT" in message
    assert seen["silent"] == "true"  # no login prompt while saving
    assert "WANDB_SILENT" not in os.environ  # restored
    kept = tmp_path / "kept" / "wandb_report.json"
    with pytest.raises(RuntimeError, match=re.escape(f"its spec stays at {kept}")):
        wbr.publish(spec, "someone/lmc", path=str(kept))


def test_publish_returns_the_url_and_publish_or_save_says_what_happened(
    tiny_run, tmp_path, monkeypatch
):
    wr = _wr()
    saved = []

    def save(self, *_, **__):
        saved.append((self.entity, self.project))
        self.id = "abc123"
        return self

    monkeypatch.setattr(wbr, "logged_to_wandb", lambda root: True)
    monkeypatch.setattr(wr.Report, "save", save)
    monkeypatch.setattr(
        wr.Report, "url", property(lambda r: f"https://wandb.example/{r.entity}/{r.project}/{r.id}")
    )
    report = _lmc_report(tmp_path)
    line = wbr.publish_or_save(tiny_run[1], report, "someone/lmc")
    assert line.startswith("W&B report: https://wandb.example/someone/lmc/abc123")
    assert saved == [("someone", "lmc")]
    assert (tmp_path / "report" / wbr.SPEC_FILE).is_file()

    def offline(self, *_, **__):
        raise ConnectionError("offline")

    monkeypatch.setattr(wr.Report, "save", offline)
    line = wbr.publish_or_save(tiny_run[1], report, "someone/lmc")
    assert line.startswith("W&B report not uploaded") and str(tmp_path / "report") in line
    with pytest.raises(StudyError, match="ENTITY/PROJECT"):
        wbr.publish_or_save(tiny_run[1], report, "lmc")


def test_every_figure_kind_has_a_drawing_and_a_panel(spec):
    """A figure kind is one entry in each table (figure_spec's keys, the matplotlib drawer, the
    W&B panel): a kind added to one and not the others is caught here (issue 32)."""
    from lmc.studies.reporting.figure_spec import FIGURE_KINDS

    for kind in FIGURE_KINDS.values():  # every kind carries both renderers
        assert callable(kind.renderer("matplotlib")) and callable(kind.renderer("wandb")), kind
    assert {p["kind"] for p in spec["panels"]} == set(FIGURE_KINDS)  # FIGURES covers each
