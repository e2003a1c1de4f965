"""A study's results as one tidy table: one row per done job and metric, with the job's grid
coordinates as columns. Train jobs give the last logged value of each column of their CSV
logger's ``metrics.csv``; evaluate jobs the flat scalars of their ``summary.json``."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lmc.results import read_record
from lmc.results.record import json_pointer
from lmc.studies.running.store import StudyStore

_NOT_METRICS = {"epoch", "step"}


def last_logged(metrics_csv: Path) -> dict[str, float]:
    """The last non-empty value of each metric column of a CSV logger's ``metrics.csv``."""
    last: dict[str, float] = {}
    with metrics_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key in _NOT_METRICS or value in (None, ""):
                    continue
                try:
                    last[key] = float(value)
                except ValueError:
                    continue
    return last


def job_metrics(run_dir: Path) -> dict[str, Any]:
    """The metrics of one run folder: ``metrics.csv`` (last values), then the scalars of its
    ``summary.json`` when it has one."""
    metrics: dict[str, Any] = {}
    if (run_dir / "metrics.csv").is_file():
        metrics.update(last_logged(run_dir / "metrics.csv"))
    if (run_dir / "summary.json").is_file():
        record = read_record(run_dir)
        diverged = set(record.nonfinite)
        for key, value in record.scalar_summary().items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) and value is not None:
                continue
            if value is None and json_pointer("/summary", key) not in diverged:
                continue  # not measured by this task (e.g. accuracy of a regression)
            metrics[key] = math.nan if value is None else float(value)
    return metrics


def hashable(value: Any) -> Any:
    """A coordinate as a table cell that ``groupby`` accepts: a list (a merge's or a pair's
    seeds, in the job's order: the first is the reference) as a tuple, a mapping as a tuple of
    its sorted items; other values as they are."""
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    return value


def endpoints(job: Mapping[str, Any]) -> str:
    """The models a job's metrics were measured on, as space-separated job ids: an evaluate
    job's inputs (the trained models it selects), else the job itself (a training, a member of
    a population, a spawned child). Two replicates that share one are not independent
    (:mod:`lmc.studies.claims.verdicts`)."""
    if job.get("inputs") and job.get("spawn_epoch") is None and job.get("command") != "member":
        return " ".join(job["inputs"])
    return str(job["id"])


def results(root: str | Path) -> pd.DataFrame:
    """The study folder ``root``'s results: columns ``stage``, ``job``, the grid keys,
    ``endpoints`` (:func:`endpoints`), ``metric``, ``value``; one row per done job and metric
    (pending and failed jobs have none).
    List-valued coordinates (a merge's members) are tuples, so the table groups by any column
    (within a stage; across stages ``groupby(..., sort=False)``, as ints and tuples do not sort
    together).
    """
    store = StudyStore(root)
    jobs = store.plan()
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job["coordinates"] if k not in keys]
    rows = []
    for job in jobs:
        if not store.is_done(job) or store.damage(job):
            continue  # a damaged job: listed by job_table and status, redone by the next run
        coords = {k: hashable(job["coordinates"].get(k)) for k in keys}
        ends = endpoints(job)
        for metric, value in job_metrics(store.run_dir(job)).items():
            rows.append(
                {
                    "stage": job["stage"],
                    "job": job["id"],
                    **coords,
                    "endpoints": ends,
                    "metric": metric,
                    "value": value,
                }
            )
    return pd.DataFrame(rows, columns=["stage", "job", *keys, "endpoints", "metric", "value"])
