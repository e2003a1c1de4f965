"""The papers' studies (``configs/studies/0*.yaml``) run end to end at a tiny size, so none rots:
each shipped study file is read, given tiny overrides (fewer grid values, a few steps, a 16-wide
network, fake MNIST / Fashion-MNIST in tmp_path) and run through the study engine, then its
tables are checked for the expected rows and for answers known in advance."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from benchmarks import studies as studies_benchmark
from lmc.data import write_fake_mnist
from lmc.metrics import gaussian_entropy
from lmc.studies import load_study, plan, run_study
from lmc.studies.reporting.aggregate import series_table
from lmc.studies.reporting.figure_spec import fit_exp
from lmc.studies.reporting.report import write_report
from lmc.studies.reporting.results import results
from tests.helpers import CONFIGS

STUDIES = CONFIGS / "studies"
WIDTH = 16
#: every MNIST-like training and evaluation: fake data, small splits, a 16-wide network
TINY_MNIST = [
    "--data.init_args.val_size=16",
    "--data.init_args.alignment_size=16",
    "--data.init_args.batch_size=32",
    f"--model.init_args.net.init_args.width={WIDTH}",
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
TINY_FIT = ["--trainer.max_epochs=1", "--trainer.limit_val_batches=1", "--test_after_fit=false"]


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fake_mnist")
    write_fake_mnist(root, "MNIST", n_train=96, n_test=32)
    write_fake_mnist(root, "FashionMNIST", n_train=96, n_test=32, seed=1)
    return root


@pytest.fixture(autouse=True)
def _data_dir(fake_data, monkeypatch):
    monkeypatch.setenv("LMC_DATA_DIR", str(fake_data))


def _absolute(configs: str | list[str]) -> list[str]:
    paths = [configs] if isinstance(configs, str) else configs
    return [str((STUDIES / p).resolve()) for p in paths]


def tiny_study(
    name: str,
    tmp_path: Path,
    grid: dict[str, list[Any]],
    train_args: list[str],
    stage_args: dict[str, list[str]] | None = None,
    references: list[Any] | None = None,
    **changes: Any,
) -> Path:
    """``configs/studies/<name>.yaml`` with ``grid`` entries replaced, ``train_args`` appended to
    the train args and ``stage_args[stage]`` to an evaluate stage's (later args win), every
    stage's ``pairs.reference`` set to ``references`` when given, without ``replicates:``,
    written into ``tmp_path`` with absolute config paths; ``changes`` replace top-level
    entries."""
    load_study(STUDIES / f"{name}.yaml")  # the shipped file loads, its replicates: checked
    study = yaml.safe_load((STUDIES / f"{name}.yaml").read_text())
    study.pop("replicates", None)  # a tiny grid is no pilot: it runs its own replicates only
    train = study["train"]
    train["config"] = _absolute(train["config"])
    train["grid"].update(grid)
    train["args"] = [*train.get("args", []), *train_args]
    for stage in study.get("evaluate", []):
        stage["config"] = _absolute(stage["config"])
        stage["args"] = [*stage.get("args", []), *(stage_args or {}).get(stage["name"], [])]
        if references is not None:
            stage["pairs"]["reference"] = references
    study.update(changes)
    path = tmp_path / f"{name}.yaml"
    claims = study.pop("claims", None) or []
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    if claims:  # keep the claims the tiny grid still runs (their values and metrics)
        study["claims"] = [c for c in claims if _fits(c, path)]
        path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def _fits(claim: dict[str, Any], path: Path) -> bool:
    """Whether the tiny study at ``path`` runs ``claim`` (its stages, values and the metrics
    known before a job: :func:`lmc.studies.running.run.checked_plan` checks them)."""
    from dataclasses import replace

    from lmc.studies import StudyError
    from lmc.studies.claims.declared import parse_claims
    from lmc.studies.running.run import checked_plan

    try:
        study = load_study(path)
        checked_plan(replace(study, claims=parse_claims([claim], study)))
    except StudyError:
        return False
    return True


def run(path: Path, tmp_path: Path) -> Any:
    """Run the study file ``path`` into ``tmp_path/out`` in this process and write its report
    (every declared figure drawn: its metrics exist); the study's tidy table."""
    summary = run_study(path, tmp_path / "out", log=lambda _: None)
    assert not summary.failed, summary
    report = write_report(tmp_path / "out")
    claims = (yaml.safe_load(path.read_text()) or {}).get("claims") or []
    if claims:  # every claim the tiny grid keeps is evaluated into a verdict
        from lmc.studies.claims.verdicts import VERDICTS, study_claims

        verdicts = [r.verdict for r in study_claims(tmp_path / "out")]
        assert len(verdicts) == len(claims) and set(verdicts) <= set(VERDICTS)
        assert (tmp_path / "out" / "report" / "tables" / "claims.csv").is_file()
    figures = load_study(path).figures
    assert len(report.figures) == len(figures)
    for fig in figures:
        assert (tmp_path / "out" / "report" / "figures" / f"{fig.name}.png").stat().st_size > 0
    return results(tmp_path / "out")


