"""Shared fixtures: W&B offline with every directory under tmp_path, headless matplotlib."""

from __future__ import annotations

import os

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Keep W&B offline and inside tmp_path; never read the user's data dir by accident."""
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        d = tmp_path / "wandb_env" / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield


@pytest.fixture
def one_thread():
    """Run single-threaded: for tiny tensors a second intra-op thread only adds synchronisation
    cost, which grows sharply when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)


@pytest.fixture(params=["cpu", CUDA])
def device(request) -> str:
    """Where a test runs its tensors: the CPU (the default suite) and, marked ``gpu``, CUDA
    (``pytest -m gpu`` on a machine with a GPU; benchmarks/gpu.py runs them there)."""
    return request.param


@pytest.fixture(params=["cpu", CUDA])
def accelerator(request) -> str:
    """Lightning's ``trainer.accelerator`` for a CLI test: ``cpu`` and, marked ``gpu``, ``gpu``."""
    return "gpu" if request.param == "cuda" else "cpu"
