"""Logging of a curve evaluation: per-t metrics, W&B line plots and table, PNGs, summary.json."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lightning.pytorch.loggers import WandbLogger  # noqa: E402

from lmc.curves.evaluate import CurveEvaluation  # noqa: E402
from lmc.curves.plane import PlaneResult  # noqa: E402
from lmc.tasks.rundir import run_dir  # noqa: E402


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _stats(ev: CurveEvaluation) -> list[str]:
    return sorted({k.split("/", 1)[1] for k in ev.metrics})


def curve_figure(ev: CurveEvaluation, path: Path, title: str = "Along the curve") -> Path:
    """Loss and accuracy vs t, one line per split (robust metrics dashed), saved as a PNG."""
    kinds = [k for k in ("loss", "acc") if any(k in s for s in _stats(ev))]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for key, values in ev.metrics.items():
            split, stat = key.split("/", 1)
            if stat not in (kind, f"robust_{kind}"):
                continue
            if all(_finite(v) is None for v in values):
                continue
            style = "--" if stat.startswith("robust") else "-"
            ax.plot(ev.ts, values, style, marker=".", label=key)
        ax.set_xlabel("t")
        ax.set_ylabel(kind)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plane_figure(plane: PlaneResult, path: Path, split: str | None = None) -> Path:
    """Loss and accuracy over the plane (002 Fig. 3) with the models and projected paths."""
    splits = sorted({k.split("/")[0] for k in plane.metrics})
    split = split or ("test" if "test" in splits else splits[-1])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, stat in zip(axes, ("loss", "acc")):
        z = np.asarray(plane.metrics[f"{split}/{stat}"], dtype=float)
        cs = ax.contourf(plane.xs, plane.ys, z, levels=20, cmap="viridis")
        fig.colorbar(cs, ax=ax)
        for label, pts in plane.paths.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "w-", lw=1.5, label=label)
        for name, (x, y) in plane.points.items():
            ax.plot(x, y, "o", color="red", ms=6)
            ax.annotate(
                name, (x, y), color="white", fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
        ax.set_title(f"{split} {stat}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_curve(
    trainer: L.Trainer,
    ev: CurveEvaluation,
    plane: PlaneResult | None = None,
    extra: dict[str, Any] | None = None,
    prefix: str = "curve",
) -> Path:
    """Log per-t rows and the summary to every logger, W&B plots/table/images, and write
    ``summary.json``, ``curve.png`` (and ``plane.png``) into the run directory.

    Returns the run directory.
    """
    out = run_dir(trainer)
    if not trainer.is_global_zero:
        return out
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: _finite(v) for k, v in ev.summary.items()}
    summary.update(extra or {})
    payload: dict[str, Any] = {
        "summary": summary,
        "ts": ev.ts,
        "metrics": {k: [_finite(v) for v in vs] for k, vs in ev.metrics.items()},
        "arc_length_weights": ev.weights,
    }
    if plane is not None:
        payload["plane"] = asdict(plane)
    (out / "summary.json").write_text(json.dumps(payload, indent=2, default=_finite))
    figures = {"figure": curve_figure(ev, out / "curve.png")}
    if plane is not None:
        figures["plane"] = plane_figure(plane, out / "plane.png")
    for logger in trainer.loggers:
        for i, t in enumerate(ev.ts):
            row = {f"{prefix}/t": t}
            row.update(
                {f"{prefix}/{k}": v[i] for k, v in ev.metrics.items() if _finite(v[i]) is not None}
            )
            logger.log_metrics(row, step=i)
        numeric = {f"{prefix}/{k}": v for k, v in summary.items() if _finite(v) is not None}
        logger.log_metrics(numeric, step=len(ev.ts))
        if isinstance(logger, WandbLogger):
            _log_wandb(logger, ev, figures, summary, prefix)
    return out


def _log_wandb(
    logger: WandbLogger,
    ev: CurveEvaluation,
    figures: dict[str, Path],
    summary: dict[str, Any],
    prefix: str,
) -> None:
    import wandb

    keys = list(ev.metrics)
    rows = [
        [t, w, *[_finite(ev.metrics[k][i]) for k in keys]]
        for i, (t, w) in enumerate(zip(ev.ts, ev.weights))
    ]
    payload: dict[str, Any] = {
        f"{prefix}/table": wandb.Table(columns=["t", "arc_weight", *keys], data=rows)
    }
    payload.update({f"{prefix}/{name}": wandb.Image(str(p)) for name, p in figures.items()})
    for stat in _stats(ev):
        names = [k for k in keys if k.split("/", 1)[1] == stat]
        ys = [[_finite(v) or 0.0 for v in ev.metrics[k]] for k in names]
        if all(_finite(v) is None for k in names for v in ev.metrics[k]):
            continue
        payload[f"{prefix}/plot/{stat}"] = wandb.plot.line_series(
            xs=ev.ts, ys=ys, keys=names, title=f"{stat} along the curve", xname="t"
        )
    logger.experiment.log(payload)
    for k, v in summary.items():
        if _finite(v) is not None:
            logger.experiment.summary[f"{prefix}/{k}"] = v