def gap_above_chord(path: Any, absolute: bool = False) -> tuple[float, Any]:
    """The largest gap of a path's ``value`` along ``x`` above the chord between its ends (the
    ``chord`` barrier, recomputed), or with ``absolute`` the largest distance from it (the
    ``abs_chord`` barrier), and the loss along it."""
    alpha, loss = path["x"].to_numpy(), path["value"].to_numpy()
    gap = loss - ((1 - alpha) * loss[0] + alpha * loss[-1])
    return max(abs(gap) if absolute else gap), loss


def values(table: Any, stage: str, metric: str, **where: Any) -> list[float]:
    rows = table[(table["stage"] == stage) & (table["metric"] == metric)]
    for key, value in where.items():
        rows = rows[rows[key].map(lambda v, value=value: v == value)]
    return [float(v) for v in rows["value"]]


def test_every_study_file_plans():
    """Every shipped study parses, checks against its configs and plans (no job runs); the pair
    designs are disjoint (``reference: consecutive``), hence the even seed counts."""
    expected = {
        "004_merge_n": 36,
        "000_init_scale": 54,
        "000_pruning": 168,
        "000_training": 96,
        "002_curves": 18,
        "002_curves_cifar10": 18,
        "000_fusion": 69,
        "004_geometry": 14,
        "003_pq_lr": 30,
        "003_mnist_width": 30,
        "003_overlap": 192,
        "000_fedma": 27,
        "002_robust_curves": 8,
        "000_training_mnist": 24,
        "000_pruning_vgg": 48,
        "zipit_disjoint": 30,
        "zipit_disjoint_vgg": 15,
    }
    for name, jobs in expected.items():
        assert len(plan(load_study(STUDIES / f"{name}.yaml"))) == jobs, name


def test_zipit_disjoint(tmp_path):
    """Two trials of MLPs on MNIST 0-4 and 5-9 (fake data; a trial: one model per task from its
    own seed), each trial's pair merged by naive, wm_ref, permute and zip, and zipped up to the
    first and the second hidden layer (partial zipping), evaluated on all ten digits: every
    method's joint accuracy and the same ensemble ceiling reported, the claims evaluated."""
    classes = "data.init_args.classes"
    nested = [
        a.replace("--data.init_args.", "--data.init_args.data.init_args.") for a in TINY_MNIST
    ]
    path = tiny_study(
        "zipit_disjoint",
        tmp_path,
        grid={
            "data.init_args.data.class_path": ["lmc.data.MNISTDataModule"],
            classes: [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] * 2,
            "data.init_args.data.init_args.seed": [0, 0, 1, 1],
            "seed_everything": [0, 1, 2, 3],
        },
        train_args=[*nested, *TINY_FIT],
        stage_args={stage: nested for stage in ("merge", "zip_until1", "zip_until2")},
    )
    table = run(path, tmp_path)
    trained = table[(table["stage"] == "train")]
    assert {tuple(c) for c in trained[classes]} == {(0, 1, 2, 3, 4), (5, 6, 7, 8, 9)}
    for stage, method in [
        *((("merge", m)) for m in ("naive", "wm_ref", "permute", "zip")),
        ("zip_until1", "zip"),
        ("zip_until2", "zip"),
    ]:
        accs = values(table, stage, f"{method}/n2/test/acc")
        assert len(accs) == 2 and all(0.0 <= a <= 1.0 for a in accs), (stage, method)
        ensemble = values(table, stage, f"{method}/n2/test/ensemble_acc")
        assert ensemble == values(table, "merge", "naive/n2/test/ensemble_acc")  # one ceiling


def test_zipit_disjoint_vgg(tmp_path):
    """One trial of VGG-11s with BatchNorm (width 1/16) on MNIST 0-4 and 5-9 (fake data),
    merged by every method and zipped partially: every merged model (BatchNorm re-estimated)
    reports a joint and per-task accuracy."""
    nested = [
        a.replace("--data.init_args.", "--data.init_args.data.init_args.") for a in TINY_MNIST
    ]
    nested = [a for a in nested if "net.init_args.width" not in a]
    vgg = ["--model.init_args.net.init_args.width=0.0625"]
    path = tiny_study(
        "zipit_disjoint_vgg",
        tmp_path,
        grid={
            "data.init_args.classes": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
            "data.init_args.data.init_args.seed": [0, 0],
            "seed_everything": [0, 1],
        },
        train_args=[*nested, *vgg, *TINY_FIT, "--trainer.limit_train_batches=2"],
        stage_args={s: [*nested, *vgg] for s in ("merge", "zip_until3", "zip_until6")},
    )
    table = run(path, tmp_path)
    for stage, method in [("merge", "zip"), ("merge", "permute"), ("zip_until3", "zip")]:
        for metric in ("test/acc", "test/task0_acc", "test/task1_acc"):
            [acc] = values(table, stage, f"{method}/n2/{metric}")
            assert 0.0 <= acc <= 1.0, (stage, method, metric)


