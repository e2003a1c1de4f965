"""The papers' studies at CPU scale (issue #20): run each through the study engine, read the
headline numbers from its results table.

Runs ``configs/studies/<name>.yaml`` for 000_init_scale, 000_training, 004_merge_n, 000_pruning,
003_width, 002_curves, 000_fusion, 004_geometry, 003_pq_lr, 003_overlap, 003_mnist_width,
000_fedma, 002_robust_curves, 000_training_mnist, 000_pruning_vgg, zipit_disjoint and
zipit_disjoint_vgg (``run_study`` with ``--workers`` local workers, each study into ``--dir``/<name>,
then its report), one after the other; a folder that already holds the study's done jobs is not
redone (the engine skips them), so a second call only reads. The numbers come from
:func:`lmc.studies.reporting.results.results` (one row per job and metric), never from logs:

* ``pruning_lowers_barrier`` (000 Table 1): the fraction of (strategy, rate > 0) cells whose
  weight-matched test loss barrier (``barrier_loss_matched``, mean over the seed pairs) is below
  that strategy's unpruned (rate 0) barrier, an equal-budget control (the same optimizer steps;
  fine-tuning strategies train the unpruned models as long, lottery_ticket still rewinds);
* ``stemm_acc_n8``, ``mergemany_acc_n8``, ``wmref_acc_n8`` (004 Fig. 3a): the merged model's
  test accuracy at n = 8 on MNIST, mean over trials (``..._fmnist`` for Fashion-MNIST);
* ``init_scale_fit_r2`` (000 Fig. 2): R² of the fit L = e^{aH+b} of the normalised matched
  train loss barrier against the largest per-layer Gaussian entropy, over the pairs whose
  barrier is positive (``init_scale_fit_points`` = positive / all pairs; the fit's ``a``);
* ``training_barrier_{init,trained}_deg{1,3}`` and ``training_entropy_...`` (000 §4.2): the
  matched test barrier and first-layer H_Δ of the polynomial MLPs at initialization and
  trained, mean over seeds;
* ``width_barrier_peak_width`` (003 §4): the student width above the teacher's whose mean
  matched barrier is largest (``..._small_width`` and ``..._large_width`` give the barrier at
  the smallest and largest width);
* ``curve_{unaligned,aligned,pam_unaligned,pam_aligned}_acc_{min,mean}`` (002 Table 1): the
  minimum and the arc-length mean of test accuracy along the curve, mean over the pairs, and
  ``curve_endpoint_acc``, the endpoints' mean test accuracy (t = 0 and 1 of the curves);
* ``fusion_pruning_raises_acc`` (000 Table 2): the fraction of (strategy, rate > 0) cells whose
  OTFusion test accuracy (mean over the pairs) is above the plain dense fusion's
  (``fusion_acc_rate0``: only_prune at rate 0); ``fusion_pruning_beats_finetune_only``: the
  fraction of (finetune_once / iterative, rate > 0) cells above their own strategy's rate 0,
  the fine-tune-only control (the dense models fine-tuned as long, then fused), whose
  accuracies are ``fusion_finetune_only_acc_{finetune_once,iterative}``; and
  ``fusion_acc_best_<strategy>`` (the best rate's accuracy);
* ``geometry_{stemm,mergemany,wm_ref}_{ratio_std,angle_std,sharpness}`` (004 §6.1, §6.2): the
  spread of the distance ratios and of the triplet angles of the n = 6 permuted models (0 for a
  regular simplex) and the merged model's tr(H ⊙ θθᵀ), mean over trials, and
  ``geometry_originals_sharpness``, the originals' mean;
* ``pq_lr_{16,64}_{low,high}`` (003 Fig. 5): the PQ index of the per-neuron norms of the
  hidden layer at the smallest and the largest learning rate per width, mean over seeds, and
  ``pq_lr_rises`` = 1 if it rises with the learning rate at every step for both widths;
* ``overlap_min_width`` (003 Fig. 1): the width whose uniform minima overlap least (mean over
  the pairs; ``overlap_min`` there, ``overlap_large_width`` at the largest width), and
  ``overlap_barrier_peak_width_{uniform,gd}`` (003 Fig. 2): the width above the teacher's
  where the matched barrier of uniform and of GD minima peaks (``..._large_width``: the
  barrier at the largest width);
* ``mnist_width_barrier_peak_width`` (003 §6, Fig. 7): the 4-layer MNIST MLP width with the
  largest mean matched test loss barrier, and ``mnist_width_barrier_{matched,naive}_{small,
  large}`` the barriers at the smallest and largest width;
* ``fedma_pruning_raises_acc`` (000 Table 5): the fraction of pruning rates > 0 whose FedMA
  global test accuracy (mean over seeds) is above the unpruned one (rate 0: the same local
  training, so an equal-budget control), with ``fedma_acc_rate<r>``;
* ``robust_curve_{unaligned,aligned}_{acc,robust_acc}_{min,mean}`` (002 §5, Fig. 4): the
  minimum and arc-length mean of clean and PGD test accuracy along the robust curves, mean over
  the pairs, and ``robust_curve_endpoint_{acc,robust_acc}``;
* ``training_mnist_{barrier,entropy}_{init,trained}`` (000 §4.2, MNIST): matched test barrier
  and first-layer entropy before and after training with weight decay 5e-4 (lmc's setting),
  and ``training_mnist_{barrier,entropy}_{init,trained}_nowd`` without it (000's setting);
* ``pruning_vgg_lowers_barrier`` (000 Table 1, VGG16 on MNIST): as ``pruning_lowers_barrier``
  for the reduced VGG-16;
* ``joint_acc_{wavg,wm,permute,zip_full}`` (ZipIt! §5, MNIST 0-4 / 5-9; ``..._fmnist`` for
  Fashion-MNIST): the joint test
  accuracy (all ten digits) of the pair merged by plain averaging, weight matching, activation
  matching and zip, mean over the trials, ``joint_acc_zip_until{1,2}`` (partial zipping: the
  first 1 or 2 of the 3 hidden layers zipped, per-model heads), ``joint_acc_originals`` (each
  model alone) and
  ``joint_acc_ensemble`` (the pair's averaged outputs: the ceiling); ``task_acc_<method>`` the
  per-task accuracy (a task's examples, the prediction among its labels; mean of the two
  tasks) and ``task_acc_own`` each model's on its own task; the same with the suffix ``_vgg``
  for zipit_disjoint_vgg (VGG-11 with BatchNorm on MNIST, partial zipping at 3 and 6 of 8 conv
  layers: ``zip_until{3,6}``).

A study left out by ``--only`` prints ``nan`` for its keys. Needs ``LMC_DATA_DIR`` with MNIST
and FashionMNIST (writable) for all but 003_width. Run ``nice -n 10 python benchmarks/studies.py``
(about 46 min on 2 CPU cores for all 15; see each study file's header for its scale). The last line is
``pruning_lowers_barrier=<..> stemm_acc_n8=<..> mergemany_acc_n8=<..> wmref_acc_n8=<..>
init_scale_fit_r2=<..> width_barrier_peak_width=<..>`` and then the extra keys, with the minutes
each study took (``minutes_<name>``; a study found done takes ~0).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from lmc.studies import run_study  # noqa: E402
from lmc.studies.reporting.figure_spec import fit_exp  # noqa: E402
from lmc.studies.reporting.report import write_report  # noqa: E402
from lmc.studies.reporting.results import results  # noqa: E402

STUDIES = ROOT / "configs" / "studies"
ORDER = (
    "000_init_scale",
    "000_training",
    "004_merge_n",
    "000_pruning",
    "003_width",
    "002_curves",
    "000_fusion",
    "004_geometry",
    "003_pq_lr",
    "003_overlap",
    "003_mnist_width",
    "000_fedma",
    "002_robust_curves",
    "000_training_mnist",
    "000_pruning_vgg",
    "zipit_disjoint",
    "zipit_disjoint_vgg",
)
MERGE_METHODS = ("stemm", "mergemany", "wm_ref")
FUSION_STRATEGIES = ("only_prune", "finetune_once", "iterative")
CURVES = ("unaligned", "aligned", "pam_unaligned", "pam_aligned")
STRATEGY = "trainer.callbacks.init_args.strategy"
RATE = "trainer.callbacks.init_args.rate"
WIDTH = "model.init_args.net.init_args.width"
LR = "model.init_args.optimizer.init_args.lr"
WD = "model.init_args.optimizer.init_args.weight_decay"
TEACHER_WIDTH = 4  # configs/synthetic/teacher_student.yaml, data.init_args.teacher_width
MNIST, FMNIST = "lmc.data.MNISTDataModule", "lmc.data.FashionMNISTDataModule"


def _metric(table: pd.DataFrame, stage: str, metric: str) -> pd.DataFrame:
    return table[(table["stage"] == stage) & (table["metric"] == metric)]


def pruning(table: pd.DataFrame, prefix: str = "pruning") -> dict[str, float]:
    """000 Table 1: how many (strategy, rate > 0) cells have a lower matched barrier than the
    strategy's rate 0, and the mean matched barrier of rate 0 and of the pruned cells."""
    rows = _metric(table, "barrier", "barrier_loss_matched")
    cells = rows.groupby([STRATEGY, RATE])["value"].mean()
    lower, total = 0, 0
    for (strategy, rate), barrier in cells.items():
        if float(rate) > 0:
            total += 1
            lower += int(barrier < cells[(strategy, 0.0)])
    dense = cells[[k for k in cells.index if float(k[1]) == 0]]
    pruned = cells[[k for k in cells.index if float(k[1]) > 0]]
    return {
        f"{prefix}_lowers_barrier": lower / total if total else math.nan,
        f"{prefix}_barrier_rate0": float(dense.mean()),
        f"{prefix}_barrier_pruned": float(pruned.mean()),
    }


