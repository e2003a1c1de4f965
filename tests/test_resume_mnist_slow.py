"""Kill -9 during epoch 2 of a real MNIST run, resume with `--ckpt_path last`: the final weights
and optimizer state equal the uninterrupted run's bit for bit (issue 13's drill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import CONFIGS, copy_shared_mnist, run_dirs

pytestmark = pytest.mark.slow


def _command(data: Path, root: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lmc",
        "fit",
        "-c",
        str(CONFIGS / "mnist" / "mlp.yaml"),
        "--seed_everything=0",
        "--trainer.max_epochs=3",
        "--trainer.limit_train_batches=100",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
        f"--data.init_args.data_dir={data}",
        "--trainer.logger.init_args.offline=true",
        *extra,
    ]


def _env() -> dict[str, str]:
    # Not the W&B service of this pytest process (earlier in-process runs start one and export
    # WANDB_SERVICE): the killed run's stream would stay registered there ("run ID is in use"),
    # which a separate `lmc fit` process, as a user runs it, never shares.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_SERVICE")}
    return {**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def test_sigkill_in_epoch_two_then_resume_equals_the_uninterrupted_run(tmp_path):
    data = copy_shared_mnist(tmp_path / "data")
    subprocess.run(_command(data, tmp_path / "straight"), check=True, env=_env(), timeout=900)
    proc = subprocess.Popen(_command(data, tmp_path / "killed"), env=_env())
    last = None
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:  # wait for the end of epoch 1
        found = list((tmp_path / "killed").glob("*/*/checkpoints/last.ckpt"))
        if found and torch.load(found[0], weights_only=True, mmap=True)["epoch"] >= 1:
            last = found[0]
            break
        time.sleep(0.2)
    time.sleep(0.5)  # into epoch 2 (100 batches: about 2.5 s an epoch here)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert last is not None, "the run ended before it could be killed"
    assert torch.load(last, weights_only=True)["epoch"] == 1
    subprocess.run(
        _command(data, tmp_path / "killed", "--ckpt_path=last"), check=True, env=_env(), timeout=900
    )
    [straight], [killed] = run_dirs(tmp_path / "straight"), run_dirs(tmp_path / "killed")
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 2
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), k
    for sa, sb in zip(
        a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()
    ):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