def test_004_merge_n(tmp_path):
    """One trial of 3 MNIST models, merged at n = 2, 3 by STE-MM (two steps: an ``lmc fit``
    evaluate stage) and the baselines: one merge job, with accuracies for every method and n,
    all methods of an n measured against the same originals."""
    path = tiny_study(
        "004_merge_n",
        tmp_path,
        grid={
            "data.class_path": ["lmc.data.MNISTDataModule"],
            "data.init_args.seed": [0, 0, 0],
            "seed_everything": [0, 1, 2],
        },
        train_args=[*TINY_MNIST, *TINY_FIT],
        stage_args={
            "merge": [
                *TINY_MNIST,
                "--model.init_args.num_models=[2, 3]",
                "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2",
            ]
        },
    )
    study = yaml.safe_load(path.read_text())  # n = 2, 3 here: the n = 8 comparison at 3
    study["claims"] = [c for c in study["claims"] if c["test"] == "difference"]
    for claim in study["claims"]:
        for side in ("a", "b"):
            claim[side]["metric"] = claim[side]["metric"].replace("/n8/", "/n3/")
    assert study["claims"]
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    table = run(path, tmp_path)
    merges = table[table["stage"] == "merge"]
    assert merges["job"].nunique() == 1
    for n in (2, 3):
        for method in ("stemm", "mergemany", "wm_ref"):
            accs = values(table, "merge", f"{method}/n{n}/test/acc")
            assert len(accs) == 1 and all(0.0 <= a <= 1.0 for a in accs), (method, n)
        # every method merges the same first n models: one mean accuracy of the originals
        originals = {
            values(table, "merge", f"{m}/n{n}/test/originals_acc")[0]
            for m in ("stemm", "mergemany", "wm_ref")
        }
        assert len(originals) == 1, (n, originals)


def test_000_init_scale(tmp_path):
    """Three init scales x two seeds at initialization (each scale's seeds one population): the
    barrier jobs report the Gaussian closed-form entropy of the first layer, ½ ln(2πe (c_d
    sigma_He)²) up to sampling noise; each barrier is the largest gap between the loss along
    its matched path and the chord between the endpoints, normalised by their mean loss; the
    exponential fit of the barrier against the entropy is finite. The study's barrier is
    000's (``abs_chord``: the largest distance from the chord); the ``chord`` one is kept."""
    scales = [0.2, 0.5, 0.9]
    path = tiny_study(
        "000_init_scale",
        tmp_path,
        grid={"model.init_args.net.init_args.init_scale": scales, "seed_everything": [0, 1]},
        train_args=TINY_MNIST,
        stage_args={"barrier": [*TINY_MNIST, "--model.init_args.evaluation.num_alphas=3"]},
    )
    table = run(path, tmp_path)
    key = "model.init_args.net.init_args.init_scale"
    for c in scales:
        (h,) = values(table, "barrier", "entropy_first", **{key: c})
        assert h == pytest.approx(gaussian_entropy(c * math.sqrt(2 / 784)), abs=0.03)
    h = values(table, "barrier", "entropy_max")
    barrier = values(table, "barrier", "barrier_loss_normalized_matched")
    assert len(h) == len(barrier) == 3
    paths = series_table(tmp_path / "out", "barrier")
    paths = paths[(paths["series"] == "matched") & (paths["metric"] == "train/loss")]
    for job, path in paths.groupby("job"):
        gap, loss = gap_above_chord(path, absolute=True)
        (b,) = values(table, "barrier", "barrier_loss_matched", job=job)
        (normalized,) = values(table, "barrier", "barrier_loss_normalized_matched", job=job)
        assert b == pytest.approx(gap, abs=1e-6)
        (chord,) = values(table, "barrier", "barrier_loss_chord_matched", job=job)
        assert chord == pytest.approx(gap_above_chord(path)[0], abs=1e-6) and chord <= b
        assert normalized == pytest.approx(b / ((loss[0] + loss[-1]) / 2), abs=1e-6)
    fit = fit_exp(h, barrier)
    assert fit is not None and all(math.isfinite(v) for v in fit.values())


def optimizer_steps(out: Path, stage: str, job: str) -> int:
    """The optimizer steps a training job took (its last checkpoint's ``global_step``)."""
    ckpt = max((out / "jobs" / stage / job).rglob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])


