"""Logging of an interpolation study: per-alpha metrics, W&B plots and table, PNG, JSON."""

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

from lmc.interpolation.study import StudyResult  # noqa: E402
from lmc.tasks.rundir import run_dir  # noqa: E402


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def study_figure(result: StudyResult, path: Path) -> Path:
    """Loss and accuracy vs alpha for every path and split, saved as a PNG."""
    first = next(iter(result.paths.values()))
    splits = sorted({k.split("/")[0] for k in first.metrics})
    stats = ["loss"] + (
        ["acc"]
        if any(_finite(v) is not None for k, vs in first.metrics.items() if "/acc" in k for v in vs)
        else []
    )
    fig, axes = plt.subplots(
        len(stats), len(splits), figsize=(4.5 * len(splits), 3.4 * len(stats)), squeeze=False
    )
    for r, stat in enumerate(stats):
        for c, split in enumerate(splits):
            ax = axes[r][c]
            for name, res in result.paths.items():
                ax.plot(res.alphas, res.metrics[f"{split}/{stat}"], marker=".", label=name)
                raw = res.metrics.get(f"{split}/{stat}_raw")
                if raw is not None:
                    ax.plot(res.alphas, raw, linestyle="--", alpha=0.6, label=f"{name} (no repair)")
            ax.set_xlabel("alpha")
            ax.set_ylabel(f"{split} {stat}")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Interpolation between models: naive vs matched")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def study_rows(result: StudyResult) -> list[list[Any]]:
    """Long-format rows: path, alpha, metric, value."""
    rows = []
    for name, res in result.paths.items():
        for key, values in res.metrics.items():
            for alpha, v in zip(res.alphas, values):
                rows.append([name, alpha, key, _finite(v)])
    return rows


def log_study(trainer: L.Trainer, result: StudyResult, prefix: str = "interp") -> Path:
    """Log per-alpha curves, barriers, W&B line plots and table, the PNG and ``summary.json``.

    Returns the run directory where ``summary.json`` and ``interpolation.png`` were written.
    """
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: _finite(v) for k, v in result.summary.items()}
    payload = {
        "summary": summary,
        "barriers": {n: r.barriers for n, r in result.paths.items()},
        "paths": {n: {"alphas": r.alphas, **r.metrics} for n, r in result.paths.items()},
        "merges": result.merges,
    }
    (out / "summary.json").write_text(json.dumps(payload, indent=2, default=_finite))
    figure = study_figure(result, out / "interpolation.png")
    for logger in trainer.loggers:
        alphas = next(iter(result.paths.values())).alphas
        for i, alpha in enumerate(alphas):
            row = {f"{prefix}/alpha": alpha}
            for name, res in result.paths.items():
                for k, v in res.metrics.items():
                    if _finite(v[i]) is not None:
                        row[f"{prefix}/{name}/{k}"] = v[i]
            logger.log_metrics(row, step=i)
        logger.log_metrics(
            {f"{prefix}/{k}": v for k, v in summary.items() if v is not None}, step=len(alphas)
        )
        if isinstance(logger, WandbLogger):
            _log_wandb(logger, result, figure, prefix)
    return out


def _log_wandb(logger: WandbLogger, result: StudyResult, figure: Path, prefix: str) -> None:
    import wandb

    run = logger.experiment
    table = wandb.Table(columns=["path", "alpha", "metric", "value"], data=study_rows(result))
    payload: dict[str, Any] = {
        f"{prefix}/table": table,
        f"{prefix}/figure": wandb.Image(str(figure)),
    }
    first = next(iter(result.paths.values()))
    for key in first.metrics:
        names = [n for n in result.paths if key in result.paths[n].metrics]
        ys = [[_finite(v) or 0.0 for v in result.paths[n].metrics[key]] for n in names]
        if all(_finite(v) is None for v in first.metrics[key]):
            continue
        payload[f"{prefix}/plot/{key.replace('/', '_')}"] = wandb.plot.line_series(
            xs=first.alphas, ys=ys, keys=names, title=f"{key} vs alpha", xname="alpha"
        )
    barrier_rows = [
        [n, split, *[_finite(v) for v in b.values()]]
        for n, r in result.paths.items()
        for split, b in r.barriers.items()
    ]
    cols = [
        "path",
        "split",
        *next(iter(next(iter(result.paths.values())).barriers.values())).keys(),
    ]
    payload[f"{prefix}/barriers"] = wandb.Table(columns=cols, data=barrier_rows)
    run.log(payload)
    for k, v in result.summary.items():
        if _finite(v) is not None:
            run.summary[f"{prefix}/{k}"] = v