def merge_n(table: pd.DataFrame) -> dict[str, float]:
    """004 Fig. 3a: the merged test accuracy at n = 8 per method, mean over trials."""
    out = {}
    for method, key in (("stemm", "stemm"), ("mergemany", "mergemany"), ("wm_ref", "wmref")):
        rows = _metric(table, "merge", f"{method}/n8/test/acc")
        for data, suffix in ((MNIST, ""), (FMNIST, "_fmnist")):
            values = rows[rows["data.class_path"] == data]["value"]
            out[f"{key}_acc_n8{suffix}"] = float(values.mean()) if len(values) else math.nan
    return out


def init_scale(table: pd.DataFrame) -> dict[str, float]:
    """000 Fig. 2: the fit L = e^{aH+b} over the pairs (as the report's scatter fits it)."""
    h = _metric(table, "barrier", "entropy_max").set_index("job")["value"]
    barrier = _metric(table, "barrier", "barrier_loss_normalized_matched").set_index("job")["value"]
    h, barrier = h.align(barrier, join="inner")
    fit = fit_exp(h.tolist(), barrier.tolist()) or {"a": math.nan, "r2": math.nan}
    return {
        "init_scale_fit_r2": fit["r2"],
        "init_scale_fit_a": fit["a"],
        "init_scale_fit_points": f"{int((barrier > 0).sum())}/{len(barrier)}",
    }


