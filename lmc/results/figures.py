"""Figures of a run drawn from its :class:`~lmc.results.record.RunRecord` and saved atomically.

Every function draws from the record's ``series`` (and a kind's ``details``), so the same PNG
can be redrawn later from ``summary.json`` alone. Figures are built without ``pyplot``: no
global state, no backend switch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lmc.io import atomic_path
from lmc.results.record import RunRecord

MERGE_PANELS = (
    ("acc", "accuracy of the merge", True),
    ("loss_gap", "merged loss - mean original loss", False),
    ("pairwise_loss_gap", "mean pairwise merged loss - mean original loss", False),
    ("sharpness", "sharpness tr(H ⊙ θθᵀ)", False),
)


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _nan(values: Iterable[Any]) -> list[float]:
    """Values for plotting: ``None`` and non-finite values become NaN (a gap in the line)."""
    return [v if (v := finite(x)) is not None else math.nan for x in values]


def save_figure(fig: Figure, path: Path, dpi: int = 110) -> Path:
    """Save ``fig`` to ``path`` atomically (temporary name in the same folder, then
    ``os.replace``); returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    return path


def interpolation_figure(record: RunRecord, path: Path) -> Path:
    """Loss (and accuracy, when measured) vs alpha of every path and split; a path's values
    without repair (``*_raw``) dashed."""
    first = next(iter(record.series.values()))
    splits = sorted({k.split("/")[0] for k in first.values})
    has_acc = any(
        finite(v) is not None for k, vs in first.values.items() if "/acc" in k for v in vs
    )
    stats = ["loss", "acc"] if has_acc else ["loss"]
    fig = Figure(figsize=(4.5 * len(splits), 3.4 * len(stats)))
    axes = fig.subplots(len(stats), len(splits), squeeze=False)
    for r, stat in enumerate(stats):
        for c, split in enumerate(splits):
            ax = axes[r][c]
            for name, s in record.series.items():
                ax.plot(s.x, _nan(s.values[f"{split}/{stat}"]), marker=".", label=name)
                raw = s.values.get(f"{split}/{stat}_raw")
                if raw is not None:
                    ax.plot(s.x, _nan(raw), linestyle="--", alpha=0.6, label=f"{name} (no repair)")
            ax.set_xlabel(first.axis)
            ax.set_ylabel(f"{split} {stat}")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Interpolation between models: naive vs matched")
    fig.tight_layout()
    return save_figure(fig, path)


def _points(xs: Iterable[Any], values: Iterable[Any]) -> list[tuple[Any, float]]:
    return [(x, v) for x, v in zip(xs, values) if finite(v) is not None]


def merge_figure(record: RunRecord, split: str, path: Path) -> Path:
    """Merge metrics vs number of models per method (004 Fig. 3, 4, 6-10), and the
    distance-ratio and angle histograms of the largest merge of every method."""
    fig = Figure(figsize=(15, 8))
    flat = fig.subplots(2, 3).ravel()
    for ax, (metric, title, originals) in zip(flat, MERGE_PANELS):
        key = metric if metric == "sharpness" else f"{split}/{metric}"
        for method, s in record.series.items():
            pts = _points(s.x, s.values.get(key, []))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        base = "originals_sharpness" if metric == "sharpness" else f"{split}/originals_{metric}"
        if originals or metric == "sharpness":
            first = next(iter(record.series.values()))
            pts = _points(first.x, first.values.get(base, []))
            if pts:
                ax.plot(*zip(*pts), linestyle="--", color="gray", label="originals (mean)")
        if "gap" in metric:
            ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_xlabel("number of models n")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title} ({split})" if metric != "sharpness" else title, fontsize=9)
        ax.grid(alpha=0.3)
    flat[0].legend(fontsize=7)
    largest: dict[str, Mapping[str, Any]] = {}
    for ev in record.details.get("evaluations", []):
        if ev["method"] not in largest or ev["n"] > largest[ev["method"]]["n"]:
            largest[ev["method"]] = ev
    for ax, (attr, title) in zip(
        flat[4:], (("distance_ratios", "L2 distance / mean"), ("angles", "triplet angles (deg)"))
    ):
        for method, ev in largest.items():
            values = [v for v in map(finite, ev[attr]) if v is not None]
            if values:
                ax.hist(values, bins=20, alpha=0.5, label=f"{method} (n={ev['n']})")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.suptitle("Merging n models modulo permutations")
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def curve_figure(record: RunRecord, path: Path, title: str = "Along the curve") -> Path:
    """Loss and accuracy vs t of the record's curve, one line per split (robust metrics
    dashed)."""
    curve = next(iter(record.series.values()))
    stats = {k.split("/", 1)[1] for k in curve.values}
    kinds = [k for k in ("loss", "acc") if any(k in s for s in stats)]
    fig = Figure(figsize=(5 * len(kinds), 3.6))
    axes = fig.subplots(1, len(kinds), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for key, values in curve.values.items():
            stat = key.split("/", 1)[1]
            if stat not in (kind, f"robust_{kind}") or all(finite(v) is None for v in values):
                continue
            style = "--" if stat.startswith("robust") else "-"
            ax.plot(curve.x, _nan(values), style, marker=".", label=key)
        ax.set_xlabel(curve.axis)
        ax.set_ylabel(kind)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def plane_figure(plane: Mapping[str, Any], path: Path, split: str | None = None) -> Path:
    """Loss and accuracy over a plane through three models (002 Fig. 3), with the models and
    the projected paths; ``plane`` is a ``PlaneResult`` as a dict (``xs``, ``ys``,
    ``metrics``, ``points``, ``paths``)."""
    splits = sorted({k.split("/")[0] for k in plane["metrics"]})
    split = split or ("test" if "test" in splits else splits[-1])
    fig = Figure(figsize=(10, 4.2))
    axes = fig.subplots(1, 2)
    for ax, stat in zip(axes, ("loss", "acc")):
        z = np.array([_nan(row) for row in plane["metrics"][f"{split}/{stat}"]], dtype=float)
        cs = ax.contourf(plane["xs"], plane["ys"], z, levels=20, cmap="viridis")
        fig.colorbar(cs, ax=ax)
        for label, pts in plane["paths"].items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "w-", lw=1.5, label=label)
        for name, (x, y) in plane["points"].items():
            ax.plot(x, y, "o", color="red", ms=6)
            ax.annotate(
                name, (x, y), color="white", fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
        ax.set_title(f"{split} {stat}")
    fig.tight_layout()
    return save_figure(fig, path)
