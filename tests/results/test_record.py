"""The run record: exact round trip, strict JSON with non-finite values as null, atomic
writes, and clear refusals of files this lmc cannot read."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from lmc.results import RecordError, RunRecord, Series, Table, read_record, write_record
from lmc.results.figures import save_figure
from lmc.results.record import SCHEMA, VERSION


def _record(**overrides) -> RunRecord:
    fields = dict(
        kind="interpolation",
        summary={"barrier_loss_naive": 0.25, "steps": 3, "matched": True, "method": "weight"},
        series={
            "naive": Series("alpha", [0.0, 0.5, 1.0], {"test/loss": [0.1, 0.4, 0.2]}),
            "matched": Series("alpha", [0.0, 0.5, 1.0], {"test/loss": [0.1, 0.15, 0.2]}),
        },
        tables={"barriers": Table(["path", "loss"], [["naive", 0.25], ["matched", 0.05]])},
        figures={"figure": "interpolation.png"},
        config={"file": "config.yaml", "hparams": {"num_alphas": 3, "splits": ["test"]}},
        timings={"matching_seconds": 0.5},
        details={"paths": {"naive": {"alphas": [0.0, 0.5, 1.0]}}, "merges": {}},
    )
    fields.update(overrides)
    return RunRecord(**fields)


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the file")

    return json.loads(text, parse_constant=refuse)


def test_a_record_round_trips_exactly(tmp_path):
    record = _record()
    path = write_record(tmp_path, record)
    assert path == tmp_path / "summary.json"
    again = read_record(tmp_path)
    assert again == record and again.nonfinite == []
    assert read_record(path) == record
    payload = _strict(path.read_text())
    assert payload["schema"] == SCHEMA and payload["version"] == VERSION
    assert payload["kind"] == "interpolation" and payload["details"] == ["paths", "merges"]
    # details stand at the top level under their own names (the layout tests and users read)
    assert payload["paths"]["naive"]["alphas"] == [0.0, 0.5, 1.0]
    assert set(payload["versions"]) == {"lmc", "torch", "lightning", "python", "platform"}


def test_non_finite_values_become_null_and_are_listed(tmp_path):
    record = _record(
        summary={"barrier_acc": math.nan, "loss": 1.0, "gap": -math.inf},
        series={"naive": Series("alpha", [0.0, 1.0], {"test/acc": [math.inf, 0.5]})},
        details={"paths": {"a/b": [np.float32("nan"), np.float64(2.0)]}},
    )
    text = write_record(tmp_path, record).read_text()
    payload = _strict(text)
    assert "NaN" not in text and "Infinity" not in text
    assert payload["summary"] == {"barrier_acc": None, "loss": 1.0, "gap": None}
    assert payload["series"]["naive"]["values"]["test/acc"] == [None, 0.5]
    assert payload["paths"]["a/b"] == [None, 2.0]
    expected = [
        "/summary/barrier_acc",
        "/summary/gap",
        "/series/naive/values/test~1acc/0",
        "/paths/a~1b/0",
    ]
    assert payload["nonfinite"] == expected == record.nonfinite
    assert read_record(tmp_path).nonfinite == expected


def test_series_must_have_one_value_per_point():
    with pytest.raises(ValueError, match="'test/loss' has 2 values for 3 points of 'alpha'"):
        Series("alpha", [0.0, 0.5, 1.0], {"test/loss": [0.1, 0.2]})


def test_details_may_not_shadow_a_generic_field(tmp_path):
    with pytest.raises(ValueError, match=r"\['summary'\]"):
        write_record(tmp_path, _record(details={"summary": 1}))


@pytest.mark.parametrize("fail", ["dumps", "write", "replace"])
def test_a_crash_while_writing_keeps_the_previous_file(tmp_path, monkeypatch, fail):
    tmp_path = tmp_path / "run"  # only this run's files in it
    write_record(tmp_path, _record())
    before = (tmp_path / "summary.json").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if fail == "dumps":
        monkeypatch.setattr(json, "dumps", boom)
    elif fail == "write":
        monkeypatch.setattr(os, "fsync", boom)  # after the temporary file has content
    else:
        monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_record(tmp_path, _record(summary={"barrier_loss_naive": 9.0}))
    assert (tmp_path / "summary.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_crash_while_saving_a_figure_keeps_the_previous_figure(tmp_path, monkeypatch):
    tmp_path = tmp_path / "run"
    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "curve.png")
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")

    def boom(self, fname, **kwargs):
        Path(fname).write_bytes(b"half a png")
        raise RuntimeError("renderer died")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError, match="renderer died"):
        save_figure(fig, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def _write_payload(tmp_path: Path, **changes) -> Path:
    write_record(tmp_path, _record())
    path = tmp_path / "summary.json"
    payload = json.loads(path.read_text())
    payload.update(changes)
    path.write_text(json.dumps(payload))
    return path


def test_a_newer_version_is_refused_naming_the_file(tmp_path):
    path = _write_payload(tmp_path, version=VERSION + 1)
    with pytest.raises(RecordError, match=f"{path}.*newer lmc.*upgrade lmc"):
        read_record(tmp_path)


@pytest.mark.parametrize("schema", ["other.results", None])
def test_an_unknown_schema_is_refused_naming_the_file(tmp_path, schema):
    path = _write_payload(tmp_path, schema=schema)
    with pytest.raises(RecordError, match=f"{path} is not an lmc.results record.*rerun"):
        read_record(path)


def test_a_file_of_the_old_layout_and_non_strict_json_are_refused(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"summary": {"loss": 1.0}, "paths": {}}))
    with pytest.raises(RecordError, match="schema None"):
        read_record(path)
    path.write_text('{"schema": "lmc.results", "version": 1, "summary": {"x": NaN}}')
    with pytest.raises(RecordError, match=f"{path} is not strict JSON"):
        read_record(path)
    _write_payload(tmp_path, series=None)
    with pytest.raises(RecordError, match="incomplete lmc.results record"):
        read_record(path)


def test_scalar_summary_and_long_rows():
    record = _record(summary={"loss": 1.0, "n": 2, "rounds": [{"chosen": 0}], "name": "x"})
    assert record.scalar_summary() == {"loss": 1.0, "n": 2, "name": "x"}
    table = record.series_table("path")
    assert table.columns == ["path", "alpha", "metric", "value"]
    assert table.rows[:2] == [["naive", 0.0, "test/loss", 0.1], ["naive", 0.5, "test/loss", 0.4]]
    assert len(table.rows) == 6
