"""A study folder's results aggregated for reports: the planned jobs with their status, the
series of every done job in long format, and per-cell statistics over replicates (mean, sample
standard deviation, 95 % Student-t interval), with failed and missing jobs counted per cell.

A cell is a stage, the values of its ``by`` keys (by default every coordinate key of the stage
but its replicate axis: ``seed_everything`` for trainings, the selection's ``vary`` key for an
evaluate stage) and a metric. Non-finite values are excluded from the statistics and counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from lmc.io import atomic_path
from lmc.results import read_record
from lmc.results.record import RECORD_FILE
from lmc.studies.reporting.results import results
from lmc.studies.running.store import STUDY_FILE, StudyStore
from lmc.studies.spec.schema import PARENT_PREFIX, SPAWN_EPOCH, TRAIN_STAGE, Study, StudyError

SEED_KEY = "seed_everything"
STAT_COLUMNS = ("n", "n_nonfinite", "mean", "std", "ci_low", "ci_high")
CONFIDENCE = 0.95


def _coordinate_keys(plan: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for job in plan:
        keys += [k for k in job["coordinates"] if k not in keys]
    return keys


def _frame(rows: list[dict[str, Any]], columns: list[str], coords: list[str]) -> pd.DataFrame:
    """``rows`` as a frame; a coordinate column some jobs lack keeps its values as objects, so
    widths stay 4 and 8 (not 4.0) beside the ``None`` of another stage's jobs."""
    frame = pd.DataFrame(rows, columns=columns)
    for key in coords:
        values = [row.get(key) for row in rows]
        if any(v is None for v in values):
            frame[key] = pd.Series(values, index=frame.index, dtype=object)
    return frame


def job_table(root: str | Path) -> pd.DataFrame:
    """One row per planned job of the study folder ``root``: ``stage``, ``job``, every
    coordinate key, ``status`` (done, failed, running: begun while a live process holds the
    folder's lock, else pending, as :func:`lmc.studies.running.store.status` counts), ``error`` (of a
    failed job, else ``None``), ``seconds`` (NaN when not recorded), ``started``, ``finished``.
    """
    store = StudyStore(root)
    plan = store.plan()
    keys = _coordinate_keys(plan)
    live = store.holder() is not None
    rows = []
    for job in plan:
        rec = store.record(job) or {}
        state, error = rec.get("status"), rec.get("error")
        if state not in ("done", "failed"):
            state = "running" if live and store.job_dir(job).is_dir() else "pending"
        elif state == "done" and (why := store.damage(job)):
            state, error = "failed", f"damaged: {why} (`lmc study run` redoes it)"
        seconds = rec.get("seconds")
        rows.append(
            {
                "stage": job["stage"],
                "job": job["id"],
                **{k: job["coordinates"].get(k) for k in keys},
                "status": state,
                "error": error if state == "failed" else None,
                "seconds": float(seconds) if isinstance(seconds, (int, float)) else math.nan,
                "started": rec.get("started"),
                "finished": rec.get("finished"),
            }
        )
    columns = ["stage", "job", *keys, "status", "error", "seconds", "started", "finished"]
    return _frame(rows, columns, keys)


def series_table(root: str | Path, stage: str | None = None) -> pd.DataFrame:
    """The series of every done job (of ``stage``, if given) of the study folder ``root`` whose
    run folder holds a ``summary.json``, in long format: ``stage``, ``job``, the coordinate
    keys, ``series`` (its name, e.g. ``naive``), ``axis`` (``alpha``, ``t``, ``n``), ``x``,
    ``metric``, ``value`` (missing and non-finite values are NaN). Damaged jobs (outputs that
    do not read) are left out: :func:`job_table` lists them as failed, with why.
    """
    store = StudyStore(root)
    plan = [j for j in store.plan() if stage is None or j["stage"] == stage]
    keys = _coordinate_keys(plan)
    rows = []
    for job in plan:
        if not store.is_done(job) or store.damage(job):
            continue  # a damaged job is a failed one in job_table, with why
        run_dir = store.run_dir(job)
        if not (run_dir / RECORD_FILE).is_file():
            continue
        record = read_record(run_dir)
        coords = {k: job["coordinates"].get(k) for k in keys}
        for name, x, metric, value in record.series_rows():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            rows.append(
                {
                    "stage": job["stage"],
                    "job": job["id"],
                    **coords,
                    "series": name,
                    "axis": record.series[name].axis,
                    "x": x,
                    "metric": metric,
                    "value": float(value) if number else math.nan,
                }
            )
    columns = ["stage", "job", *keys, "series", "axis", "x", "metric", "value"]
    return _frame(rows, columns, keys)


