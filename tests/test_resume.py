"""`lmc fit --ckpt_path last` resumes a crashed run exactly, in the same run folder; outputs land
where `--trainer.default_root_dir` says, also in reruns from a saved config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lmc.data import write_fake_cifar10, write_fake_mnist
from tests.crash import Crash
from tests.helpers import CONFIGS, run_cli, run_dirs

MLP = str(CONFIGS / "mnist" / "mlp.yaml")


AUGMENTED = [  # fake CIFAR-10 with crop, flip and rotation: augmentation draws random numbers
    "--data=lmc.data.CIFAR10DataModule",
    "--data.init_args.augment=true",
    "--data.init_args.rotate=15",
    "--model.init_args.net.init_args.in_features=3072",
]


def _fit(data: Path, root: Path, *extra: str, accelerator: str | None = None) -> None:
    """``accelerator``: ``--trainer.accelerator`` (``None``: the config's); on a GPU the run
    logs to CSV instead of W&B (which GPU machines may lack)."""
    if accelerator in (None, "cpu"):
        logger = ["--trainer.logger.init_args.offline=true"]
    else:
        logger = ["-c", str(CONFIGS / "loggers" / "csv.yaml")]
    on = [] if accelerator is None else [f"--trainer.accelerator={accelerator}"]
    run_cli(
        "fit",
        "-c",
        MLP,
        "--model.init_args.net.init_args.width=16",
        "--seed_everything=3",
        "--trainer.max_epochs=3",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
        f"--data.init_args.data_dir={data}",
        "--data.init_args.val_size=32",
        "--data.init_args.alignment_size=32",
        "--data.init_args.batch_size=16",
        *logger,
        *on,
        *extra,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "data"
    write_fake_mnist(root, "MNIST", n_train=160, n_test=32)
    write_fake_cifar10(root, n_train=160, n_test=32)
    return root


def _final(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _same(a: torch.Tensor, b: torch.Tensor, accelerator: str) -> bool:
    """Bitwise on the CPU; on a GPU within float32 noise on the tensor's scale (CUDA kernels
    are not promised to be bitwise deterministic)."""
    if accelerator == "cpu" or not a.is_floating_point():
        return torch.equal(a, b)
    scale = float(a.abs().max()) if a.numel() else 0.0
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, scale))


@pytest.mark.parametrize("setup", [[], AUGMENTED], ids=["mnist", "cifar-augmented"])
def test_a_crashed_run_resumed_from_last_equals_the_uninterrupted_run(
    data, tmp_path, setup, accelerator
):
    _fit(data, tmp_path / "straight", *setup, accelerator=accelerator)
    [straight] = run_dirs(tmp_path / "straight")
    crash = ["--trainer.callbacks+=tests.crash.CrashAt", "--trainer.callbacks.epoch=1"]
    with pytest.raises(Crash):
        _fit(data, tmp_path / "crashed", *setup, *crash, accelerator=accelerator)
    [crashed] = run_dirs(tmp_path / "crashed")
    assert _final(crashed)["epoch"] == 0  # only the end of epoch 0 was saved
    # found by its config
    _fit(data, tmp_path / "crashed", *setup, "--ckpt_path=last", accelerator=accelerator)
    assert run_dirs(tmp_path / "crashed") == [crashed]  # continued in the same run folder
    a, b = _final(straight), _final(crashed)
    assert a["epoch"] == b["epoch"] == 2 and a["global_step"] == b["global_step"]
    for k, v in a["state_dict"].items():
        assert _same(v, b["state_dict"][k], accelerator), k
    for sa, sb in zip(
        a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()
    ):
        assert all(_same(sa[k], sb[k], accelerator) for k in sa)
    if accelerator == "cpu":  # the offline W&B run: its two attempts read as one (issue 46)
        from lmc.loggers import offline_segments

        assert len(offline_segments(tmp_path / "crashed", crashed.name)) == 2
        assert _rows(tmp_path / "crashed", crashed.name) == _rows(
            tmp_path / "straight", straight.name
        )


def _rows(save_dir: Path, run_id: str) -> list[dict]:
    """The W&B history rows, less wall-clock times."""
    from lmc.loggers import offline_history

    clock = ("_runtime", "_timestamp")
    return [
        {k: v for k, v in r.items() if k not in clock} for r in offline_history(save_dir, run_id)
    ]


def test_a_resume_with_other_model_options_is_refused_naming_them(data, tmp_path):
    """Issue 46: `--ckpt_path last` with another learning rate exited 0 and trained with the
    checkpoint's (Lightning's CLI puts the checkpoint's hyper-parameters over the given ones)."""
    _fit(data, tmp_path / "out", "--trainer.max_epochs=1")
    [run] = run_dirs(tmp_path / "out")
    lr = "--model.init_args.optimizer.init_args.lr=0.5"
    with pytest.raises(
        ValueError,
        match=r"model\.init_args\.optimizer\.init_args\.lr: 0\.5 "
        r"given, 0\.001 in the checkpoint.*--spawn_from",
    ):
        run_cli(
            "fit",
            "--config",
            str(run / "config.yaml"),
            "--ckpt_path=last",
            lr,
            "--trainer.max_epochs=2",
        )
    assert _final(run)["epoch"] == 0  # nothing trained


def test_fit_ends_by_printing_its_run_folder(data, tmp_path, caplog):
    with caplog.at_level("INFO"):
        _fit(data, tmp_path / "out", "--trainer.max_epochs=1")
    [run] = run_dirs(tmp_path / "out")
    assert f"Run folder: {run} (rerun: lmc fit --config {run / 'config.yaml'}" in caplog.text


