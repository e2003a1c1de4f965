"""Real MNIST check of the callbacks (slow; run with -m slow): benchmarks/callbacks.py's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import copy_shared_mnist

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory) -> Path:
    return copy_shared_mnist(tmp_path_factory.mktemp("mnist"))


def _run(root: Path, recipe: str) -> dict[str, float]:
    from benchmarks.callbacks import run

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMC_DATA_DIR", str(root))
        return run(epochs=3, finetune_epochs=1, rate=0.5, root=root / recipe, recipe=recipe)


@pytest.fixture(scope="module")
def results(mnist_root) -> dict[str, float]:
    """He-normal init, SGD with weight decay (configs/callbacks/mnist_mlp_entropy.yaml)."""
    return _run(mnist_root, "sgd")


def test_pruning_half_then_fine_tuning_keeps_test_accuracy(results):
    assert results["dense_acc"] > 0.95
    assert results["pruned_acc"] >= results["dense_acc"] - 0.01
    assert results["sparsity_layer0"] == 0.5


def test_pruning_lowers_the_first_layer_discrete_entropy(results):
    """000 §4.3, Lemma 4.1."""
    assert results["entropy_pruned_discrete"] < results["entropy_trained_discrete"]


def test_trained_first_layer_entropy_is_lower_than_at_init(results):
    """000 §4.2: training concentrates the neuron distribution (here through weight decay)."""
    assert results["entropy_init"] == pytest.approx(-1.5677, abs=0.01)  # ½ ln(2πe·2/784)
    assert results["entropy_trained"] < results["entropy_init"] - 0.2


def test_without_weight_decay_adam_training_raises_the_entropy(mnist_root):
    """The contrast the benchmark reports: the 004 recipe (Adam, default init) spreads the small
    initial weights, so the entropy decrease on MNIST belongs to the recipe."""
    r = _run(mnist_root, "adam")
    assert r["entropy_trained"] > r["entropy_init"]
    assert r["pruned_acc"] >= r["dense_acc"] - 0.01