def cell_key(value: Any) -> Hashable:
    """A hashable stand-in for a coordinate value: lists (a merge group's seeds) and mappings
    become tuples, NaN becomes ``None``; equal values give equal keys (``4 == 4.0``)."""
    if isinstance(value, (list, tuple)):
        return tuple(cell_key(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), cell_key(v)) for k, v in value.items()))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.ndarray):
        return tuple(cell_key(v) for v in value.tolist())
    return value


def interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> dict[str, float]:
    """``n``, ``n_nonfinite``, ``mean``, ``std`` (ddof 1) and the two-sided Student-t
    interval ``mean ± t_{(1+confidence)/2, n-1} std / sqrt(n)`` of the finite ``values``;
    ``std`` and the interval are NaN for fewer than two finite values, the mean for none."""
    array = np.asarray(values, dtype=float)
    finite = array[np.isfinite(array)]
    n = int(finite.size)
    mean = float(finite.mean()) if n else math.nan
    std = float(finite.std(ddof=1)) if n >= 2 else math.nan
    if n >= 2:
        half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
        low, high = mean - half, mean + half
    else:
        low = high = math.nan
    return {
        "n": n,
        "n_nonfinite": int(array.size - n),
        "mean": mean,
        "std": std,
        "ci_low": low,
        "ci_high": high,
    }


def _numbers(column: pd.Series) -> np.ndarray:
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def summarize(
    table: pd.DataFrame,
    by: Sequence[str],
    jobs: pd.DataFrame | None = None,
    value: str = "value",
) -> pd.DataFrame:
    """Statistics of ``table[value]`` per cell over the rows left in it (e.g. over seeds).

    A cell is a combination of the ``by`` columns, ``metric`` and, when ``table`` has it,
    ``stage``. Per cell: ``n`` finite values, ``n_nonfinite`` values excluded (NaN, inf, not a
    number), their ``mean``, ``std`` (ddof 1) and 95 % Student-t interval ``ci_low``,
    ``ci_high`` (:func:`interval`). Cells appear in the order of their first row; coordinate
    values stay as given (a list stays a list).

    Args:
        table: a tidy table (:func:`lmc.studies.reporting.results.results`, :func:`series_table`).
        by: the columns that make a cell besides ``metric`` (and ``stage``).
        jobs: a :func:`job_table`; adds ``n_failed`` and ``n_missing``: the jobs of the cell's
            stage (of any stage when ``table`` has none) with its ``by`` values that failed, or
            are neither done nor failed. A combination of ``by`` values whose jobs left no row
            (all failed, say) gets a row per metric of its stage (one with no metric if the
            stage has none) with ``n`` 0, so no failure disappears from the summary.
        value: the column of values.

    Raises:
        StudyError: a ``by`` column (or ``metric`` or ``value``) is not in ``table``, or a
            ``by`` column (or ``status``) not in ``jobs``.
    """
    by = [c for c in by if c not in ("stage", "metric")]
    cells = (["stage"] if "stage" in table.columns else []) + [*by, "metric"]
    missing = [c for c in (*cells, value) if c not in table.columns]
    if missing:
        raise StudyError(
            f"cannot summarize by {missing}: not columns of the table; its columns: "
            f"{', '.join(map(str, table.columns))}"
        )
    values = _numbers(table[value]) if len(table) else np.zeros(0)
    groups: dict[tuple, list[int]] = {}
    first: dict[tuple, tuple] = {}
    for i, row in enumerate(table[cells].itertuples(index=False, name=None)):
        key = tuple(cell_key(v) for v in row)
        groups.setdefault(key, []).append(i)
        first.setdefault(key, row)
    out = [{**dict(zip(cells, first[key])), **interval(values[idx])} for key, idx in groups.items()]
    if jobs is not None:
        out = _count_jobs(out, cells, by, jobs)
    stat_columns = [*STAT_COLUMNS, *(("n_failed", "n_missing") if jobs is not None else ())]
    frame = pd.DataFrame(out, columns=[*cells, *stat_columns])
    for column in ("n", "n_nonfinite", "n_failed", "n_missing"):
        if column in frame:
            frame[column] = frame[column].astype(int)
    return frame


