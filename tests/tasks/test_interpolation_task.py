"""`lmc validate` interpolation runs: summary.json, W&B table and metrics, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmc.data import write_fake_mnist
from lmc.io import CheckpointError
from tests.helpers import (
    CONFIGS,
    checkpoints,
    read_wandb_records,
    read_wandb_summary,
    run_cli,
    run_dirs,
    wandb_run_dirs,
)

SMALL_NET = ["--model.init_args.net.init_args.width=32"]


@pytest.fixture(scope="module")
def mnist_pair(tmp_path_factory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("pair")
    write_fake_mnist(root / "data", "MNIST", n_train=160, n_test=64)
    ckpts = []
    for seed in (0, 1):
        out = root / f"fit{seed}"
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "mnist" / "mlp.yaml"),
            *SMALL_NET,
            f"--seed_everything={seed}",
            "--trainer.max_epochs=3",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={out}",
            f"--data.init_args.data_dir={root / 'data'}",
            "--data.init_args.val_size=32",
            "--data.init_args.alignment_size=64",
            "--data.init_args.batch_size=32",
            "--trainer.logger.init_args.offline=true",
        )
        [run] = run_dirs(out)
        ckpts += checkpoints(run)
    return root, ckpts


def _validate(root: Path, ckpts: list[Path], out: Path, *extra: str) -> None:
    run_cli(
        "validate",
        "-c",
        str(CONFIGS / "mnist" / "mlp_barrier.yaml"),
        *SMALL_NET,
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        f"--trainer.default_root_dir={out}",
        f"--data.init_args.data_dir={root / 'data'}",
        "--data.init_args.val_size=32",
        "--data.init_args.alignment_size=64",
        "--model.init_args.evaluation.num_alphas=5",
        *extra,
    )


def test_validate_writes_summary_table_and_figure(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    _validate(root, ckpts, tmp_path)
    [run] = run_dirs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    for key in (
        "barrier_loss_naive",
        "barrier_loss_matched",
        "barrier_acc_naive",
        "barrier_acc_matched",
    ):
        assert isinstance(summary[key], float)
    assert (run / "interpolation.png").stat().st_size > 10_000
    [wrun] = wandb_run_dirs(tmp_path)
    logged = read_wandb_summary(wrun)["summary"]
    assert logged["interp/barrier_loss_naive"] == pytest.approx(summary["barrier_loss_naive"])
    assert logged["interp/barrier_loss_matched"] == pytest.approx(summary["barrier_loss_matched"])
    assert logged["interp/table"]["_type"] == "table-file"
    assert logged["interp/barriers"]["_type"] == "table-file"
    assert logged["interp/figure"]["_type"] == "image-file"
    assert "interp/plot/test_loss_table" in logged
    artifacts = [r["artifact"] for r in read_wandb_records(wrun) if r["type"] == "artifact"]
    tables = {c["path"] for a in artifacts for c in a["manifest"]["contents"]}
    assert "interp/table.table.json" in tables
    assert logged["interp/naive/test/loss"] == pytest.approx(
        json.loads((run / "summary.json").read_text())["paths"]["naive"]["test/loss"][-1]
    )


def test_matched_path_of_a_permuted_copy_has_no_barrier(mnist_pair, tmp_path):
    from lmc.io import load_checkpoint, model_state_dict
    from lmc.models import MLP
    from lmc.permutation import apply_permutation, random_permutation, spec_for

    root, ckpts = mnist_pair
    net = MLP(784, 10, width=32, depth=3)
    spec = spec_for(net)
    state = model_state_dict(load_checkpoint(ckpts[0]))
    perm = random_permutation(spec.sizes(state), 3)
    permuted = apply_permutation(state, spec, perm)
    copy = tmp_path / "permuted.ckpt"
    torch.save({"state_dict": {f"net.{k}": v for k, v in permuted.items()}}, copy)
    _validate(
        root,
        [ckpts[0], copy],
        tmp_path / "out",
        "--model.init_args.save_matched=true",
        "--model.init_args.log_artifact=true",
    )
    [run] = run_dirs(tmp_path / "out")
    matched = model_state_dict(load_checkpoint(run / "matched.ckpt"))
    assert all(torch.equal(matched[k], state[k]) for k in state)  # the permutation was undone
    [wrun] = wandb_run_dirs(tmp_path / "out")
    artifacts = [r["artifact"] for r in read_wandb_records(wrun) if r["type"] == "artifact"]
    assert any(a["type"] == "model" for a in artifacts)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_matched"] == pytest.approx(0.0, abs=1e-5)
    assert summary["barrier_loss_naive"] > 1e-3


def test_checkpoints_of_different_architectures_fail_before_work(mnist_pair, tmp_path):
    from lmc.models import MLP

    root, ckpts = mnist_pair
    other = tmp_path / "wide.ckpt"
    torch.save(
        {
            "state_dict": {
                f"net.{k}": v for k, v in MLP(784, 10, width=48, depth=3).state_dict().items()
            }
        },
        other,
    )
    with pytest.raises(ValueError, match="wide.ckpt.*layers.0.weight|layers.0.weight.*wide.ckpt"):
        _validate(root, [ckpts[0], other], tmp_path)
    assert not list(tmp_path.rglob("summary.json"))


def test_missing_and_corrupt_checkpoints(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        _validate(root, [ckpts[0], tmp_path / "missing.ckpt"], tmp_path)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="bad.ckpt"):
        _validate(root, [ckpts[0], bad], tmp_path)


def test_run_folders_are_accepted_and_a_glob_of_too_many_runs_is_refused(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    runs = [c.parent.parent for c in ckpts]
    _validate(root, runs, tmp_path / "out", "--model.init_args.matcher=none")
    [run] = run_dirs(tmp_path / "out")
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_naive"] > 0
    with pytest.raises(ValueError, match=r"all_pairs to study 3 or more\): got 3 models but"):
        _validate(root, [*runs, ckpts[0]], tmp_path / "three")
    with pytest.raises(ValueError, match="same checkpoint"):
        _validate(root, [runs[0], ckpts[0]], tmp_path / "dup")
    assert not list((tmp_path / "three").rglob("summary.json"))


@pytest.mark.parametrize("matcher", ["none", "weight"])
def test_non_finite_weights_are_refused_before_work_naming_file_and_key(
    mnist_pair, tmp_path, matcher
):
    from lmc.io import load_checkpoint, model_state_dict

    root, ckpts = mnist_pair
    state = model_state_dict(load_checkpoint(ckpts[0]))
    state["layers.1.weight"][3, 4] = float("nan")
    bad = tmp_path / "diverged.ckpt"
    torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, bad)
    with pytest.raises(CheckpointError, match=r"diverged.ckpt has non-finite weights in layers.1"):
        _validate(root, [ckpts[1], bad], tmp_path / "out", f"--model.init_args.matcher={matcher}")
    assert not list(tmp_path.rglob("summary.json"))


def test_an_alpha_grid_without_interior_points_is_refused(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    with pytest.raises(ValueError, match="at least 3 points"):
        _validate(root, ckpts, tmp_path / "out", "--model.init_args.evaluation.num_alphas=2")


def test_overlap_needs_a_teacher_and_is_refused_before_work(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    with pytest.raises(ValueError, match="MNISTDataModule has no teacher_weight"):
        _validate(root, ckpts, tmp_path / "out", "--model.init_args.overlap=true")
    assert not list((tmp_path / "out").rglob("summary.json"))


def test_validate_ends_with_the_line_naming_its_figure_and_summary(mnist_pair, tmp_path, caplog):
    import logging

    root, ckpts = mnist_pair
    with caplog.at_level(logging.INFO):
        _validate(root, ckpts, tmp_path / "out")
    [run] = run_dirs(tmp_path / "out")
    lines = [r.getMessage().strip() for r in caplog.records if r.name.endswith("rank_zero")]
    assert lines[-1].startswith("Barrier (chord, test split): loss ")
    assert lines[-1].endswith(f"matched (weight matching). Figure and summary: {run}")


def test_abs_chord_barrier_is_the_largest_distance_from_the_chord(mnist_pair, tmp_path):
    """``barrier: abs_chord`` (000 Def. 2.1) reports sup |L - chord| of the very per-alpha
    losses of the record, and keeps the ``chord`` barrier beside it."""
    root, ckpts = mnist_pair
    _validate(root, ckpts, tmp_path, "--model.init_args.barrier=abs_chord")
    [run] = run_dirs(tmp_path)
    record = json.loads((run / "summary.json").read_text())
    summary, paths = record["summary"], record["paths"]
    for variant in ("naive", "matched"):
        alphas = paths[variant]["alphas"]
        loss = paths[variant]["test/loss"]
        gap = [v - ((1 - a) * loss[0] + a * loss[-1]) for a, v in zip(alphas, loss)]
        assert summary[f"barrier_loss_{variant}"] == pytest.approx(max(abs(g) for g in gap))
        assert summary[f"barrier_loss_abs_chord_{variant}"] == summary[f"barrier_loss_{variant}"]
        assert summary[f"barrier_loss_chord_{variant}"] == pytest.approx(max(gap))
        mean_end = (loss[0] + loss[-1]) / 2
        assert summary[f"barrier_loss_normalized_abs_chord_{variant}"] == pytest.approx(
            max(abs(g) for g in gap) / mean_end
        )


def test_an_unknown_barrier_definition_is_refused_naming_both(mnist_pair, tmp_path):
    root, ckpts = mnist_pair
    with pytest.raises((SystemExit, ValueError)):
        _validate(root, ckpts, tmp_path, "--model.init_args.barrier=max")
