"""Report of a multi-model merge sweep: its :class:`~lmc.results.RunRecord` (metrics vs n per
method, evaluations, originals), ``merge.png`` (004 Fig. 3, 4, 6-10) and the loggers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from lmc.merging.evaluate import MergeSweep
from lmc.results import RunRecord, Series
from lmc.results.figures import merge_figure
from lmc.results.logging import LinePlot, publish, run_config
from lmc.tasks.rundir import run_dir

#: the diagnostics each built-in merge method logs beside its metrics (``*``: any text);
#: a method registered elsewhere may log any
BUILTIN_DIAGNOSTICS: dict[str, tuple[str, ...]] = {
    "naive": (),
    "wm_ref": (),
    "mergemany": (),
    "ccmm": (),
    "stemm": ("final_loss", "epoch_seconds", "wm_seconds"),
    "sinkhorn": ("final_loss/model*",),
    "zip": ("same_model/*",),
    "permute": ("correlation/model*/*",),
    "otfusion": ("seconds", "finetune/epochs_per_model"),
    "fedma": ("seconds", "finetune/epochs_per_model"),
}


def merge_metric_names(
    methods: list[str], ns: list[int] | None, evaluation: dict[str, Any]
) -> set[str]:
    """The summary keys a merge sweep of ``methods`` at every n of ``ns`` (``None``: not known
    before it runs) reports with the ``evaluation`` options (a merge task's ``evaluation``
    group as configured), as ``fnmatch`` patterns (``*`` for a model's index or a group's
    name): ``{method}/n{n}/{split}/{acc,loss,...}``, sharpness, geometry and the method's
    diagnostics, and ``originals/model{i}/...``. A study checks its claims against them."""
    splits = list(evaluation.get("splits") or ["train", "test"])
    tasks = evaluation.get("tasks") or []
    stats = ["loss", "acc", *(f"task{j}_acc" for j in range(len(tasks)))]
    per_split = [
        f"{split}/{kind}"
        for split in splits
        for stat in stats
        for kind in (stat, f"originals_{stat}", f"{stat}_gap", f"ensemble_{stat}")
    ]
    if evaluation.get("pairwise", True):
        last = splits[-1]
        per_split += [f"{last}/pairwise_loss", f"{last}/pairwise_acc", f"{last}/pairwise_loss_gap"]
    shared = [*per_split, "distance_mean"]
    shared += [
        f"{g}_{s}" for g in ("distance_ratio", "angle") for s in ("mean", "std", "min", "max")
    ]
    sharp = int(evaluation.get("sharpness_probes") or 0) > 0
    if sharp:
        shared += ["sharpness", "originals_sharpness"]
    names = {
        f"{method}/n{'*' if ns is None else n}/{tail}"
        for method in methods
        for n in (ns or [0])
        for tail in [*shared, *BUILTIN_DIAGNOSTICS.get(method, ("*",))]
    }
    originals = [f"{split}/{stat}" for split in splits for stat in stats]
    names |= {
        f"originals/model*/{tail}" for tail in [*originals, *(["sharpness"] if sharp else [])]
    }
    return names


def sweep_series(sweep: MergeSweep) -> dict[str, Series]:
    """One ``n`` series per method over every n of the sweep (``None`` where a method was not
    evaluated at that n), in the order the methods first appear."""
    ns = sorted({ev.n for ev in sweep.evaluations})
    by_method: dict[str, dict[int, dict[str, float]]] = {}
    for ev in sweep.evaluations:
        by_method.setdefault(ev.method, {})[ev.n] = ev.metrics
    out = {}
    for method, at in by_method.items():
        keys = sorted({k for metrics in at.values() for k in metrics})
        values = {k: [at.get(n, {}).get(k) for n in ns] for k in keys}
        out[method] = Series("n", list(ns), values)
    return out


def sweep_record(
    sweep: MergeSweep, extra: dict[str, Any] | None = None, config: dict[str, Any] | None = None
) -> RunRecord:
    """The record of a merge sweep: flat ``{method}/n{n}/{metric}`` summary, one series per
    method, and (as details) ``evaluations``, ``originals`` and the task's ``extra``."""
    evaluations = [
        {
            "method": ev.method,
            "n": ev.n,
            "metrics": ev.metrics,
            "distance_ratios": ev.distance_ratios,
            "angles": ev.angles,
        }
        for ev in sweep.evaluations
    ]
    originals = {"metrics": sweep.originals.metrics, "sharpness": sweep.originals.sharpness}
    return RunRecord(
        kind="merge",
        summary=sweep.summary(),
        series=sweep_series(sweep),
        figures={"figure": "merge.png"},
        config=config or {},
        details={"evaluations": evaluations, "originals": originals, **(extra or {})},
    )


def log_merge(
    trainer: L.Trainer,
    sweep: MergeSweep,
    extra: dict[str, Any] | None = None,
    prefix: str = "merge",
    split: str = "test",
) -> Path:
    """Write the sweep's record (``summary.json``) and ``merge.png`` into the run directory
    and log the summary (``{prefix}/{method}/n{n}/{metric}``) to every logger; on W&B also
    the long table, line plots vs n and the figure. The figure and plots show ``split``, or
    the last split measured when the sweep lacks it. Returns the run directory."""
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    record = sweep_record(sweep, extra, run_config(trainer, out))
    splits = {k.split("/")[0] for ev in sweep.evaluations for k in ev.metrics if "/" in k}
    shown = split if split in splits else sorted(splits)[-1]
    plots = [
        LinePlot(
            metric.replace("/", "_"), f"{metric} vs n", [(m, m, metric) for m in record.series]
        )
        for metric in (
            f"{shown}/acc",
            f"{shown}/loss_gap",
            f"{shown}/pairwise_loss_gap",
            "sharpness",
        )
    ]
    publish(
        trainer,
        record,
        out,
        {"figure": lambda path: merge_figure(record, shown, path)},
        prefix,
        plots=plots,
        tables={"table": record.series_table("method")},
    )
    return out