def test_000_pruning(tmp_path):
    """Three strategies x rates 0 and 0.5 x two seeds: a barrier per cell, and pruning half of
    every layer lowers the first layer's discrete entropy (000 Lemma 4.1). Rate 0 is each
    strategy's equal-budget control: every job takes the same optimizer steps (lottery_ticket
    at rate 0 still rewinds and retrains), and fine-tuning with all-ones masks is plain
    training, so finetune_once at rate 0 is only_prune at rate 0 to the last digit."""
    strategy = "trainer.callbacks.init_args.strategy"
    rate = "trainer.callbacks.init_args.rate"
    strategies = ["only_prune", "lottery_ticket", "finetune_once"]
    path = tiny_study(
        "000_pruning",
        tmp_path,
        grid={
            strategy: strategies,
            "trainer.callbacks.init_args.rounds": [1, 1, 1],
            rate: [0.0, 0.5],
            "seed_everything": [0, 1],
        },
        train_args=[
            *TINY_MNIST,
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=2",
            "--trainer.callbacks.init_args.prune_epoch=1",
        ],
        stage_args={"barrier": [*TINY_MNIST, "--model.init_args.evaluation.num_alphas=3"]},
    )
    table = run(path, tmp_path)
    for s in strategies:
        for r in (0.0, 0.5):
            assert len(values(table, "barrier", "barrier_loss_matched", **{strategy: s, rate: r}))
        dense = values(table, "train", "entropy/layers.0", **{strategy: s, rate: 0.0})
        pruned = values(table, "train", "entropy/layers.0", **{strategy: s, rate: 0.5})
        assert len(dense) == len(pruned) == 2 and max(pruned) < min(dense), s
    train = table[table["stage"] == "train"]
    steps = {job: optimizer_steps(tmp_path / "out", "train", job) for job in set(train["job"])}
    assert len(steps) == 12 and set(steps.values()) == {4}, steps
    for metric in ("entropy/layers.0", "train/loss"):
        got = [values(table, "train", metric, **{strategy: s, rate: 0.0}) for s in strategies]
        assert got[0] == got[2] != got[1], (metric, got)


def test_000_training(tmp_path):
    """Both polynomial tasks, at initialization (learning rate 0) and trained, two seeds each as
    one population: a barrier per cell, and at learning rate 0 the weights stay the init, so
    the first-layer entropy is the same for both degrees (the init does not see the data)."""
    lr = "model.init_args.optimizer.init_args.lr"
    path = tiny_study(
        "000_training",
        tmp_path,
        grid={"seed_everything": [0, 1]},
        train_args=[
            "--trainer.max_epochs=2",
            "--data.init_args.n_train=64",
            "--data.init_args.n_val=32",
            "--data.init_args.n_test=32",
            "--trainer.callbacks.init_args.every_n_epochs=1",
        ],
        stage_args={
            "barrier": [
                "--model.init_args.evaluation.num_alphas=3",
                "--data.init_args.n_train=64",
                "--data.init_args.n_test=32",
            ]
        },
    )
    table = run(path, tmp_path)
    for degree in (1, 3):
        for rate in (0.0, 0.001):
            cell = {"data.init_args.degree": degree, lr: rate}
            assert len(values(table, "barrier", "barrier_loss_matched", **cell)) == 1, cell
    at_init = {
        degree: sorted(
            values(table, "train", "entropy/layers.0", **{"data.init_args.degree": degree, lr: 0.0})
        )
        for degree in (1, 3)
    }
    assert len(at_init[1]) == 2 and at_init[1] == at_init[3]


def test_002_curves(tmp_path):
    """Two independent pairs of Fashion-MNIST VGG-11 x1/8 (seeds 0-1, 2-3), four curve classes
    each (a few steps of curve training): every class of a pair starts at the same model and
    ends at a model computing the same function (the second endpoint, or P theta_2: alignment
    and PAM's rounded permutation move its units, not its function), so the test accuracy and
    loss at t = 0 and t = 1 agree across the four classes; each curve's minimum accuracy is at
    most its mean."""
    tiny = [
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=16",
        "--data.init_args.batch_size=32",
        "--trainer.accelerator=cpu",
    ]
    curve = [*tiny, "--model.init_args.evaluation.num_ts=3", "--trainer.limit_train_batches=2"]
    curve += ["--trainer.limit_val_batches=1"]
    pam = [*curve, "--model.init_args.pam.curve_epochs=1", "--trainer.max_epochs=2"]
    pam += ["--model.init_args.pam.select_batches=1", "--model.init_args.pam.bvn_samples=2"]
    path = tiny_study(
        "002_curves",
        tmp_path,
        grid={"data.init_args.seed": [0, 0, 1, 1], "seed_everything": [0, 1, 2, 3]},
        train_args=[*tiny, *TINY_FIT, "--trainer.limit_train_batches=2"],
        stage_args={
            "unaligned": [*curve, "--trainer.max_epochs=1"],
            "aligned": [*curve, "--trainer.max_epochs=1", "--model.init_args.plane.size=2"],
            "pam_unaligned": pam,
            "pam_aligned": pam,
        },
        references=[0, 2],
    )
    table = run(path, tmp_path)
    stages = ("unaligned", "aligned", "pam_unaligned", "pam_aligned")
    for trial in (0, 1):
        cell = {"data.init_args.seed": trial}
        for metric in ("test/acc_start", "test/acc_end", "test/loss_start", "test/loss_end"):
            got = [values(table, s, metric, **cell) for s in stages]
            assert all(len(v) == 1 for v in got), (metric, got)
            assert [v[0] for v in got] == pytest.approx([got[0][0]] * 4, abs=1e-5), (metric, got)
        for s in stages:
            (low,) = values(table, s, "test/acc_min", **cell)
            (mean,) = values(table, s, "test/acc_mean", **cell)
            assert low <= mean + 1e-9, (s, low, mean)


