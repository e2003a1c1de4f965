"""benchmarks/ste_mm_official.py: the official STE-MM checkout is checked before anything runs,
and its epoch is timed and its printed loss read back as a mean batch loss."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import ste_mm_official as bench

# A stand-in for the official code's two modules: ste() walks the loader once and prints what
# the official one prints (the sum of the batch means over the number of examples).
STE = """
def ste(model_a, models, train_loader, test_loader, lr, epochs, mid, device, shape, fast):
    total, n = 0.0, 0
    for x, y in train_loader:
        total += float(y.float().mean())
        n += len(x)
    print('acc/train:', 0.5, 0)
    print('loss/train:', total / n, 0)
    return [model_a, *models], []
"""
MLP = """
import torch.nn as nn

class Net(nn.Module):
    def __init__(self, w=1):
        super().__init__()
        self.layer0 = nn.Linear(3, 2)
"""


def _official(tmp_path, built=True):
    srcs = tmp_path / "srcs"
    (srcs / "search" / "mult").mkdir(parents=True)
    (srcs / "networks").mkdir()
    (srcs / "search" / "__init__.py").write_text("")
    (srcs / "search" / "mult" / "__init__.py").write_text("")
    (srcs / "search" / "mult" / "ste.py").write_text(STE)
    (srcs / "networks" / "__init__.py").write_text("")
    (srcs / "networks" / "mlp.py").write_text(MLP)
    if built:
        (srcs / "lap_uv.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    return srcs


def test_a_folder_that_is_not_the_official_srcs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no search/mult/ste.py there; pass the srcs folder"):
        bench.official_modules(tmp_path)


def test_an_unbuilt_lap_module_is_refused_with_the_way_to_build_it(tmp_path):
    with pytest.raises(SystemExit, match="lap_uv is not built; build it as this script's"):
        bench.official_modules(_official(tmp_path, built=False))


def test_the_official_epoch_is_timed_and_its_printed_loss_read_as_a_batch_mean(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("search", "search.mult", "search.mult.ste", "networks", "networks.mlp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ste, net = bench.official_modules(_official(tmp_path))
    state = {"layer0.weight": torch.ones(2, 3), "layer0.bias": torch.zeros(2)}
    batches = [(torch.zeros(4, 3), torch.tensor([0, 1, 1, 0])), (torch.zeros(2, 3), torch.ones(2))]
    seconds, loss = bench.official_epoch(ste, net, [state, state], batches)
    assert seconds >= 0
    assert loss == pytest.approx((0.5 + 1.0) / 2)  # the mean of the two batch means
    assert capsys.readouterr().out == ""  # what it printed was captured, not shown