def _count_jobs(
    out: list[dict[str, Any]], cells: list[str], by: list[str], jobs: pd.DataFrame
) -> list[dict[str, Any]]:
    """Add ``n_failed`` and ``n_missing`` to the cells ``out``, and a row per metric for every
    stage and ``by`` values with jobs but no row (see :func:`summarize`)."""
    staged = "stage" in cells
    place = (["stage"] if staged else []) + by
    absent = [c for c in (*place, "status") if c not in jobs.columns]
    if absent:
        raise StudyError(
            f"the jobs table has no column {absent}, so the jobs of a cell cannot be counted; "
            f"give a job_table (its columns: {', '.join(map(str, jobs.columns))})"
        )
    failed: dict[tuple, int] = {}
    missing: dict[tuple, int] = {}
    seen: dict[tuple, tuple] = {}
    for row in jobs[[*place, "status"]].itertuples(index=False, name=None):
        *where, state = row
        key = tuple(cell_key(v) for v in where)
        if state == "failed":
            failed[key] = failed.get(key, 0) + 1
        elif state != "done":
            missing[key] = missing.get(key, 0) + 1
        seen.setdefault(key, tuple(where))
    has_rows = {tuple(cell_key(r[c]) for c in place) for r in out}
    metrics: dict[Any, list[Any]] = {}
    for r in out:
        stage_metrics = metrics.setdefault(cell_key(r["stage"]) if staged else None, [])
        if r["metric"] not in stage_metrics:
            stage_metrics.append(r["metric"])
    extra = []
    for key, where in seen.items():
        if key in has_rows or not (failed.get(key) or missing.get(key)):
            continue
        stage = key[0] if staged else None
        for metric in metrics.get(stage) or [None]:
            extra.append({**dict(zip(place, where)), "metric": metric, **interval([])})
    for r in [*out, *extra]:
        key = tuple(cell_key(r[c]) for c in place)
        r["n_failed"] = failed.get(key, 0)
        r["n_missing"] = missing.get(key, 0)
    return [*out, *extra]


StudyLike = Study | Mapping[str, Any] | str | Path


def _study_dict(study: StudyLike) -> Mapping[str, Any] | Study:
    """A study as a :class:`Study`, or as the plain YAML of a study file or of a study folder's
    copy (``<folder>/study.yaml``): read as plain YAML, so a report works even after the base
    configs it names have moved."""
    if isinstance(study, (Study, Mapping)):
        return study
    path = Path(study)
    if path.is_dir():
        path = path / STUDY_FILE
    if not path.is_file():
        raise StudyError(f"no study file at {path} (give a study file or a study folder)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise StudyError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, Mapping):
        raise StudyError(f"{path} is no study file (not a mapping)")
    return data


def _selection(stage: Mapping[str, Any]) -> Mapping[str, Any]:
    return stage.get("pairs") or stage.get("groups") or {}


def stage_keys(study: StudyLike) -> dict[str, tuple[str, ...]]:
    """Every stage's coordinate keys, in the order jobs carry them: the train grid's; a spawn
    stage's parent keys (``parent:<key>`` when it sets the key again), ``spawn_epoch``, its
    own grid's; an evaluate stage's ``over`` keys, its ``vary`` key and its own grid's.

    Args:
        study: a :class:`Study`, the plain YAML of a study file, a study file or a study folder.
    """
    data = _study_dict(study)
    if isinstance(data, Study):
        return {name: tuple(keys) for name, keys in data.stage_keys().items()}
    train = list((data.get("train") or {}).get("grid") or {})
    keys = {TRAIN_STAGE: tuple(train)}
    for spawn in data.get("spawn") or []:
        grid = list(spawn.get("grid") or {})
        parent = [PARENT_PREFIX + k if k in grid else k for k in train]
        keys[spawn["name"]] = (*parent, SPAWN_EPOCH, *grid)
    for stage in data.get("evaluate") or []:
        select = _selection(stage)
        own = list(stage.get("grid") or {})
        keys[stage["name"]] = (*(select.get("over") or []), select.get("vary"), *own)
    return keys


def _replicates(data: Mapping[str, Any] | Study, stage: str) -> tuple[str, ...]:
    if isinstance(data, Study):
        for ev in data.evaluate:
            if ev.name == stage:
                return (ev.select.vary,)
    else:
        for ev in data.get("evaluate") or []:
            if ev.get("name") == stage:
                # vary is required: a study file as validated when it ran
                return (cast(str, _selection(ev).get("vary")),)
    keys = stage_keys(data).get(stage, ())
    return (SEED_KEY,) if SEED_KEY in keys else ()


def seed_keys(study: StudyLike, stage: str | None = None) -> tuple[str, ...]:
    """The replicate axes: the coordinate keys a summary averages over. For a training stage
    (train or spawn) ``seed_everything`` when it has it, for an evaluate stage its selection's
    ``vary`` key. Without ``stage``, those of every stage (each once, in stage order)."""
    data = _study_dict(study)
    stages = [stage] if stage is not None else list(stage_keys(data))
    found: list[str] = []
    for name in stages:
        found += [k for k in _replicates(data, name) if k not in found]
    return tuple(found)


def default_by(study: StudyLike, stage: str) -> list[str]:
    """The keys ``stage``'s summary is grouped by: its coordinate keys but its replicate axes
    (:func:`seed_keys`).

    Raises:
        StudyError: the study has no stage ``stage``.
    """
    data = _study_dict(study)
    keys = stage_keys(data)
    if stage not in keys:
        raise StudyError(f"no stage {stage!r} in the study; its stages: {', '.join(keys)}")
    skip = set(seed_keys(data, stage))
    return [k for k in keys[stage] if k not in skip]


def stage_summary(
    tidy: pd.DataFrame, jobs: pd.DataFrame, study: StudyLike, stages: Sequence[str]
) -> pd.DataFrame:
    """:func:`summarize` of each of ``stages`` grouped by :func:`default_by`, with failed and
    missing jobs counted, concatenated (columns: ``stage``, every ``by`` key, ``metric``, the
    statistics)."""
    data = _study_dict(study)
    parts = []
    for stage in stages:
        part = summarize(
            tidy[tidy["stage"] == stage],
            default_by(data, stage),
            jobs=jobs[jobs["stage"] == stage],
        )
        if len(part):
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["stage", "metric", *STAT_COLUMNS, "n_failed", "n_missing"])
    frame = pd.concat(parts, ignore_index=True)
    stat_columns = [*STAT_COLUMNS, "n_failed", "n_missing"]
    keys = [c for c in frame.columns if c not in ("stage", "metric", *stat_columns)]
    return frame[["stage", *keys, "metric", *stat_columns]]