def test_000_fusion(tmp_path):
    """One pair of MNIST MLPs fused by OTFusion at each point of the stage's own grid (the three
    strategies x rates 0 and 0.5): six fusion jobs of the same pair. Rate 0 is each strategy's
    equal-budget control: only_prune fuses the dense models untouched (0 fine-tuning epochs),
    finetune_once and iterative fine-tune the dense models for as many epochs (1, 2 x 1) as at
    rate 0.5, so they differ from the plain dense fusion; the originals' accuracies are the same
    two models' in every job."""
    strategy, rate = (
        "model.init_args.method_options.otfusion.prune_strategy",
        "model.init_args.method_options.otfusion.prune_rate",
    )
    path = tiny_study(
        "000_fusion",
        tmp_path,
        grid={"data.init_args.seed": [0, 0], "seed_everything": [0, 1]},
        train_args=[*TINY_MNIST, *TINY_FIT],
        stage_args={
            "otfusion": [*TINY_MNIST, "--model.init_args.method_options.otfusion.finetune_epochs=1"]
        },
    )
    study = yaml.safe_load(path.read_text())
    study["evaluate"][0]["grid"].update({rate: [0.0, 0.5]})
    for claim in study["claims"]:  # the study's claims at rate 0.1, here at 0.5
        claim["a"]["where"][rate] = 0.5
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    table = run(path, tmp_path)
    assert table[table["stage"] == "otfusion"]["job"].nunique() == 6
    budget = {"only_prune": 0.0, "finetune_once": 1.0, "iterative": 2.0}
    for s, epochs in budget.items():
        for r in (0.0, 0.5):
            got = values(
                table, "otfusion", "otfusion/n2/finetune/epochs_per_model", **{strategy: s, rate: r}
            )
            assert got == [epochs], (s, r, got)
    loss = "otfusion/n2/test/loss"
    (dense,) = values(table, "otfusion", loss, **{strategy: "only_prune", rate: 0.0})
    for s in ("finetune_once", "iterative"):
        (control,) = values(table, "otfusion", loss, **{strategy: s, rate: 0.0})
        assert control != dense, s
    originals = set(values(table, "otfusion", "otfusion/n2/test/originals_acc"))
    assert len(originals) == 1
    read = studies_benchmark.fusion(table)
    assert set(studies_benchmark.KEYS["000_fusion"]) <= set(read)
    for s in ("finetune_once", "iterative"):
        (acc,) = values(table, "otfusion", "otfusion/n2/test/acc", **{strategy: s, rate: 0.0})
        assert read[f"fusion_finetune_only_acc_{s}"] == acc
    only = {strategy: "only_prune", rate: 0.0}
    (acc,) = values(table, "otfusion", "otfusion/n2/test/acc", **only)
    assert read["fusion_acc_rate0"] == acc


def test_004_geometry(tmp_path):
    """One trial of 4 MNIST models merged at n = 2, 3, 4: at n = 4 the distance ratios of the
    permuted models average exactly 1 (each pair's distance over the mean of the pairs) and the
    triplets' interior angles average exactly 60 degrees (each triangle's sum to 180), for every
    method; the merged and the originals' sharpness are finite (at n = 2 too: the sharpness
    against n)."""
    path = tiny_study(
        "004_geometry",
        tmp_path,
        grid={"data.init_args.seed": [0, 0, 0, 0], "seed_everything": [0, 1, 2, 3]},
        train_args=[*TINY_MNIST, *TINY_FIT],
        stage_args={
            "merge": [
                *TINY_MNIST,
                "--model.init_args.num_models=[2, 3, 4]",
                "--model.init_args.evaluation.sharpness_probes=2",
                "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2",
            ]
        },
    )
    study = yaml.safe_load(path.read_text())
    for fig in study["figures"]:  # n = 4 here, 6 in the study
        fig["y"] = [y.replace("/n6/", "/n4/") for y in fig["y"]]
    for claim in study["claims"]:
        if claim["test"] == "trend":  # sharpness against n: n = 2, 3, 4 here
            claim["x_values"] = [2, 3, 4]
            continue
        for side in ("a", "b"):
            claim[side]["metric"] = claim[side]["metric"].replace("/n6/", "/n4/")
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    table = run(path, tmp_path)
    for method in ("stemm", "mergemany", "wm_ref"):
        (ratio,) = values(table, "merge", f"{method}/n4/distance_ratio_mean")
        (angle,) = values(table, "merge", f"{method}/n4/angle_mean")
        (sharp,) = values(table, "merge", f"{method}/n4/sharpness")
        assert ratio == pytest.approx(1.0, abs=1e-6) and angle == pytest.approx(60.0, abs=1e-6)
        assert math.isfinite(sharp), method
    (orig,) = values(table, "merge", "stemm/n4/originals_sharpness")
    assert math.isfinite(orig)
    assert all(map(math.isfinite, values(table, "merge", "stemm/n2/sharpness")))


