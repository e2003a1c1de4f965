"""The captured training step (issue 30): what it refuses, before training, and on a GPU the
replayed steps train as the eager ones."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lmc.tasks import ClassificationTask
from lmc.tasks.capture import WARMUP_STEPS, capture_problems

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def loader(n: int = 100, batch: int = 16) -> DataLoader:
    """100 samples in batches of 16: six full ones (warm-up, capture, replays) and a last of 4."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def task(
    capture: bool, scheduler: bool = False, sgd: bool = False, capturable: bool = False
) -> ClassificationTask:
    """A net with BatchNorm; no bias before it (a bias there has a zero gradient, which Adam's
    normalised steps turn into round-off-driven steps of ``lr``: no two summation orders agree)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(6, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3)
    )
    if sgd:
        optimizer = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731
    else:
        optimizer = lambda p: torch.optim.Adam(p, lr=0.01, capturable=capturable)  # noqa: E731
    sched = (lambda o: torch.optim.lr_scheduler.StepLR(o, 1)) if scheduler else None
    return ClassificationTask(
        net, num_classes=3, optimizer=optimizer, lr_scheduler=sched, capture_step=capture
    )


def trainer(root, device: str = "cuda", epochs: int = 3, **kw) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        accelerator=device,
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def test_capture_on_the_cpu_is_refused_before_training(tmp_path):
    model = task(capture=True, scheduler=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = trainer(tmp_path, device="cpu", precision="bf16-mixed")
    with pytest.raises(ValueError) as err:
        t.fit(model, train_dataloaders=loader())
    message = str(err.value)
    assert "needs a CUDA device" in message and "drop capture_step, or train on a GPU" in message
    assert "lr_scheduler would not act" in message and "precision 'bf16-mixed'" in message
    assert t.global_step == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_capture_with_clipping_is_refused(tmp_path):
    t = trainer(tmp_path, device="cpu", gradient_clip_val=1.0)
    model = task(capture=True)
    model.trainer = t
    assert any("gradient_clip_val" in p for p in capture_problems(model, t))


def check_replay_trains_as_eager(root, sgd: bool) -> None:
    runs = {}
    for capture in (False, True):
        model = task(capture, sgd=sgd, capturable=True)  # the same optimizer arithmetic
        t = trainer(root / str(capture))
        t.fit(model, train_dataloaders=loader())
        runs[capture] = (model, t)
    (eager, te), (captured, tc) = runs[False], runs[True]
    step = captured._captured_step
    assert step.graph is not None and step.warm == WARMUP_STEPS  # recorded, then replayed
    assert tc.global_step == te.global_step == 21
    for k, v in eager.state_dict().items():  # BatchNorm's running stats included
        torch.testing.assert_close(captured.state_dict()[k], v, atol=1e-5, rtol=1e-4)
    for k in ("train/loss", "train/acc"):
        torch.testing.assert_close(tc.callback_metrics[k], te.callback_metrics[k])


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("sgd", [False, True], ids=["adam", "sgd-momentum"])
def test_replayed_steps_train_as_eager_steps(tmp_path, sgd):
    check_replay_trains_as_eager(tmp_path, sgd)


@pytest.mark.gpu
@cuda
def test_a_captured_run_resumes(tmp_path):
    """A checkpoint of an eager run resumes captured (its step counts moved to the device; the
    device's Adam arithmetic differs from the host's by round-off)."""
    whole = task(False)
    trainer(tmp_path / "whole").fit(whole, train_dataloaders=loader())
    part = trainer(tmp_path / "part", epochs=2)
    part.fit(task(False), train_dataloaders=loader())
    part.save_checkpoint(tmp_path / "part.ckpt")
    resumed = task(True)
    t = trainer(tmp_path / "resumed")
    t.fit(resumed, train_dataloaders=loader(), ckpt_path=str(tmp_path / "part.ckpt"))
    assert t.global_step == 21 and resumed._captured_step.graph is not None
    for k, v in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, atol=1e-5, rtol=1e-4)


def fit_overlay(root, accelerator: str) -> None:
    from tests.helpers import CONFIGS, run_cli

    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "synthetic" / "teacher_student.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        "-c",
        str(CONFIGS / "speed" / "capture.yaml"),
        f"--trainer.accelerator={accelerator}",
        "--data.init_args.batch_size=200",
        "--trainer.max_steps=30",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
    )


def test_the_capture_overlay_on_the_cpu_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="capture_step needs a CUDA device.*drop capture_step"):
        fit_overlay(tmp_path, "cpu")


@pytest.mark.gpu
@cuda
def test_the_capture_overlay_trains_on_a_gpu(tmp_path):
    import yaml

    from tests.helpers import checkpoints, run_dirs

    fit_overlay(tmp_path, "gpu")
    [run] = run_dirs(tmp_path)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["init_args"]["capture_step"] is True
    ckpt = torch.load(checkpoints(run)[-1], weights_only=True)
    assert ckpt["global_step"] == 30