def training(table: pd.DataFrame) -> dict[str, float]:
    """000 §4.2: the matched test barrier and the first-layer H_Δ at initialization (learning
    rate 0) and trained, per polynomial degree, mean over seeds."""
    out = {}
    for degree in (1, 3):
        for lr, when in ((0.0, "init"), (0.001, "trained")):
            for stage, metric, key in (
                ("barrier", "barrier_loss_matched", "training_barrier"),
                ("train", "entropy/layers.0", "training_entropy"),
            ):
                rows = _metric(table, stage, metric)
                rows = rows[(rows["data.init_args.degree"] == degree) & (rows[LR] == lr)]
                out[f"{key}_{when}_deg{degree}"] = float(rows["value"].mean())
    return out


def width(table: pd.DataFrame) -> dict[str, float]:
    """003 §4: the width above the teacher's with the largest mean matched barrier."""
    rows = _metric(table, "barrier", "barrier_loss_matched")
    means = rows.groupby(WIDTH)["value"].mean().sort_index()
    above = means[means.index > TEACHER_WIDTH]
    return {
        "width_barrier_peak_width": int(above.idxmax()) if len(above) else math.nan,
        "width_barrier_small_width": float(means.iloc[0]),
        "width_barrier_large_width": float(means.iloc[-1]),
    }


def _along_curves(
    table: pd.DataFrame, prefix: str, stages: tuple[str, ...], kinds: tuple[str, ...]
) -> dict[str, float]:
    """``<prefix>_<stage>_<kind>_{min,mean}``: the minimum and the arc-length mean of each test
    metric ``kind`` along each stage's curves, mean over the pairs; ``<prefix>_endpoint_<kind>``:
    the endpoints' mean (t = 0 and 1 of the aligned curves)."""
    out = {}
    for stage in stages:
        for kind in kinds:
            for stat, suffix in (("min", "min"), ("mean", "arc_mean")):
                rows = _metric(table, stage, f"test/{kind}_{suffix}")
                out[f"{prefix}_{stage}_{kind}_{stat}"] = float(rows["value"].mean())
    for kind in kinds:
        ends = pd.concat([_metric(table, "aligned", f"test/{kind}_{e}") for e in ("start", "end")])
        out[f"{prefix}_endpoint_{kind}"] = float(ends["value"].mean())
    return out