def test_003_pq_lr(tmp_path):
    """Width 16 at learning rates 0 and 0.2: at rate 0 gradient descent leaves the init, so the
    hidden layer's PQ index at the end equals the one logged at the start, to the last digit;
    at 0.2 it moves; every PQ index (p = 1, q = 2) of 16 neuron norms lies in [0, 1 - 16^-1/2]."""
    import pandas as pd

    width, lr = "model.init_args.net.init_args.width", "model.init_args.optimizer.init_args.lr"
    path = tiny_study(
        "003_pq_lr",
        tmp_path,
        grid={width: [16, 16], lr: [0.0, 0.2], "seed_everything": [0]},
        train_args=[
            "--trainer.max_epochs=20",
            "--trainer.check_val_every_n_epoch=20",
            "--trainer.callbacks.init_args.every_n_epochs=10",
            "--data.init_args.n_train=64",
            "--data.init_args.n_val=32",
            "--data.init_args.n_test=32",
        ],
    )
    table = run(path, tmp_path)
    for rate in (0.0, 0.2):
        (job,) = set(table[(table["stage"] == "train") & (table[lr] == rate)]["job"])
        (csv,) = (tmp_path / "out" / "jobs" / "train" / job).rglob("metrics.csv")
        pq = pd.read_csv(csv)["pq/neuron/hidden"].dropna().to_numpy()
        assert len(pq) == 3 and all(0.0 <= v <= 1 - 16**-0.5 for v in pq), pq
        assert (pq[-1] == pq[0]) == (rate == 0.0), (rate, pq)


def test_003_mnist_width(tmp_path):
    """Two widths x two seeds of the 4-layer MNIST MLP, one pair per width: each barrier job
    interpolates networks of its own width (the width reaches the evaluate stage from the grid),
    and each barrier, naive and matched, is the largest gap between the test loss along its
    path and the chord between the endpoints; every model trains from He-normal init (003 B.4)."""
    width = "model.init_args.net.init_args.width"
    path = tiny_study(
        "003_mnist_width",
        tmp_path,
        grid={width: [8, 12], "seed_everything": [0, 1]},
        train_args=[*TINY_MNIST[:3], *TINY_MNIST[4:], *TINY_FIT],
        stage_args={
            "barrier": [
                *TINY_MNIST[:3],
                *TINY_MNIST[4:],
                "--model.init_args.evaluation.num_alphas=3",
            ]
        },
    )
    table = run(path, tmp_path)
    for w in (8, 12):
        for series in ("matched", "naive"):
            assert len(values(table, "barrier", f"barrier_loss_{series}", **{width: w})) == 1
    paths = series_table(tmp_path / "out", "barrier")
    paths = paths[paths["metric"] == "test/loss"]
    assert paths["job"].nunique() == 2 and set(paths["series"]) == {"matched", "naive"}
    for (job, series), p in paths.groupby(["job", "series"]):
        (b,) = values(table, "barrier", f"barrier_loss_{series}", job=job)
        assert b == pytest.approx(gap_above_chord(p)[0], abs=1e-6)
    for w in (8, 12):
        (job,) = set(table[(table["stage"] == "barrier") & (table[width] == w)]["job"])
        config = yaml.safe_load(
            next((tmp_path / "out" / "jobs" / "barrier" / job).rglob("config.yaml")).read_text()
        )
        assert config["model"]["init_args"]["net"]["init_args"]["width"] == w
    for job in set(table[table["stage"] == "train"]["job"]):  # 003 B.4: Kaiming-He init
        config = yaml.safe_load(
            next((tmp_path / "out" / "jobs" / "train" / job).rglob("config.yaml")).read_text()
        )
        assert config["model"]["init_args"]["net"]["init_args"]["init"] == "he_normal"


def test_003_overlap(tmp_path):
    """Widths 4 and 6, uniform (manifold) and GD minima, one pair each: at n = m every uniform
    minimum is the teacher's neurons in some order, so the pair overlaps fully and its matched
    barrier is 0; each reported overlap equals the one recomputed from the two checkpoints."""
    import torch

    from lmc.io import load_checkpoint, model_state_dict
    from lmc.metrics.overlap import solutions_overlap

    width = "model.init_args.net.init_args.width"
    init = "model.init_args.net.init_args.init"
    path = tiny_study(
        "003_overlap",
        tmp_path,
        grid={
            width: [4, 6],
            "model.init_args.optimizer.init_args.lr": [0.2, 0.2],
            "trainer.max_epochs": [20, 1],
            "seed_everything": [0, 1],
        },
        train_args=[
            "--trainer.check_val_every_n_epoch=20",
            "--data.init_args.n_train=64",
            "--data.init_args.n_val=32",
            "--data.init_args.n_test=32",
        ],
        stage_args={"barrier": ["--data.init_args.n_train=64", "--data.init_args.n_test=32"]},
    )
    table = run(path, tmp_path)
    (full,) = values(table, "barrier", "overlap_proportion", **{width: 4, init: "manifold"})
    (barrier,) = values(table, "barrier", "barrier_loss_matched", **{width: 4, init: "manifold"})
    assert full == 1.0 and barrier == pytest.approx(0.0, abs=1e-6)
    trained = table[table["stage"] == "train"]
    for (w, kind), jobs in trained.groupby([width, init]):
        weights = []
        for _, job in sorted(set(zip(jobs["seed_everything"], jobs["job"]))):
            (ckpt,) = (tmp_path / "out" / "jobs" / "train" / job).rglob("last.ckpt")
            weights.append(model_state_dict(load_checkpoint(ckpt))["hidden.weight"])
        (reported,) = values(table, "barrier", "overlap_proportion", **{width: w, init: kind})
        assert reported == solutions_overlap(weights[0], weights[1], torch.eye(10)[:4])


