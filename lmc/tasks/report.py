"""Report of an interpolation study: its :class:`~lmc.results.RunRecord` (per-alpha series of
every path, barriers, merges), ``interpolation.png`` and the loggers (``interp/...``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from lmc.interpolation.study import StudyResult
from lmc.results import RunRecord, Series, Table
from lmc.results.figures import interpolation_figure
from lmc.results.logging import LinePlot, publish, run_config
from lmc.tasks.rundir import run_dir


def study_record(result: StudyResult, config: dict[str, Any] | None = None) -> RunRecord:
    """The record of an interpolation study: one ``alpha`` series per path, a barrier table,
    and (as details) ``barriers``, ``paths`` (alphas and metrics per path) and ``merges``."""
    paths = result.paths
    barrier_keys = list(next(iter(next(iter(paths.values())).barriers.values())))
    return RunRecord(
        kind="interpolation",
        summary=dict(result.summary),
        series={n: Series("alpha", list(r.alphas), dict(r.metrics)) for n, r in paths.items()},
        tables={
            "barriers": Table(
                ["path", "split", *barrier_keys],
                [
                    [n, split, *b.values()]
                    for n, r in paths.items()
                    for split, b in r.barriers.items()
                ],
            )
        },
        figures={"figure": "interpolation.png"},
        config=config or {},
        timings=dict(result.timings),
        details={
            "barriers": {n: r.barriers for n, r in paths.items()},
            "paths": {n: {"alphas": r.alphas, **r.metrics} for n, r in paths.items()},
            "merges": result.merges,
        },
    )


def log_study(trainer: L.Trainer, result: StudyResult, prefix: str = "interp") -> Path:
    """Write the study's record (``summary.json``) and ``interpolation.png`` into the run
    directory and log it: per-alpha rows ``{prefix}/{path}/{metric}``, the summary
    (barriers), and on W&B the long table, the barrier table, line plots vs alpha and the
    figure. Returns the run directory."""
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    record = study_record(result, run_config(trainer, out))
    metrics = next(iter(record.series.values())).values
    plots = [
        LinePlot(
            key.replace("/", "_"),
            f"{key} vs alpha",
            [(n, n, key) for n, s in record.series.items() if key in s.values],
        )
        for key in metrics
    ]
    publish(
        trainer,
        record,
        out,
        {"figure": lambda path: interpolation_figure(record, path)},
        prefix,
        steps={name: name for name in record.series},
        plots=plots,
        tables={"table": record.series_table("path")},
    )
    return out