def curves(table: pd.DataFrame) -> dict[str, float]:
    """002 Table 1: minimum and arc-length mean test accuracy along each curve class, mean over
    the pairs; the endpoints' mean test accuracy."""
    return _along_curves(table, "curve", CURVES, ("acc",))


def fusion(table: pd.DataFrame) -> dict[str, float]:
    """000 Table 2: how many (strategy, rate > 0) cells fuse to a better test accuracy than the
    plain dense fusion (only_prune at rate 0), mean over the pairs; how many (fine-tuning
    strategy, rate > 0) cells beat their strategy's fine-tune-only control (rate 0: the dense
    models fine-tuned as long, then fused); the dense fusion's, each control's and each
    strategy's best accuracy."""
    rows = _metric(table, "otfusion", "otfusion/n2/test/acc")
    cells = rows.groupby(
        [
            "model.init_args.method_options.otfusion.prune_strategy",
            "model.init_args.method_options.otfusion.prune_rate",
        ]
    )
    means = cells["value"].mean()
    rate0 = {k[0]: float(v) for k, v in means.items() if float(k[1]) == 0}
    dense = rate0.get("only_prune", math.nan)
    pruned = means[[k for k in means.index if float(k[1]) > 0]]
    tuned = [(k, v) for k, v in pruned.items() if k[0] != "only_prune" and k[0] in rate0]
    out = {
        "fusion_pruning_raises_acc": float((pruned > dense).mean()) if len(pruned) else math.nan,
        "fusion_pruning_beats_finetune_only": (
            sum(v > rate0[k[0]] for k, v in tuned) / len(tuned) if tuned else math.nan
        ),
        "fusion_acc_rate0": dense,
    }
    for strategy in FUSION_STRATEGIES[1:]:
        out[f"fusion_finetune_only_acc_{strategy}"] = rate0.get(strategy, math.nan)
    for strategy in FUSION_STRATEGIES:
        best = pruned[[k for k in pruned.index if k[0] == strategy]]
        out[f"fusion_acc_best_{strategy}"] = float(best.max()) if len(best) else math.nan
    return out


def geometry(table: pd.DataFrame) -> dict[str, float]:
    """004 §6.1-6.2: spread of distance ratios and triplet angles, and sharpness, at n = 6."""
    out = {}
    for method in MERGE_METHODS:
        for key, metric in (
            ("ratio_std", "distance_ratio_std"),
            ("angle_std", "angle_std"),
            ("sharpness", "sharpness"),
        ):
            rows = _metric(table, "merge", f"{method}/n6/{metric}")
            out[f"geometry_{method}_{key}"] = float(rows["value"].mean())
    rows = _metric(table, "merge", "stemm/n6/originals_sharpness")
    out["geometry_originals_sharpness"] = float(rows["value"].mean())
    return out


def pq_lr(table: pd.DataFrame) -> dict[str, float]:
    """003 Fig. 5: the hidden layer's PQ index against the learning rate, per width."""
    rows = _metric(table, "train", "pq/neuron/hidden")
    out: dict[str, float] = {}
    rises = True
    for w, cells in rows.groupby(WIDTH):
        means = cells.groupby(LR)["value"].mean().sort_index()
        out[f"pq_lr_{w}_low"], out[f"pq_lr_{w}_high"] = float(means.iloc[0]), float(means.iloc[-1])
        rises &= bool((means.diff().dropna() > 0).all())
    out["pq_lr_rises"] = float(rises) if out else math.nan
    return out


