"""Aggregation of a study's results: statistics per cell over seeds against hand-computed
answers, non-finite values excluded and counted, failed and missing jobs counted per cell,
list-valued coordinates, the replicate axes of each stage, and the tables of a study folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmc.results import read_record
from lmc.studies import StudyError, StudyStore, load_study
from lmc.studies.reporting.aggregate import (
    default_by,
    job_table,
    seed_keys,
    series_table,
    stage_keys,
    summarize,
    write_tables,
)
from lmc.studies.reporting.results import results
from tests.studies.conftest import WIDTH, copy_run

T_975_2 = 4.302652729749464  # t_{0.975} with 2 degrees of freedom


def _tidy(values, width=4, metric="loss", stage="train"):
    return pd.DataFrame(
        {
            "stage": stage,
            "job": [f"j{i}" for i in range(len(values))],
            "width": width,
            "seed": range(len(values)),
            "metric": metric,
            "value": values,
        }
    )


def _only(frame: pd.DataFrame, **where) -> pd.Series:
    keep = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        keep &= (frame[column] == value).to_numpy()
    assert keep.sum() == 1, frame
    return frame[keep].iloc[0]


def test_mean_std_and_t_interval_of_one_two_three():
    row = summarize(_tidy([1.0, 2.0, 3.0]), by=["width"]).iloc[0]
    half = T_975_2 * 1.0 / math.sqrt(3)
    assert half == pytest.approx(2.4841, abs=1e-4)
    assert (row.stage, row.width, row.metric) == ("train", 4, "loss")
    assert (row.n, row.n_nonfinite) == (3, 0)
    assert row["mean"] == pytest.approx(2.0) and row["std"] == pytest.approx(1.0)
    assert row.ci_low == pytest.approx(2 - half, rel=1e-12)
    assert row.ci_high == pytest.approx(2 + half, rel=1e-12)


def test_nan_and_inf_are_excluded_and_counted():
    row = summarize(_tidy([1.0, math.nan, 2.0, math.inf, 3.0, -math.inf]), by=["width"]).iloc[0]
    assert (row.n, row.n_nonfinite) == (3, 3)
    assert row["mean"] == pytest.approx(2.0) and row["std"] == pytest.approx(1.0)
    assert row.ci_high - row["mean"] == pytest.approx(T_975_2 / math.sqrt(3))


def test_one_value_has_no_spread_and_no_finite_value_no_mean():
    table = pd.concat([_tidy([5.0]), _tidy([math.nan, None], width=8)], ignore_index=True)
    out = summarize(table, by=["width"])
    one, none = _only(out, width=4), _only(out, width=8)
    assert (one.n, one["mean"]) == (1, 5.0)
    assert all(math.isnan(one[c]) for c in ("std", "ci_low", "ci_high"))
    assert (none.n, none.n_nonfinite) == (0, 2)  # the cell is kept, its mean NaN
    assert all(math.isnan(none[c]) for c in ("mean", "std", "ci_low", "ci_high"))


def test_cells_split_by_keys_metric_and_stage():
    table = pd.concat(
        [
            _tidy([1.0, 3.0]),
            _tidy([10.0, 30.0], width=8),
            _tidy([0.5, 0.7], metric="acc"),
            _tidy([7.0, 9.0], stage="spawn"),
        ],
        ignore_index=True,
    )
    out = summarize(table, by=["width"])
    assert len(out) == 4 and list(out.columns[:3]) == ["stage", "width", "metric"]
    assert _only(out, stage="train", width=8, metric="loss")["mean"] == 20.0
    assert _only(out, stage="train", width=4, metric="acc")["mean"] == pytest.approx(0.6)
    assert _only(out, stage="spawn", width=4, metric="loss")["mean"] == 8.0
    # by the seed too: one value per cell
    assert set(summarize(table, by=["width", "seed"]).n) == {1}
    # a value column of another name
    other = summarize(table.rename(columns={"value": "v"}), by=["width"], value="v")
    pd.testing.assert_frame_equal(other, out)


def test_list_valued_coordinates_group_and_stay_lists():
    # merge jobs: their coordinate is the group of seeds they merged
    table = pd.DataFrame(
        {
            "stage": "merge",
            "job": ["a", "b", "c"],
            "width": [4, 4, 4],
            "seed_everything": [[0, 1, 2], [0, 1, 2], [0, 1]],
            "metric": "loss",
            "value": [1.0, 3.0, 5.0],
        }
    )
    out = summarize(table, by=["width", "seed_everything"])
    assert len(out) == 2
    assert out.seed_everything.tolist() == [[0, 1, 2], [0, 1]]
    assert out.n.tolist() == [2, 1] and out["mean"].tolist() == [2.0, 5.0]


def test_failed_and_missing_jobs_are_counted_per_cell():
    table = pd.concat([_tidy([1.0, 2.0]), _tidy([3.0], metric="acc")], ignore_index=True)
    jobs = pd.DataFrame(
        {
            "stage": "train",
            "job": list("abcdefg"),
            "width": [4, 4, 4, 4, 8, 8, 16],
            "seed": [0, 1, 2, 3, 0, 1, 0],
            "status": ["done", "done", "failed", "pending", "failed", "running", "done"],
        }
    )
    out = summarize(table, by=["width"], jobs=jobs)
    loss, acc = _only(out, width=4, metric="loss"), _only(out, width=4, metric="acc")
    assert (loss.n, loss.n_failed, loss.n_missing) == (2, 1, 1)
    assert (acc.n, acc.n_failed, acc.n_missing) == (1, 1, 1)
    # width 8: no job done, so no row in the table; it still appears, per metric of the stage
    lost = out[out.width == 8]
    assert sorted(lost.metric) == ["acc", "loss"]
    assert lost.n.tolist() == [0, 0] and lost.n_failed.tolist() == [1, 1]
    assert lost.n_missing.tolist() == [1, 1] and lost["mean"].isna().all()
    # width 16: done, yet without metrics here; nothing failed there, so no row
    assert 16 not in out.width.tolist()
    assert summarize(table, by=["width"]).columns.tolist()[-1] == "ci_high"  # no jobs: no counts


def test_unknown_by_column_is_refused():
    with pytest.raises(StudyError, match="cannot summarize by \\['depth'\\].*its columns: stage"):
        summarize(_tidy([1.0]), by=["depth"])
    jobs = pd.DataFrame({"stage": ["train"], "job": ["a"], "status": ["done"]})
    with pytest.raises(StudyError, match="the jobs table has no column \\['width'\\]"):
        summarize(_tidy([1.0]), by=["width"], jobs=jobs)


SPAWN_STUDY = {
    "name": "instability",
    "train": {"config": "x.yaml", "grid": {"width": [4, 8], "seed_everything": [0, 1]}},
    "spawn": [{"name": "child", "at_epoch": [0, 1], "grid": {"seed_everything": [10, 11]}}],
    "evaluate": [
        {
            "name": "merge",
            "kind": "merge",
            "config": "m.yaml",
            "groups": {"over": ["width"], "vary": "seed_everything"},
        },
        {
            "name": "stability",
            "kind": "barrier",
            "config": "b.yaml",
            "stage": "child",
            "pairs": {
                "over": ["width", "parent:seed_everything", "spawn_epoch"],
                "vary": "seed_everything",
                "reference": 10,
            },
        },
    ],
}


def test_replicate_axes_and_default_grouping_of_each_stage():
    study = SPAWN_STUDY
    assert stage_keys(study) == {
        "train": ("width", "seed_everything"),
        "child": ("width", "parent:seed_everything", "spawn_epoch", "seed_everything"),
        "merge": ("width", "seed_everything"),
        "stability": ("width", "parent:seed_everything", "spawn_epoch", "seed_everything"),
    }
    assert seed_keys(study) == ("seed_everything",)
    assert seed_keys(study, "merge") == ("seed_everything",)
    assert default_by(study, "train") == ["width"]
    assert default_by(study, "child") == ["width", "parent:seed_everything", "spawn_epoch"]
    assert default_by(study, "merge") == ["width"]
    assert default_by(study, "stability") == ["width", "parent:seed_everything", "spawn_epoch"]
    # an evaluate stage that varies another key keeps the seed
    varied = json.loads(json.dumps(study))
    varied["evaluate"][0]["groups"] = {"over": ["seed_everything"], "vary": "width"}
    assert seed_keys(varied, "merge") == ("width",)
    assert default_by(varied, "merge") == ["seed_everything"]
    assert seed_keys(varied) == ("seed_everything", "width")
    with pytest.raises(StudyError, match="no stage 'nope'.*train, child, merge, stability"):
        default_by(study, "nope")


def test_stage_keys_agree_with_the_plan_and_the_study(tiny_run):
    path, root = tiny_run
    keys = stage_keys(root)  # the folder's study copy, read as plain YAML
    assert keys == stage_keys(load_study(path)) == stage_keys(path)
    for job in StudyStore(root).plan():
        assert tuple(job["coordinates"]) == keys[job["stage"]]
    assert default_by(root, "barrier") == default_by(root, "train") == [WIDTH]


def test_job_table_has_every_planned_job_with_its_status(tiny_run):
    _, root = tiny_run
    jobs = job_table(root)
    assert jobs.columns.tolist() == [
        "stage",
        "job",
        WIDTH,
        "seed_everything",
        "status",
        "error",
        "seconds",
        "started",
        "finished",
    ]
    assert len(jobs) == 6 and (jobs.status == "done").all() and jobs.error.isna().all()
    assert jobs.stage.tolist() == ["train"] * 4 + ["barrier"] * 2
    assert sorted(jobs[WIDTH].tolist()) == [4, 4, 4, 8, 8, 8]
    assert (jobs.seconds > 0).all() and jobs.started.notna().all()
    assert jobs.job.tolist() == [j["id"] for j in StudyStore(root).plan()]


def test_series_table_holds_the_barrier_paths(tiny_run):
    _, root = tiny_run
    series = series_table(root)
    assert series.columns.tolist() == [
        "stage",
        "job",
        WIDTH,
        "seed_everything",
        "series",
        "axis",
        "x",
        "metric",
        "value",
    ]
    assert set(series.stage) == {"barrier"} and series.job.nunique() == 2
    assert set(series.series) == {"naive", "matched"} and set(series.axis) == {"alpha"}
    assert sorted(set(series.x)) == [0.0, 0.5, 1.0]  # num_alphas=3
    per_path = series.groupby(["job", "series", "metric"]).size()
    assert (per_path == 3).all()
    # the values are the records' own; accuracy is not measured for a regression: NaN
    store = StudyStore(root)
    job = store.plan()[-1]
    record = read_record(store.run_dir(job))
    rows = series[(series.job == job["id"]) & (series.series == "matched")]
    loss = rows[rows.metric == "test/loss"].sort_values("x").value.tolist()
    assert loss == pytest.approx(record.series["matched"].values["test/loss"])
    assert rows[rows.metric == "test/acc"].value.isna().all()
    assert series_table(root, stage="train").empty
    assert len(series_table(root, stage="barrier")) == len(series)


def test_write_tables_writes_every_table_and_the_summary_over_seeds(tiny_run, tmp_path):
    _, root = tiny_run
    written = write_tables(root, tmp_path / "tables")
    for name in ("results", "jobs", "summary", "series"):
        assert written[name] == tmp_path / "tables" / f"{name}.csv"
        assert written[name].stat().st_size > 0
    assert not list((tmp_path / "tables").glob(".*tmp*"))  # no temporary file left
    assert len(pd.read_csv(written["results"])) == len(results(root))
    assert len(pd.read_csv(written["jobs"])) == 6
    summary = pd.read_csv(written["summary"])
    assert summary.columns.tolist()[:3] == ["stage", WIDTH, "metric"]
    barrier = summary[(summary.stage == "barrier") & (summary.metric == "barrier_loss_matched")]
    assert sorted(barrier[WIDTH]) == [4, 8] and (barrier.n == 1).all()
    assert (barrier.n_failed == 0).all() and (barrier.n_missing == 0).all()
    # a train cell: the mean and t-interval of the two seeds' values, by hand
    tidy = results(root)
    values = tidy[(tidy.stage == "train") & (tidy[WIDTH] == 8) & (tidy.metric == "test/loss")]
    a, b = values.value.tolist()
    cell = _only(summary, stage="train", metric="test/loss", **{WIDTH: 8})
    half = stats.t.ppf(0.975, 1) * abs(a - b) / math.sqrt(2) / math.sqrt(2)
    assert cell.n == 2 and cell["mean"] == pytest.approx((a + b) / 2)
    assert cell.ci_high == pytest.approx((a + b) / 2 + half)
    # accuracy is not measured (None in summary.json): counted as non-finite, not dropped
    acc = summary[(summary.stage == "barrier") & (summary.metric == "barrier_acc_matched")]
    assert (acc.n == 0).all() and (acc.n_nonfinite == 1).all()
    has_parquet = "results.parquet" in written
    assert (tmp_path / "tables" / "results.parquet").is_file() == has_parquet


def test_list_valued_coordinates_are_tuples_so_the_table_groups_by_them(tiny_run, tmp_path):
    """A merge's members (``seed_everything: [0, 1]``) come out as a tuple in their order, so
    ``groupby`` over every coordinate works (issue 31: it raised ``unhashable type: 'list'``)."""
    root = copy_run(tiny_run, tmp_path)
    plan_path = root / "plan.json"
    plan = json.loads(plan_path.read_text())
    jobs = plan["jobs"] if isinstance(plan, dict) else plan
    for job in jobs:
        if job["stage"] == "barrier":
            job["coordinates"]["seed_everything"] = [0, 1]  # as a merge group's members
    plan_path.write_text(json.dumps(plan))
    tidy = results(root)
    stage = tidy[tidy.stage == "barrier"]
    assert set(stage.seed_everything) == {(0, 1)}
    by = stage.groupby([WIDTH, "seed_everything", "metric"]).value.mean()
    matched = stage[(stage[WIDTH] == 8) & (stage.metric == "barrier_loss_matched")].value.item()
    assert by.loc[(8, (0, 1), "barrier_loss_matched")] == matched
    # across stages the train rows' seeds are ints: grouped without sorting ints and tuples
    every = tidy.groupby(["stage", WIDTH, "seed_everything", "metric"], sort=False).value.mean()
    assert every.loc[("barrier", 8, (0, 1), "barrier_loss_matched")] == matched
    assert (
        every.loc[("train", 8, 1, "test/loss")]
        == tidy[(tidy.stage == "train") & (tidy[WIDTH] == 8) & (tidy.seed_everything == 1)]
        .set_index("metric")
        .value["test/loss"]
    )


def test_a_failed_and_a_missing_job_are_counted_in_the_summary(tiny_run, tmp_path):
    root = copy_run(tiny_run, tmp_path)
    store = StudyStore(root)
    plan = store.plan()
    failed = next(j for j in plan if j["stage"] == "train" and j["coordinates"][WIDTH] == 4)
    path = store.job_dir(failed) / "job.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "status": "failed", "error": "RuntimeError: boom"}))
    pending = next(j for j in plan if j["stage"] == "barrier" and j["coordinates"][WIDTH] == 8)
    (store.job_dir(pending) / "job.json").unlink()

    jobs = job_table(root)
    assert jobs.set_index("job").status.to_dict() == {
        **{j["id"]: "done" for j in plan},
        failed["id"]: "failed",
        pending["id"]: "pending",
    }
    assert jobs.set_index("job").error[failed["id"]] == "RuntimeError: boom"
    assert jobs.error.notna().sum() == 1

    summary = pd.read_csv(write_tables(root, tmp_path / "tables")["summary"])
    train4 = summary[(summary.stage == "train") & (summary[WIDTH] == 4)]
    assert (train4.n_failed == 1).all() and (train4.n_missing == 0).all()
    assert (train4[train4.metric == "test/loss"].n == 1).all()
    train8 = summary[(summary.stage == "train") & (summary[WIDTH] == 8)]
    assert (train8.n_failed == 0).all() and (train8.n == 2).all()
    # the barrier of width 8 has no row left, yet is listed, per metric, as missing
    barrier8 = summary[(summary.stage == "barrier") & (summary[WIDTH] == 8)]
    assert "barrier_loss_matched" in set(barrier8.metric)
    assert (barrier8.n == 0).all() and (barrier8.n_missing == 1).all()
