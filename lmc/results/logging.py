"""Publishing a :class:`~lmc.results.record.RunRecord` to the run directory and to Lightning
loggers: ``summary.json``, the figures, per-step rows, summary scalars and, on W&B, tables,
line plots, images and the run summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from lmc.results.figures import finite
from lmc.results.record import RunRecord, Table, to_plain, write_record


@dataclass(frozen=True)
class LinePlot:
    """A W&B line plot logged as ``{prefix}/plot/{key}``: one line per ``(label, series,
    metric)`` with that series' axis as x; non-finite points are left out, lines without any
    finite point dropped, and a plot without lines is not logged."""

    key: str
    title: str
    lines: Sequence[tuple[str, str, str]]


#: the record detail naming the prefix its summary was logged under (``{prefix}/{key}``)
LOGGED_AS = "logged_as"


def run_config(trainer: L.Trainer, out: Path) -> dict[str, Any]:
    """The run's config for a record: ``file`` (``config.yaml`` when the run directory ``out``
    holds one, else ``None``) and ``hparams`` (the module's hyper-parameters as plain data)."""
    module = trainer.lightning_module
    hparams = dict(module.hparams) if module is not None else {}
    return {
        "file": "config.yaml" if (out / "config.yaml").is_file() else None,
        "hparams": to_plain(hparams),
    }


def step_rows(record: RunRecord, prefix: str, steps: Mapping[str, str]) -> list[dict[str, float]]:
    """Per point of the axis, ``{prefix}/{axis}`` and the finite values of the ``steps`` series
    as ``{prefix}/{stem}/{metric}`` (``steps`` maps a series name to its stem, ``""`` for none).
    The series must share their axis."""
    named = [(stem, record.series[name]) for name, stem in steps.items()]
    first = named[0][1]
    rows = []
    for i, x in enumerate(first.x):
        row = {f"{prefix}/{first.axis}": x}
        for stem, s in named:
            for metric, values in s.values.items():
                if finite(values[i]) is not None:
                    row["/".join(p for p in (prefix, stem, metric) if p)] = values[i]
        rows.append(row)
    return rows


def summary_metrics(record: RunRecord, prefix: str) -> dict[str, float]:
    """``{prefix}/{name}`` -> value of every finite number (or bool) in the summary."""
    return {
        f"{prefix}/{k}": v
        for k, v in record.summary.items()
        if isinstance(v, bool) or finite(v) is not None
    }


def publish(
    trainer: L.Trainer,
    record: RunRecord,
    out: Path,
    draw: Mapping[str, Callable[[Path], Any]],
    prefix: str,
    *,
    steps: Mapping[str, str] | None = None,
    plots: Sequence[LinePlot] = (),
    tables: Mapping[str, Table] | None = None,
) -> None:
    """Write ``record`` to ``out/summary.json``, draw its figures, and log it to every logger.

    ``draw`` maps a name of ``record.figures`` to a function saving that figure to a path. To
    every logger go the per-step rows of the ``steps`` series (see :func:`step_rows`), then
    the summary numbers at the next step (at the trainer's step when there are no step rows);
    on a :class:`WandbLogger` also the record's tables and ``tables`` (W&B-only views, such as
    the long format of the series) as ``{prefix}/{name}``, the figures as
    ``{prefix}/{name}`` images, the ``plots`` and the summary numbers in ``run.summary``.
    The record notes ``prefix`` as its detail ``logged_as``, so a study's W&B Report asks for
    the keys the task logged (``merge/otfusion/n2/test/acc``, not a stage kind's guess). Call it on
    global rank zero only.
    """
    out.mkdir(parents=True, exist_ok=True)
    record.details[LOGGED_AS] = prefix  # what reads the record back finds the logged keys
    write_record(out, record)
    figures = {name: draw[name](out / record.figures[name]) for name in record.figures}
    rows = step_rows(record, prefix, steps) if steps else []
    summary = summary_metrics(record, prefix)
    for logger in trainer.loggers:
        for i, row in enumerate(rows):
            logger.log_metrics(row, step=i)
        logger.log_metrics(summary, step=len(rows) if rows else max(trainer.global_step, 0))
        if isinstance(logger, WandbLogger):
            all_tables = {**record.tables, **(tables or {})}
            _log_wandb(logger, record, figures, all_tables, plots, summary, prefix)


def _line_series(record: RunRecord, plot: LinePlot) -> Any:
    import wandb

    xs, ys, keys = [], [], []
    for label, name, metric in plot.lines:
        s = record.series[name]
        pts = [(x, v) for x, v in zip(s.x, s.values.get(metric, [])) if finite(v) is not None]
        if pts:
            xs.append([x for x, _ in pts])
            ys.append([v for _, v in pts])
            keys.append(label)
    if not keys:
        return None
    axis = record.series[plot.lines[0][1]].axis
    return wandb.plot.line_series(xs=xs, ys=ys, keys=keys, title=plot.title, xname=axis)


def _log_wandb(
    logger: WandbLogger,
    record: RunRecord,
    figures: Mapping[str, Path],
    tables: Mapping[str, Table],
    plots: Sequence[LinePlot],
    summary: Mapping[str, float],
    prefix: str,
) -> None:
    import wandb

    run = logger.experiment
    payload: dict[str, Any] = {
        f"{prefix}/{name}": wandb.Table(columns=list(t.columns), data=to_plain(t.rows))
        for name, t in tables.items()
    }
    payload.update({f"{prefix}/{name}": wandb.Image(str(p)) for name, p in figures.items()})
    for plot in plots:
        chart = _line_series(record, plot)
        if chart is not None:
            payload[f"{prefix}/plot/{plot.key}"] = chart
    run.log(payload)
    for key, value in summary.items():
        run.summary[key] = value