def test_last_with_nothing_to_resume_is_an_error_unless_asked_to_start_fresh(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="no run to resume under"):
        _fit(data, tmp_path / "empty", "--ckpt_path=last", "--trainer.max_epochs=1")
    assert not list((tmp_path / "empty").rglob("*.ckpt"))
    _fit(
        data,
        tmp_path / "empty",
        "--ckpt_path=last",
        "--fresh_if_nothing_to_resume=true",
        "--trainer.max_epochs=1",
    )
    assert len(run_dirs(tmp_path / "empty")) == 1


def test_a_rerun_from_a_saved_config_lands_under_its_own_root(data, tmp_path):
    _fit(data, tmp_path / "old", "--trainer.max_epochs=1")
    [old] = run_dirs(tmp_path / "old")
    run_cli(
        "fit",
        "--config",
        str(old / "config.yaml"),
        f"--trainer.default_root_dir={tmp_path / 'new'}",
    )
    [new] = run_dirs(tmp_path / "new")
    assert new.is_relative_to(tmp_path / "new") and run_dirs(tmp_path / "old") == [old]
    for k, v in _final(old)["state_dict"].items():  # and reproduces the run
        assert torch.equal(v, _final(new)["state_dict"][k]), k


def test_the_csv_overlay_follows_the_root(data, tmp_path):
    _fit(
        data,
        tmp_path / "csv",
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        "--trainer.max_epochs=1",
    )
    [run] = run_dirs(tmp_path / "csv")
    assert run.is_relative_to(tmp_path / "csv") and (run / "metrics.csv").is_file()


def test_a_full_disk_while_checkpointing_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from lmc.engine.resume import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"epoch": 0, "w": torch.ones(3)}, path)

    def full_disk(obj, f):
        f.write(b"\0" * 1000)  # a partial file, as a full disk leaves it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=r"no space left on device writing .*last\.ckpt.*unchanged"):
        io.save_checkpoint({"epoch": 1, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["epoch"] == 0
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


CSV = ["-c", str(CONFIGS / "loggers" / "csv.yaml"), "--trainer.log_every_n_steps=2"]


def test_a_resumed_csv_run_keeps_every_row_and_resumes_the_newest_weights(
    data, tmp_path, monkeypatch
):
    """Issue 46: the resumed run's metrics.csv is the uninterrupted run's row for row (Lightning
    would delete the rows before the checkpoint), and a root given relative the first time and
    absolute the second still resumes into last.ckpt (not a last-v1.ckpt beside a stale one)."""
    from lmc.io import resolve_checkpoint

    _fit(data, tmp_path / "straight", *CSV)
    [straight] = run_dirs(tmp_path / "straight")
    monkeypatch.chdir(tmp_path)
    crash = ["--trainer.callbacks+=tests.crash.CrashAt", "--trainer.callbacks.epoch=1"]
    with pytest.raises(Crash):
        _fit(data, Path("crashed"), *CSV, *crash)  # relative root
    [crashed] = run_dirs(tmp_path / "crashed")
    logged = (crashed / "metrics.csv").read_text().splitlines()
    assert any(row.startswith("1,") for row in logged[1:])  # epoch-1 rows, dropped on resume
    orphan = crashed / "checkpoints" / ".last.ckpt.x1y2.tmp.ckpt"  # a write SIGKILL cut short
    orphan.write_bytes(b"PK\x03\x04 half a checkpoint")
    assert resolve_checkpoint(crashed) == crashed / "checkpoints" / "last.ckpt"  # not read
    _fit(data, tmp_path / "crashed", *CSV, "--ckpt_path=last")  # the same root, absolute
    assert not orphan.exists()  # removed by the resume
    assert run_dirs(tmp_path / "crashed") == [crashed]
    assert (crashed / "metrics.csv").read_text() == (straight / "metrics.csv").read_text()
    names = sorted(p.name for p in (crashed / "checkpoints").glob("*.ckpt"))
    assert names == ["epoch=2-step=24.ckpt", "last.ckpt"]
    assert resolve_checkpoint(crashed) == crashed / "checkpoints" / "last.ckpt"
    assert _final(crashed)["epoch"] == 2
    for k, v in _final(straight)["state_dict"].items():
        assert torch.equal(v, _final(crashed)["state_dict"][k]), k
    # resumed once more (nothing left to train): still one last.ckpt, rows unchanged
    _fit(data, Path("crashed"), *CSV, "--ckpt_path=last")
    assert sorted(p.name for p in (crashed / "checkpoints").glob("*.ckpt")) == names


def test_a_checkpoint_state_of_the_same_folder_spelt_otherwise_is_respelt(tmp_path):
    from lmc.engine.resume import respell_checkpoint_state

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    old, new = "run/checkpoints", str(tmp_path / "run" / "checkpoints")
    state = {
        "dirpath": old,
        "last_model_path": f"{old}/last.ckpt",
        "best_model_path": f"{old}/epoch=0-step=8.ckpt",
        "best_k_models": {f"{old}/epoch=0-step=8.ckpt": 1.0},
    }
    other = dict(state)
    respell_checkpoint_state(other, new)  # relative to another working directory
    assert other == state
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        respell_checkpoint_state(state, new)
    finally:
        os.chdir(cwd)
    assert state == {
        "dirpath": new,
        "last_model_path": f"{new}/last.ckpt",
        "best_model_path": f"{new}/epoch=0-step=8.ckpt",
        "best_k_models": {f"{new}/epoch=0-step=8.ckpt": 1.0},
    }
