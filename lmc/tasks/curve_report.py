"""Report of a curve evaluation: its :class:`~lmc.results.RunRecord` (per-t series, summary,
arc-length weights, the plane), ``curve.png`` and ``plane.png``, and the loggers."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L

from lmc.curves.evaluate import CurveEvaluation
from lmc.curves.plane import PlaneResult
from lmc.results import RunRecord, Series, Table
from lmc.results.figures import curve_figure, plane_figure
from lmc.results.logging import LinePlot, publish, run_config
from lmc.tasks.rundir import run_dir


def curve_record(
    ev: CurveEvaluation,
    plane: PlaneResult | None = None,
    extra: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> RunRecord:
    """The record of a curve evaluation: the summary (with the task's ``extra``), one ``t``
    series ``"curve"``, and (as details) ``ts``, ``metrics``, ``arc_length_weights`` and, when
    evaluated, ``plane``."""
    details: dict[str, Any] = {"ts": ev.ts, "metrics": ev.metrics, "arc_length_weights": ev.weights}
    figures = {"figure": "curve.png"}
    if plane is not None:
        details["plane"] = asdict(plane)
        figures["plane"] = "plane.png"
    return RunRecord(
        kind="curve",
        summary={**ev.summary, **(extra or {})},
        series={"curve": Series("t", list(ev.ts), dict(ev.metrics))},
        figures=figures,
        config=config or {},
        details=details,
    )


def log_curve(
    trainer: L.Trainer,
    ev: CurveEvaluation,
    plane: PlaneResult | None = None,
    extra: dict[str, Any] | None = None,
    prefix: str = "curve",
) -> Path:
    """Write the curve's record (``summary.json``), ``curve.png`` (and ``plane.png``) into the
    run directory and log it: per-t rows ``{prefix}/{split}/{metric}``, the summary, and on
    W&B a table (t, arc weight, metrics), one line plot per statistic and the figures.
    Returns the run directory."""
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    record = curve_record(ev, plane, extra, run_config(trainer, out))
    keys = list(ev.metrics)
    stats = sorted({k.split("/", 1)[1] for k in keys})
    plots = [
        LinePlot(
            stat,
            f"{stat} along the curve",
            [(k, "curve", k) for k in keys if k.split("/", 1)[1] == stat],
        )
        for stat in stats
    ]
    rows = [
        [t, w, *[ev.metrics[k][i] for k in keys]] for i, (t, w) in enumerate(zip(ev.ts, ev.weights))
    ]
    draw = {"figure": lambda path: curve_figure(record, path)}
    if plane is not None:
        draw["plane"] = lambda path: plane_figure(record.details["plane"], path)
    publish(
        trainer,
        record,
        out,
        draw,
        prefix,
        steps={"curve": ""},
        plots=plots,
        tables={"table": Table(["t", "arc_weight", *keys], rows)},
    )
    return out