def _has_parquet() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists and mappings in object columns as JSON text (Parquet wants one type a column)."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = [
                json.dumps(v, default=str) if isinstance(v, (list, tuple, Mapping)) else v
                for v in out[column]
            ]
            if any(isinstance(v, (int, float)) for v in out[column]) and any(
                isinstance(v, str) for v in out[column]
            ):
                out[column] = out[column].map(lambda v: v if v is None else str(v))
    return out


def _write(frame: pd.DataFrame, path: Path, write: Callable[[pd.DataFrame, Path], None]) -> Path:
    with atomic_path(path) as tmp:
        write(frame, tmp)
    return path


def study_tables(root: str | Path) -> dict[str, pd.DataFrame]:
    """The study folder ``root``'s tables, each read once: ``results`` (the tidy table),
    ``jobs`` (:func:`job_table`), ``summary`` (per stage over its replicates,
    :func:`stage_summary`) and ``series`` (:func:`series_table`, possibly empty)."""
    root = Path(root)
    jobs = job_table(root)
    tidy = results(root)
    stages = list(dict.fromkeys(jobs["stage"]))
    return {
        "results": tidy,
        "jobs": jobs,
        "summary": stage_summary(tidy, jobs, root, stages),
        "series": series_table(root),
    }


def write_tables(
    root: str | Path, out_dir: str | Path, tables: Mapping[str, pd.DataFrame] | None = None
) -> dict[str, Path]:
    """Write the study folder ``root``'s tables (:func:`study_tables`, or ``tables`` already
    read from it) into ``out_dir``: ``results.csv``, ``jobs.csv``, ``summary.csv`` and
    ``series.csv`` when a done job has series; each also as ``.parquet`` when pyarrow is
    installed. Every file is written atomically.

    Returns:
        What was written: ``results``, ``jobs``, ``summary``, ``series`` -> the CSV file,
        ``results.parquet`` (and so on) -> the Parquet file.
    """
    out_dir = Path(out_dir)
    tables = study_tables(root) if tables is None else tables
    tables = {name: frame for name, frame in tables.items() if name != "series" or len(frame)}
    parquet = _has_parquet()
    written: dict[str, Path] = {}
    for name, frame in tables.items():
        written[name] = _write(
            frame, out_dir / f"{name}.csv", lambda f, p: f.to_csv(p, index=False)
        )
        if parquet:
            written[f"{name}.parquet"] = _write(
                _plain(frame),
                out_dir / f"{name}.parquet",
                lambda f, p: f.to_parquet(p, index=False),
            )
    return written
