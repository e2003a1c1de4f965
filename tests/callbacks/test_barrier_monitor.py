"""BarrierMonitor: known answer on a frozen model and its permuted copy, read back from CSV."""

from __future__ import annotations

import csv

import lightning as L
import torch

from callbacks import BarrierMonitor
from lmc.data import TeacherStudentDataModule
from lmc.models import MLP
from lmc.permutation import apply_permutation, random_permutation, spec_for
from lmc.tasks import RegressionTask


def test_barrier_monitor_logs_zero_matched_barrier_for_a_permuted_copy(tmp_path):
    torch.manual_seed(0)
    net = MLP(6, 1, width=24, depth=2)
    dm = TeacherStudentDataModule(input_dim=6, n_train=64, n_val=32, n_test=32, batch_size=16)
    x, y = next(iter(dm.alignment_dataloader(64)))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(200):  # a trained model: its permuted copy sits across a real barrier
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    spec = spec_for(net)
    state = net.state_dict()
    permuted = apply_permutation(state, spec, random_permutation(spec.sizes(state), 1))
    ref = tmp_path / "ref.ckpt"
    torch.save({"state_dict": {f"net.{k}": v for k, v in permuted.items()}}, ref)

    # lr = 0: the trained model stays at its init, so the answer is known exactly.
    task = RegressionTask(net, optimizer=lambda p: torch.optim.SGD(p, lr=0.0))
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    trainer = L.Trainer(
        max_epochs=2,
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[BarrierMonitor([str(ref)], epochs=[1], num_alphas=5)],
        accelerator="cpu",
    )
    trainer.fit(task, dm)
    rows = list(csv.DictReader(open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")))
    logged = [r for r in rows if r.get("barrier/0/loss_matched")]
    assert len(logged) == 1 and float(logged[0]["epoch"]) == 1.0
    assert abs(float(logged[0]["barrier/0/loss_matched"])) < 1e-6
    assert float(logged[0]["barrier/0/loss_naive"]) > 1e-4