def test_000_fedma(tmp_path, monkeypatch):
    """One federation of 2 clients, each trained by `lmc fit` on its share of a Dirichlet split
    (lmc.data.FederatedClients), merged by FedMA at pruning rates 0 and 0.5. Both merges read the
    same trained clients, so they report the same clients' accuracy to the last digit, and the
    plain average of the clients (naive) is the same in both; the fused accuracies are
    reported. Rate 0 is an equal-budget control: FedMA prunes with only_prune (no fine-tuning
    of its own) and both merges run the same number of local SGD steps (counted here), on the
    clients' own batches."""
    fedma_module = importlib.import_module("lmc.merging.fedma")  # lmc.merging.fedma: the function
    fusion_methods = importlib.import_module("lmc.merging.fusion")  # the registered fedma
    steps: list[list[int]] = [[]]  # per merge, the SGD steps of every local_train call
    prunings: list[Any] = []
    clients_seen: list[int] = []
    train, fuse = fedma_module.local_train, fusion_methods.fedma

    def counted(model, batches, epochs=1, *args, **kwargs):
        steps[-1].append(max(epochs, 0) * len(batches))
        return train(model, batches, epochs, *args, **kwargs)

    def fused(*args, pruning=None, client_batches=None, **kwargs):
        clients_seen.append(len(client_batches))
        out = fuse(*args, pruning=pruning, client_batches=client_batches, **kwargs)
        prunings.append(pruning)
        steps.append([])
        return out

    monkeypatch.setattr(fedma_module, "local_train", counted)
    monkeypatch.setattr(fusion_methods, "fedma", fused)
    rate = "model.init_args.method_options.fedma.prune_rate"
    tiny = [
        "--data.init_args.data.init_args.val_size=16",
        "--data.init_args.data.init_args.alignment_size=16",
        "--data.init_args.data.init_args.batch_size=32",
        "--data.init_args.data.init_args.limit_train=96",  # the whole fake set
        "--data.init_args.clients=2",
        f"--model.init_args.net.init_args.width={WIDTH}",
        "--trainer.accelerator=cpu",
    ]
    path = tiny_study(
        "000_fedma",
        tmp_path,
        grid={
            "data.init_args.split_seed": [0],
            "seed_everything": [0],
            "data.init_args.client": [0, 1],
        },
        train_args=[*tiny, "--trainer.max_epochs=1"],
        stage_args={"fedma": tiny},
    )
    study = yaml.safe_load(path.read_text())
    study["evaluate"][0]["grid"] = {rate: [0.0, 0.5]}
    for figure in study["figures"]:
        figure["y"] = [y.replace("/n5/", "/n2/") for y in figure["y"]]
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    table = run(path, tmp_path)
    assert table[table["stage"] == "train"]["job"].nunique() == 2
    clients = [values(table, "fedma", "fedma/n2/test/originals_acc", **{rate: r}) for r in (0, 0.5)]
    assert len(clients[0]) == 1 and clients[0] == clients[1]
    naive = [values(table, "fedma", "naive/n2/test/acc", **{rate: r}) for r in (0.0, 0.5)]
    assert naive[0] == naive[1]
    for r in (0.0, 0.5):
        (acc,) = values(table, "fedma", "fedma/n2/test/acc", **{rate: r})
        assert 0.0 <= acc <= 1.0
    assert clients_seen == [2, 2]
    assert sorted(p is None for p in prunings) == [False, True]
    (pruning,) = [p for p in prunings if p is not None]
    assert pruning.rate == 0.5 and pruning.strategy == "only_prune" and pruning.finetune is None
    per_job = [sum(s) for s in steps[:2]]
    assert steps[2] == [] and per_job[0] == per_job[1] > 0, steps


