"""Logging of a multi-model merge sweep: metrics, W&B table/plots/image, ``merge.png`` and
``summary.json`` in the run directory (004 Fig. 3, 4, 6-10)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning as L
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from lightning.pytorch.loggers import WandbLogger  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from lmc.merging.evaluate import MergeEvaluation, MergeSweep  # noqa: E402
from lmc.tasks.rundir import run_dir  # noqa: E402

PANELS = (
    ("acc", "accuracy of the merge", True),
    ("loss_gap", "merged loss - mean original loss", False),
    ("pairwise_loss_gap", "mean pairwise merged loss - mean original loss", False),
    ("sharpness", "sharpness tr(H ⊙ θθᵀ)", False),
)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _by_method(sweep: MergeSweep) -> dict[str, list[MergeEvaluation]]:
    out: dict[str, list[MergeEvaluation]] = {}
    for ev in sweep.evaluations:
        out.setdefault(ev.method, []).append(ev)
    return {m: sorted(evs, key=lambda e: e.n) for m, evs in out.items()}


def merge_figure(sweep: MergeSweep, split: str, path: Path) -> Path:
    """Metrics vs number of models per method, and the distance-ratio and angle histograms
    of the largest merge of every method."""
    methods = _by_method(sweep)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    flat = axes.ravel()
    for ax, (metric, title, originals) in zip(flat, PANELS):
        key = metric if metric == "sharpness" else f"{split}/{metric}"
        for method, evs in methods.items():
            pts = [(e.n, e.metrics.get(key)) for e in evs if _finite(e.metrics.get(key))]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        base = "originals_sharpness" if metric == "sharpness" else f"{split}/originals_{metric}"
        if originals or metric == "sharpness":
            evs = next(iter(methods.values()))
            pts = [(e.n, e.metrics.get(base)) for e in evs if _finite(e.metrics.get(base))]
            if pts:
                ax.plot(*zip(*pts), linestyle="--", color="gray", label="originals (mean)")
        if "gap" in metric:
            ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_xlabel("number of models n")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title} ({split})" if metric != "sharpness" else title, fontsize=9)
        ax.grid(alpha=0.3)
    flat[0].legend(fontsize=7)
    for ax, (attr, title) in zip(
        flat[4:], (("distance_ratios", "L2 distance / mean"), ("angles", "triplet angles (deg)"))
    ):
        for method, evs in methods.items():
            values = [v for v in getattr(evs[-1], attr) if math.isfinite(v)]
            if values:
                ax.hist(values, bins=20, alpha=0.5, label=f"{method} (n={evs[-1].n})")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.suptitle("Merging n models modulo permutations")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def merge_rows(sweep: MergeSweep) -> list[list[Any]]:
    """Long-format rows: method, n, metric, value."""
    return [
        [ev.method, ev.n, key, _finite(value)]
        for ev in sweep.evaluations
        for key, value in sorted(ev.metrics.items())
    ]


def log_merge(
    trainer: L.Trainer,
    sweep: MergeSweep,
    extra: dict[str, Any] | None = None,
    prefix: str = "merge",
    split: str = "test",
) -> Path:
    """Log the sweep to every logger (``{prefix}/{method}/n{n}/{metric}``), write
    ``summary.json`` and ``merge.png`` into the run directory, and on W&B a table, line plots
    vs n and the figure. Returns the run directory."""
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: _finite(v) for k, v in sweep.summary().items()}
    payload = {
        "summary": summary,
        "evaluations": [
            {
                "method": ev.method,
                "n": ev.n,
                "metrics": {k: _finite(v) for k, v in ev.metrics.items()},
                "distance_ratios": [_finite(v) for v in ev.distance_ratios],
                "angles": [_finite(v) for v in ev.angles],
            }
            for ev in sweep.evaluations
        ],
        "originals": {
            "metrics": sweep.originals.metrics,
            "sharpness": sweep.originals.sharpness,
        },
        **(extra or {}),
    }
    (out / "summary.json").write_text(json.dumps(payload, indent=2, default=_finite))
    splits = {k.split("/")[0] for ev in sweep.evaluations for k in ev.metrics if "/" in k}
    shown = split if split in splits else sorted(splits)[-1]
    figure = merge_figure(sweep, shown, out / "merge.png")
    flat = {f"{prefix}/{k}": v for k, v in summary.items() if v is not None}
    for logger in trainer.loggers:
        logger.log_metrics(flat, step=max(trainer.global_step, 0))
        if isinstance(logger, WandbLogger):
            _log_wandb(logger, sweep, figure, prefix, shown, flat)
    return out


def _log_wandb(
    logger: WandbLogger,
    sweep: MergeSweep,
    figure: Path,
    prefix: str,
    split: str,
    flat: dict[str, float],
) -> None:
    import wandb

    run = logger.experiment
    payload: dict[str, Any] = {
        f"{prefix}/table": wandb.Table(
            columns=["method", "n", "metric", "value"], data=merge_rows(sweep)
        ),
        f"{prefix}/figure": wandb.Image(str(figure)),
    }
    methods = _by_method(sweep)
    ns = sorted({ev.n for ev in sweep.evaluations})
    for metric in (f"{split}/acc", f"{split}/loss_gap", f"{split}/pairwise_loss_gap", "sharpness"):
        keys, ys = [], []
        for method, evs in methods.items():
            vals = {e.n: _finite(e.metrics.get(metric)) for e in evs}
            if any(v is not None for v in vals.values()):
                keys.append(method)
                ys.append([vals.get(n) if vals.get(n) is not None else float("nan") for n in ns])
        if keys:
            payload[f"{prefix}/plot/{metric.replace('/', '_')}"] = wandb.plot.line_series(
                xs=ns, ys=ys, keys=keys, title=f"{metric} vs n", xname="n"
            )
    run.log(payload)
    for k, v in flat.items():
        run.summary[k] = v