def overlap(table: pd.DataFrame) -> dict[str, float]:
    """003 Figs. 1-2: the width with the smallest mean overlap of uniform (manifold) minima, the
    overlap there and at the largest width, and the width above the teacher's where the matched
    barrier of each kind of minimum peaks."""
    init = "model.init_args.net.init_args.init"
    rows = _metric(table, "barrier", "overlap_proportion")
    out: dict[str, float] = {}
    uniform = rows[rows[init] == "manifold"].groupby(WIDTH)["value"].mean().sort_index()
    if len(uniform):
        out["overlap_min_width"] = int(uniform.idxmin())
        out["overlap_min"] = float(uniform.min())
        out["overlap_large_width"] = float(uniform.iloc[-1])
    barrier = _metric(table, "barrier", "barrier_loss_matched")
    for kind, name in (("manifold", "uniform"), ("gaussian", "gd")):
        means = barrier[barrier[init] == kind].groupby(WIDTH)["value"].mean().sort_index()
        above = means[means.index > TEACHER_WIDTH]
        if len(above):
            out[f"overlap_barrier_peak_width_{name}"] = int(above.idxmax())
            out[f"overlap_barrier_large_width_{name}"] = float(means.iloc[-1])
    return out


def mnist_width(table: pd.DataFrame) -> dict[str, float]:
    """003 §6, Fig. 7: the MNIST MLP width with the largest mean matched test loss barrier, and
    the barrier (matched, naive) at the smallest and the largest width."""
    out: dict[str, float] = {}
    for series in ("matched", "naive"):
        means = _metric(table, "barrier", f"barrier_loss_{series}").groupby(WIDTH)["value"].mean()
        means = means.sort_index()
        if len(means):
            out[f"mnist_width_barrier_{series}_small"] = float(means.iloc[0])
            out[f"mnist_width_barrier_{series}_large"] = float(means.iloc[-1])
            if series == "matched":
                out["mnist_width_barrier_peak_width"] = int(means.idxmax())
    return out


def fedma(table: pd.DataFrame) -> dict[str, float]:
    """000 Table 5: FedMA's global test accuracy per pruning rate (mean over the federations), and the
    fraction of rates > 0 above the unpruned (rate 0) one."""
    rows = _metric(table, "fedma", "fedma/n5/test/acc")
    rate = "model.init_args.method_options.fedma.prune_rate"
    means = rows.groupby(rate)["value"].mean().sort_index()
    out = {f"fedma_acc_rate{float(r):g}": float(v) for r, v in means.items()}
    if 0.0 in means.index and len(means) > 1:
        pruned = means[means.index > 0]
        out["fedma_pruning_raises_acc"] = float((pruned > means[0.0]).mean())
    return out


def robust_curves(table: pd.DataFrame) -> dict[str, float]:
    """002 §5: minimum and arc-length mean of clean and PGD test accuracy along the unaligned and
    aligned robust curves, mean over the pairs; the endpoints' mean (t = 0 and 1)."""
    return _along_curves(table, "robust_curve", ("unaligned", "aligned"), ("acc", "robust_acc"))


def training_mnist(table: pd.DataFrame) -> dict[str, float]:
    """000 §4.2 on MNIST: matched test barrier and first-layer entropy (Gaussian closed form) at
    initialization (learning rate 0) and trained, mean over the pairs; with weight decay 5e-4
    (lmc's setting; keys as before) and, with the suffix ``_nowd``, without (000's)."""
    out = {}
    for key, metric in (("barrier", "barrier_loss_matched"), ("entropy", "entropy_first")):
        rows = _metric(table, "barrier", metric)
        decay = rows[WD] if WD in rows else pd.Series(0.0005, index=rows.index)
        for suffix, with_decay in (("", True), ("_nowd", False)):
            for when, trained in (("init", False), ("trained", True)):
                cell = rows[((rows[LR] > 0) == trained) & ((decay > 0) == with_decay)]
                value = float(cell["value"].mean()) if len(cell) else math.nan
                out[f"training_mnist_{key}_{when}{suffix}"] = value
    return out


#: zipit_disjoint's merge methods and the names of their keys (issue 33's benchmark names)
ZIPIT = {"naive": "wavg", "wm_ref": "wm", "permute": "permute", "zip": "zip_full"}
ZIPIT_DATA = "data.init_args.data.class_path"


