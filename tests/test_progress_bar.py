"""``lmc fit``'s progress bar: Lightning's tqdm bar redrawn at most ten times a second."""

from __future__ import annotations

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar

from lmc.cli import build_cli
from lmc.engine import progress
from lmc.engine.progress import ProgressBar
from tests.helpers import CONFIGS


def test_the_bar_redraws_after_min_interval_and_on_the_last_batch(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    bar = ProgressBar(refresh_rate=2, min_interval=0.1)
    drawn = []
    for n in range(1, 12):  # 11 batches, 0.03 s each
        clock[0] += 0.03
        if bar._should_update(n, 11):
            drawn.append(n)
    # every second batch at most (refresh_rate), 0.1 s apart at least, and the last one
    assert drawn == [2, 6, 10, 11]
    every = ProgressBar(min_interval=0)  # Lightning's behaviour: every batch
    assert all(every._should_update(n, 5) for n in range(1, 6))
    with pytest.raises(ValueError, match="min_interval must be >= 0"):
        ProgressBar(min_interval=-1)


def _trainer(tmp_path, *extra):
    args = ["-c", str(CONFIGS / "mnist" / "mlp.yaml"), "-c", str(CONFIGS / "loggers" / "csv.yaml")]
    return build_cli([*args, f"--trainer.default_root_dir={tmp_path}", *extra], run=False).trainer


def test_lmc_fit_shows_the_throttled_bar_unless_the_config_names_one_or_none(tmp_path):
    assert type(_trainer(tmp_path).progress_bar_callback) is ProgressBar
    own = _trainer(
        tmp_path,
        "--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar",
        "--trainer.callbacks.refresh_rate=5",
    ).progress_bar_callback
    assert type(own) is TQDMProgressBar and own.refresh_rate == 5
    assert _trainer(tmp_path, "--trainer.enable_progress_bar=false").progress_bar_callback is None
