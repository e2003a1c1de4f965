"""Real MNIST check of the callbacks (slow; run with -m slow): benchmarks/callbacks.py's numbers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _shared_datasets() -> Path:
    env = os.environ.get("LMC_SHARED_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "datasets"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, float]:
    source = _shared_datasets() / "MNIST" / "raw"
    if not list(source.glob("*-ubyte.gz")):
        pytest.skip(f"no MNIST .gz files in {source} (set LMC_SHARED_DATASETS)")
    root = tmp_path_factory.mktemp("mnist")
    (root / "MNIST" / "raw").mkdir(parents=True)
    for gz in source.glob("*-ubyte.gz"):
        shutil.copyfile(gz, root / "MNIST" / "raw" / gz.name)
    from benchmarks.callbacks import run

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMC_DATA_DIR", str(root))
        return run(epochs=3, finetune_epochs=1, rate=0.5, root=root / "runs")


def test_pruning_half_then_fine_tuning_keeps_test_accuracy(results):
    assert results["dense_acc"] > 0.95
    assert results["pruned_acc"] >= results["dense_acc"] - 0.01
    assert results["sparsity_layer0"] == 0.5


def test_pruning_lowers_the_first_layer_discrete_entropy(results):
    """000 §4.3, Lemma 4.1."""
    assert results["entropy_pruned_discrete"] < results["entropy_trained_discrete"]


@pytest.mark.xfail(
    strict=True,
    reason="With the 004 recipe (Adam 1e-3, PyTorch's default U(-1/28, 1/28) init) training "
    "spreads the first-layer weights: H̃ rises from about -2.62 to -2.27 nats after 3 epochs. "
    "000 shows the entropy drop on the 1-D polynomial tasks (§4.2), not on MNIST.",
)
def test_trained_first_layer_entropy_is_lower_than_at_init(results):
    assert results["entropy_trained"] < results["entropy_init"]