def zipit(
    table: pd.DataFrame,
    datasets: tuple[tuple[str, str], ...] = (
        ("lmc.data.MNISTDataModule", ""),
        ("lmc.data.FashionMNISTDataModule", "_fmnist"),
    ),
    partial: tuple[int, ...] = (1, 2),
) -> dict[str, float]:
    """ZipIt! §5 with labels 0-4 / 5-9 of MNIST (keys as named) and Fashion-MNIST (``_fmnist``):
    each merge method's joint test accuracy (all ten labels), mean over the trials, partial
    zipping at the ``partial`` depths, the originals' (each model on all ten: about half) and
    the pair's output ensemble's, and the per-task accuracies (``task_acc_*``)."""
    out: dict[str, float] = {}
    for dataset, suffix in datasets:
        rows = table[table.get(ZIPIT_DATA, pd.Series(dataset, index=table.index)) == dataset]

        def mean(stage: str, *metrics: str, rows: pd.DataFrame = rows) -> float:
            return float(pd.concat([_metric(rows, stage, m)["value"] for m in metrics]).mean())

        cells = [("merge", m, key) for m, key in ZIPIT.items()]
        cells += [(f"zip_until{d}", "zip", f"zip_until{d}") for d in partial]
        for stage, method, key in cells:
            out[f"joint_acc_{key}{suffix}"] = mean(stage, f"{method}/n2/test/acc")
            tasks = (f"{method}/n2/test/task{j}_acc" for j in (0, 1))
            out[f"task_acc_{key}{suffix}"] = mean(stage, *tasks)
        models = (f"originals/model{j}/test/acc" for j in (0, 1))
        out[f"joint_acc_originals{suffix}"] = mean("merge", *models)
        out[f"joint_acc_ensemble{suffix}"] = mean("merge", "naive/n2/test/ensemble_acc")
        own = (f"originals/model{j}/test/task{j}_acc" for j in (0, 1))  # each on its own task
        out[f"task_acc_own{suffix}"] = mean("merge", *own)
    return out


def zipit_vgg(table: pd.DataFrame) -> dict[str, float]:
    """zipit_disjoint_vgg: :func:`zipit`'s keys with the suffix ``_vgg`` (MNIST, VGG-11 with
    BatchNorm; partial zipping of the first 3 and 6 of its 8 conv layers)."""
    return zipit(table, (("lmc.data.MNISTDataModule", "_vgg"),), (3, 6))


