"""MagnitudePruning inside one fit: schedules, fixed masks, rewinds, dense checkpoints, resume."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import MagnitudePruning
from lmc.io import load_checkpoint
from lmc.metrics import is_pruned, weight_layers
from lmc.pruning import dense_snapshot
from tests.callbacks.conftest import series, tiny_task

LAYERS = ("layers.0", "layers.1", "head")


def _ckpt(tmp_path, **kwargs) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, save_last=True, **kwargs)


def _zeros(state: dict, name: str) -> torch.Tensor:
    return state[f"net.{name}.weight"] == 0


class Probe(L.Callback):
    """Records the network right after MagnitudePruning's epoch-start hook (listed after it)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[dict, dict, int]] = {}

    def on_train_epoch_start(self, trainer, pl_module):
        net = pl_module.net
        masks = {n: m.weight_mask.clone() for n, m in weight_layers(net).items() if is_pruned(m)}
        state = {n: m.weight.detach().clone() for n, m in weight_layers(net).items()}
        opt_state = sum(len(opt.state) for opt in trainer.optimizers)
        self.seen[trainer.current_epoch] = (masks, state, opt_state)


def test_finetune_once_logs_schedule_keeps_masks_and_saves_dense_checkpoints(fit, tmp_path):
    pruning = MagnitudePruning("finetune_once", rate=0.5, prune_epoch=1)
    weights_only = ModelCheckpoint(  # a monitor only to differ from the other one's state key
        dirpath=tmp_path / "w", save_top_k=-1, save_weights_only=True, monitor="train/loss"
    )
    callbacks = [pruning, _ckpt(tmp_path), weights_only]
    trainer, task, rows = fit(callbacks, max_epochs=3, enable_checkpointing=True)
    assert [v for _, v in series(rows, "prune/rate")] == [0.0, 0.5, 0.5]
    for name, module in weight_layers(task.net).items():
        n = module.weight.numel()
        logged = [v for _, v in series(rows, f"prune/sparsity/{name}")]
        assert logged[1:] == [pytest.approx(math.floor(0.5 * n) / n)] * 2
        assert not is_pruned(module) and not module._forward_pre_hooks  # permanent at the end
    dense_keys = list(tiny_task().state_dict())
    e1 = load_checkpoint(tmp_path / "ckpt" / "epoch=1-step=8.ckpt")["state_dict"]  # hooks active
    e2 = load_checkpoint(tmp_path / "ckpt" / "epoch=2-step=12.ckpt")["state_dict"]
    assert list(e1) == dense_keys and list(e2) == dense_keys
    fresh = tiny_task(seed=1)
    fresh.load_state_dict(e1)  # strict load into the dense model
    w1 = load_checkpoint(tmp_path / "w" / "epoch=1-step=8.ckpt")["state_dict"]  # no callback hooks
    assert list(w1) == dense_keys and all(torch.equal(w1[k], e1[k]) for k in w1)
    for name in LAYERS:
        assert torch.equal(_zeros(e1, name), _zeros(e2, name))  # fixed while fine-tuning
        assert int(_zeros(e2, name).sum()) == math.floor(0.5 * e2[f"net.{name}.weight"].numel())


def test_lottery_ticket_rounds_rewind_survivors_to_init_bit_for_bit(fit):
    task = tiny_task()
    init = dense_snapshot(task.net)
    probe = Probe()
    pruning = MagnitudePruning("lottery_ticket", rate=0.75, prune_epoch=1, rounds=2)
    _, _, rows = fit([pruning, probe], max_epochs=3, task=task)
    assert [v for _, v in series(rows, "prune/rate")] == pytest.approx([0.0, 0.5, 0.75])
    for epoch in (1, 2):
        masks, state, opt_state = probe.seen[epoch]
        assert opt_state == 0  # optimizer state reset with the rewind
        for name in LAYERS:
            keep = masks[name].bool()
            assert torch.equal(state[name][keep], init[f"{name}.weight"][keep])
            assert bool((state[name][~keep] == 0).all())
    assert (probe.seen[2][0]["head"] <= probe.seen[1][0]["head"]).all()  # masks only grow


def test_iterative_reaches_the_target_through_the_schedule(fit):
    pruning = MagnitudePruning(
        "iterative", rate=0.875, prune_epoch=1, rounds=3, reset_optimizer=True
    )
    _, task, rows = fit([pruning], max_epochs=4)
    assert [v for _, v in series(rows, "prune/rate")] == pytest.approx([0.0, 0.5, 0.75, 0.875])
    w = task.net.layers[0].weight
    assert int((w == 0).sum()) == math.floor(0.875 * w.numel())


def test_only_prune_prunes_after_the_last_step_before_validation_and_checkpoint(fit, tmp_path):
    pruning = MagnitudePruning("only_prune", rate=0.5)
    trainer, task, rows = fit([pruning, _ckpt(tmp_path)], max_epochs=2, enable_checkpointing=True)
    assert [v for _, v in series(rows, "prune/rate")] == [0.0, 0.5]
    last = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["state_dict"]
    first = load_checkpoint(tmp_path / "ckpt" / "epoch=0-step=4.ckpt")["state_dict"]
    for name in LAYERS:
        n = last[f"net.{name}.weight"].numel()
        assert int(_zeros(last, name).sum()) == n // 2 and int(_zeros(first, name).sum()) == 0
    assert torch.equal(task.net.head.weight, last["net.head.weight"])


def test_resume_reapplies_the_masks_from_the_callback_state(fit, tmp_path):
    fit(
        [MagnitudePruning(rate=0.5, prune_epoch=1), _ckpt(tmp_path)],
        max_epochs=2,
        enable_checkpointing=True,
    )
    ckpt = tmp_path / "ckpt" / "epoch=1-step=8.ckpt"
    before = load_checkpoint(ckpt)["state_dict"]
    assert set(load_checkpoint(ckpt)["callbacks"]) and not any(k.endswith("_mask") for k in before)
    resumed = MagnitudePruning(rate=0.5, prune_epoch=1, permanent_at_end=False)
    _, task, _ = fit([resumed], max_epochs=4, ckpt_path=str(ckpt), task=tiny_task(seed=3))
    for name, module in weight_layers(task.net).items():
        assert is_pruned(module)
        assert torch.equal(module.weight_mask == 0, _zeros(before, name))


def test_invalid_schedule_is_rejected_at_construction():
    with pytest.raises(ValueError, match="rounds"):
        MagnitudePruning("finetune_once", rate=0.5, rounds=3)
