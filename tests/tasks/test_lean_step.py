"""The lean training step (issue 30): ``TrainTask`` steps its optimizer itself unless the trainer
needs Lightning's automatic loop, with the automatic loop's arithmetic and step counts."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lmc.tasks import ClassificationTask


class AutomaticTask(ClassificationTask):
    """The same task run by Lightning's automatic loop (its own ``training_step``)."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)


class Recorder(L.Callback):
    """Learning rates, losses and step counts seen along a run."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.losses.append(float(outputs["loss"]))
        self.steps.append(trainer.global_step)


def loader(n: int = 96, batch: int = 16, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch)  # in order: resumes alike


def task(cls=ClassificationTask, interval: str = "step") -> ClassificationTask:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    return cls(
        net,
        num_classes=3,
        optimizer=lambda p: torch.optim.Adam(p, lr=0.05),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        scheduler_interval=interval,
    )


def fit(model, root, epochs: int = 3, device: str = "cpu", ckpt=None, callbacks=(), **trainer):
    rec = Recorder()
    t = L.Trainer(
        max_epochs=epochs,
        accelerator=device,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rec, *callbacks],
        **trainer,
    )
    t.fit(model, train_dataloaders=loader(), ckpt_path=ckpt)
    return t, rec


def check_lean_is_automatic(root, device: str = "cpu", precision: str = "32-true") -> None:
    for interval in ("step", "epoch"):
        lean, auto = task(interval=interval), task(AutomaticTask, interval)
        t_lean, r_lean = fit(lean, root / f"lean_{interval}", device=device, precision=precision)
        t_auto, r_auto = fit(auto, root / f"auto_{interval}", device=device, precision=precision)
        assert not lean.automatic_optimization and auto.automatic_optimization
        # true-precision steps take the direct path (no hook overridden); mixed precision
        # Lightning's, through its plugin
        assert lean._direct_step == ("mixed" not in precision)
        assert t_lean.global_step == t_auto.global_step == 18
        assert r_lean.steps == r_auto.steps == list(range(1, 19))
        assert r_lean.lrs == r_auto.lrs  # the scheduler stepped at the same points
        assert r_lean.lrs[-1] == (0.05 * 0.5**9 if interval == "step" else 0.05 * 0.5)
        assert r_lean.losses == r_auto.losses
        for k, v in auto.net.state_dict().items():
            assert torch.equal(lean.net.state_dict()[k], v), k
        assert t_lean.callback_metrics.keys() == t_auto.callback_metrics.keys()
        for k, v in t_auto.callback_metrics.items():
            assert torch.equal(t_lean.callback_metrics[k], v), k


def test_the_lean_step_is_the_automatic_loop(tmp_path):
    check_lean_is_automatic(tmp_path)


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_the_lean_step_under_other_precisions_is_the_automatic_loop(tmp_path, precision):
    check_lean_is_automatic(tmp_path, precision=precision)


class GradNorms(L.Callback):
    """A callback reading the gradients before every step, as one logging gradient norms does."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.optimizers: list[object] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.optimizers.append(optimizer)
        self.norms.append(
            float(torch.cat([p.grad.flatten() for p in pl_module.parameters()]).norm())
        )


class AfterBackward(ClassificationTask):
    def on_after_backward(self) -> None:
        self.seen = getattr(self, "seen", 0) + 1


def test_a_hook_between_loss_and_update_keeps_lightnings_path_and_the_same_run(tmp_path):
    """The direct path is taken only where Lightning's hooks would do nothing: a callback or the
    module overriding one of them gets Lightning's path, called every step as Lightning calls
    it, and the run is bitwise the direct one."""
    direct = task()
    t_direct, r_direct = fit(direct, tmp_path / "direct")
    norms = GradNorms()
    hooked = task()
    t_hooked, r_hooked = fit(hooked, tmp_path / "hooked", callbacks=[norms])
    after = task(AfterBackward)
    t_after, r_after = fit(after, tmp_path / "after")
    assert direct._direct_step and not hooked._direct_step and not after._direct_step
    assert len(norms.norms) == after.seen == 18 and min(norms.norms) > 0
    assert all(o is t_hooked.optimizers[0] for o in norms.optimizers)  # the torch optimizer
    for t, r, m in ((t_hooked, r_hooked, hooked), (t_after, r_after, after)):
        assert t.global_step == t_direct.global_step == 18
        assert r.steps == r_direct.steps and r.losses == r_direct.losses
        for k, v in direct.net.state_dict().items():
            assert torch.equal(m.net.state_dict()[k], v), k


@pytest.mark.parametrize("trainer", [{"gradient_clip_val": 0.5}, {"accumulate_grad_batches": 2}])
def test_clipping_or_accumulation_runs_the_automatic_loop(tmp_path, trainer):
    lean, auto = task(), task(AutomaticTask)
    t_lean, _ = fit(lean, tmp_path / "a", epochs=1, **trainer)
    t_auto, _ = fit(auto, tmp_path / "b", epochs=1, **trainer)
    assert lean.automatic_optimization
    assert t_lean.global_step == t_auto.global_step
    for k, v in auto.net.state_dict().items():
        assert torch.equal(lean.net.state_dict()[k], v), k


@pytest.mark.parametrize("first", [AutomaticTask, ClassificationTask])
def test_resuming_across_the_two_loops_keeps_the_step_count(tmp_path, first):
    """A checkpoint of either loop resumes in the other at its step count, to the weights of an
    uninterrupted run (checkpoints written before the lean step resume in it)."""
    whole, _ = fit(task(), tmp_path / "whole", epochs=3)
    t1, _ = fit(task(first), tmp_path / "part", epochs=2)
    ckpt = tmp_path / "part.ckpt"
    t1.save_checkpoint(ckpt)
    second = AutomaticTask if first is ClassificationTask else ClassificationTask
    resumed = task(second)
    t2, rec = fit(resumed, tmp_path / "resumed", epochs=3, ckpt=str(ckpt))
    assert rec.steps == list(range(13, 19))
    assert t2.global_step == whole.global_step == 18
    for k, v in whole.lightning_module.net.state_dict().items():
        assert torch.equal(resumed.net.state_dict()[k], v), k


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_the_lean_step_on_cuda_is_the_automatic_loop(tmp_path, precision):
    check_lean_is_automatic(tmp_path, device="cuda", precision=precision)


def test_accuracy_is_torchmetrics_multiclass_accuracy():
    from torchmetrics.classification import MulticlassAccuracy

    from lmc.tasks.classification import Accuracy

    g = torch.Generator().manual_seed(0)
    ours, theirs = Accuracy(5), MulticlassAccuracy(5, average="micro")
    for shape in [(7, 5), (3, 5, 4, 2), (1, 5)]:  # (N, C) and (N, C, ...) outputs
        out = torch.randn(*shape, generator=g)
        out[0, 1] = out[0, 2]  # a tie: both take the first largest
        target = torch.randint(0, 5, (shape[0], *shape[2:]), generator=g)
        ours.update(out, target)
        theirs.update(out, target)
        assert ours.compute().item() == pytest.approx(theirs.compute().item(), abs=1e-7)
    with pytest.raises(ValueError, match="num_classes=5.*set num_classes"):
        ours.update(torch.randn(4, 10), torch.zeros(4, dtype=torch.long))