READ: dict[str, Callable[[pd.DataFrame], dict[str, float]]] = {
    "zipit_disjoint": zipit,
    "zipit_disjoint_vgg": zipit_vgg,
    "000_init_scale": init_scale,
    "000_training": training,
    "004_merge_n": merge_n,
    "000_pruning": pruning,
    "003_width": width,
    "002_curves": curves,
    "000_fusion": fusion,
    "004_geometry": geometry,
    "003_pq_lr": pq_lr,
    "003_overlap": overlap,
    "003_mnist_width": mnist_width,
    "000_fedma": fedma,
    "000_training_mnist": training_mnist,
    "000_pruning_vgg": lambda table: pruning(table, "pruning_vgg"),
    "002_robust_curves": robust_curves,
}
KEYS = {
    "zipit_disjoint": [
        f"{kind}_{key}{suffix}"
        for suffix in ("", "_fmnist")
        for kind, keys in (
            ("joint_acc", (*ZIPIT.values(), "zip_until1", "zip_until2", "originals", "ensemble")),
            ("task_acc", (*ZIPIT.values(), "zip_until1", "zip_until2", "own")),
        )
        for key in keys
    ],
    "zipit_disjoint_vgg": [
        f"{kind}_{key}_vgg"
        for kind, keys in (
            ("joint_acc", (*ZIPIT.values(), "zip_until3", "zip_until6", "originals", "ensemble")),
            ("task_acc", (*ZIPIT.values(), "zip_until3", "zip_until6", "own")),
        )
        for key in keys
    ],
    "000_init_scale": ["init_scale_fit_r2", "init_scale_fit_a", "init_scale_fit_points"],
    "000_training": [
        f"training_{k}_{when}_deg{d}"
        for d in (1, 3)
        for when in ("init", "trained")
        for k in ("barrier", "entropy")
    ],
    "004_merge_n": [
        "stemm_acc_n8",
        "mergemany_acc_n8",
        "wmref_acc_n8",
        "stemm_acc_n8_fmnist",
        "mergemany_acc_n8_fmnist",
        "wmref_acc_n8_fmnist",
    ],
    "000_pruning": ["pruning_lowers_barrier", "pruning_barrier_rate0", "pruning_barrier_pruned"],
    "003_width": [
        "width_barrier_peak_width",
        "width_barrier_small_width",
        "width_barrier_large_width",
    ],
    "002_curves": [
        *(f"curve_{stage}_acc_{stat}" for stage in CURVES for stat in ("min", "mean")),
        "curve_endpoint_acc",
    ],
    "000_fusion": [
        "fusion_pruning_raises_acc",
        "fusion_pruning_beats_finetune_only",
        "fusion_acc_rate0",
        *(f"fusion_finetune_only_acc_{s}" for s in FUSION_STRATEGIES[1:]),
        *(f"fusion_acc_best_{s}" for s in FUSION_STRATEGIES),
    ],
    "004_geometry": [
        *(
            f"geometry_{m}_{k}"
            for m in MERGE_METHODS
            for k in ("ratio_std", "angle_std", "sharpness")
        ),
        "geometry_originals_sharpness",
    ],
    "003_pq_lr": [
        "pq_lr_rises",
        *(f"pq_lr_{w}_{e}" for w in (16, 64) for e in ("low", "high")),
    ],
    "003_overlap": [
        "overlap_min_width",
        "overlap_min",
        "overlap_large_width",
        *(
            f"overlap_barrier_{k}_{n}"
            for n in ("uniform", "gd")
            for k in ("peak_width", "large_width")
        ),
    ],
    "000_fedma": [
        "fedma_pruning_raises_acc",
        *(f"fedma_acc_rate{r:g}" for r in (0.0, 0.1, 0.3, 0.5)),
    ],
    "000_training_mnist": [
        f"training_mnist_{k}_{when}{suffix}"
        for suffix in ("", "_nowd")
        for k in ("barrier", "entropy")
        for when in ("init", "trained")
    ],
    "000_pruning_vgg": [
        "pruning_vgg_lowers_barrier",
        "pruning_vgg_barrier_rate0",
        "pruning_vgg_barrier_pruned",
    ],
    "002_robust_curves": [
        *(
            f"robust_curve_{stage}_{kind}_{stat}"
            for stage in ("unaligned", "aligned")
            for kind in ("acc", "robust_acc")
            for stat in ("min", "mean")
        ),
        "robust_curve_endpoint_acc",
        "robust_curve_endpoint_robust_acc",
    ],
    "003_mnist_width": [
        "mnist_width_barrier_peak_width",
        *(f"mnist_width_barrier_{s}_{e}" for s in ("matched", "naive") for e in ("small", "large")),
    ],
}
HEADLINE = (
    "pruning_lowers_barrier",
    "stemm_acc_n8",
    "mergemany_acc_n8",
    "wmref_acc_n8",
    "init_scale_fit_r2",
    "width_barrier_peak_width",
)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_and_read(name: str, root: Path, workers: int) -> tuple[dict[str, object], bool, float]:
    """Run the study ``name`` into ``root`` (done jobs are skipped), write its report and read
    its numbers: ``(numbers, any job failed, minutes)``."""
    start = time.perf_counter()
    summary = run_study(STUDIES / f"{name}.yaml", root, workers=workers, log=print)
    write_report(root)
    minutes = (time.perf_counter() - start) / 60
    print(
        f"{name}: {len(summary.ran)} jobs ran, {len(summary.skipped)} were done, "
        f"{len(summary.failed)} failed, {minutes:.1f} min",
        flush=True,
    )
    return READ[name](results(root)), bool(summary.failed), minutes


def print_line(line: list[str], failed: list[str]) -> None:
    """The benchmark's last line, after the studies whose jobs failed (then exit 1)."""
    if failed:
        print(f"FAILED jobs in: {', '.join(failed)} (see lmc study status DIR)", flush=True)
    print(" ".join(line), flush=True)
    if failed:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=ORDER, help="run and read this study only")
    parser.add_argument("--dir", type=Path, default=ROOT / "benchmarks" / ".cache" / "studies")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    numbers: dict[str, object] = {k: math.nan for keys in KEYS.values() for k in keys}
    minutes: dict[str, float] = {}
    failed = []
    for name in ORDER:
        if args.only and name != args.only:
            continue
        read, broke, minutes[name] = run_and_read(name, args.dir / name, args.workers)
        numbers.update(read)
        if broke:
            failed.append(name)
    line = [f"{k}={_fmt(numbers[k])}" for k in HEADLINE]
    line += [f"{k}={_fmt(v)}" for k, v in numbers.items() if k not in HEADLINE]
    line += [f"minutes_{k}={v:.2f}" for k, v in minutes.items()]
    print_line(line, failed)


if __name__ == "__main__":
    main()