def test_002_robust_curves(tmp_path):
    """One pair of adversarially trained Fashion-MNIST VGG-11 x1/8 (1-step PGD, a few steps),
    an unaligned and an aligned robust curve between them: both start at the same model and end
    at models computing the same function, so their clean and PGD accuracy and loss at t = 0 and
    t = 1 agree; every robust accuracy is at most 1 and each curve's minimum at most its mean."""
    tiny = [
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=16",
        "--data.init_args.batch_size=32",
        "--data.init_args.eval_batch_size=16",
        "--data.init_args.limit_train=null",
        "--trainer.accelerator=cpu",
    ]
    curve = [*tiny, "--model.init_args.evaluation.num_ts=3", "--trainer.limit_train_batches=2"]
    curve += ["--trainer.max_epochs=1", "--model.init_args.robust.attack.steps=1"]
    path = tiny_study(
        "002_robust_curves",
        tmp_path,
        grid={"data.init_args.seed": [0, 0], "seed_everything": [0, 1]},
        train_args=[
            *tiny,
            *TINY_FIT,
            "--trainer.limit_train_batches=2",
            "--model.init_args.attack.steps=1",
        ],
        stage_args={"unaligned": curve, "aligned": curve},
        references=[0],
    )
    table = run(path, tmp_path)
    for metric in ("acc", "loss", "robust_acc", "robust_loss"):
        for end in ("start", "end"):
            got = [values(table, s, f"test/{metric}_{end}") for s in ("unaligned", "aligned")]
            assert all(len(v) == 1 for v in got), (metric, got)
            assert got[0][0] == pytest.approx(got[1][0], abs=1e-5), (metric, end, got)
    for s in ("unaligned", "aligned"):
        (low,) = values(table, s, "test/robust_acc_min")
        (mean,) = values(table, s, "test/robust_acc_mean")
        assert 0.0 <= low <= mean + 1e-9 <= 1.0 + 1e-9, (s, low, mean)


def test_000_training_mnist(tmp_path):
    """MNIST MLPs (16 wide) before (learning rate 0) and after a few SGD steps, without weight
    decay (000's setting) and with 5e-4 (lmc's), seeds 0-1 as one population per cell: before
    training the first layer is He-normal, so its Gaussian closed-form entropy is
    ½ ln(2πe · 2/784) up to sampling noise, and at learning rate 0 weight decay moves nothing,
    so both settings' "before" cells agree to the last digit; training moves the entropy, and
    differently with weight decay; one barrier per cell."""
    lr = "model.init_args.optimizer.init_args.lr"
    wd = "model.init_args.optimizer.init_args.weight_decay"
    path = tiny_study(
        "000_training_mnist",
        tmp_path,
        grid={lr: [0.0, 0.1], wd: [0.0, 0.0005], "seed_everything": [0, 1]},
        train_args=[*TINY_MNIST, "--trainer.max_epochs=1", "--test_after_fit=false"],
        stage_args={"barrier": [*TINY_MNIST, "--model.init_args.evaluation.num_alphas=3"]},
    )
    table = run(path, tmp_path)
    after = {}
    for decay in (0.0, 0.0005):
        (before,) = values(table, "barrier", "entropy_first", **{lr: 0.0, wd: decay})
        (after[decay],) = values(table, "barrier", "entropy_first", **{lr: 0.1, wd: decay})
        assert before == pytest.approx(gaussian_entropy(math.sqrt(2 / 784)), abs=0.03)
        assert after[decay] != before
        for rate in (0.0, 0.1):
            cell = {lr: rate, wd: decay}
            assert len(values(table, "barrier", "barrier_loss_matched", **cell)) == 1, cell
    for metric in ("entropy_first", "barrier_loss_matched"):
        init = [values(table, "barrier", metric, **{lr: 0.0, wd: d}) for d in (0.0, 0.0005)]
        assert init[0] == init[1], (metric, init)
    assert after[0.0] != after[0.0005]
    read = studies_benchmark.training_mnist(table)
    assert set(studies_benchmark.KEYS["000_training_mnist"]) <= set(read)
    assert read["training_mnist_entropy_trained_nowd"] == after[0.0]
    assert read["training_mnist_entropy_trained"] == after[0.0005]


def test_000_pruning_vgg(tmp_path):
    """The reduced VGG-16 half of 000 Table 1: one strategy x rates 0 and 0.5 x two seeds; a
    barrier per cell (BatchNorm reset along the path), half of every layer pruned lowers the
    first convolution's discrete entropy (000 Lemma 4.1), and rate 0, the control, takes the
    same optimizer steps."""
    strategy = "trainer.callbacks.init_args.strategy"
    rate = "trainer.callbacks.init_args.rate"
    path = tiny_study(
        "000_pruning_vgg",
        tmp_path,
        grid={strategy: ["finetune_once"], rate: [0.0, 0.5], "seed_everything": [0, 1]},
        train_args=[
            *TINY_MNIST[:3],
            *TINY_MNIST[4:],
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=2",
            "--trainer.callbacks.init_args.prune_epoch=1",
            "--data.init_args.limit_train=null",
        ],
        stage_args={"barrier": [*TINY_MNIST[:3], "--model.init_args.evaluation.num_alphas=3"]},
    )
    table = run(path, tmp_path)
    for r in (0.0, 0.5):
        (b,) = values(table, "barrier", "barrier_loss_matched", **{rate: r})
        assert math.isfinite(b)
    dense = values(table, "train", "entropy/features.0", **{rate: 0.0})
    pruned = values(table, "train", "entropy/features.0", **{rate: 0.5})
    assert len(dense) == len(pruned) == 2 and max(pruned) < min(dense)
    train = table[table["stage"] == "train"]
    steps = {job: optimizer_steps(tmp_path / "out", "train", job) for job in set(train["job"])}
    assert len(steps) == 4 and set(steps.values()) == {4}, steps  # rate 0: the same steps
