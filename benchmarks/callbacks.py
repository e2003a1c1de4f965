"""Real-data check of the training-time callbacks on MNIST (issue 5, SPEC C5).

Trains the MNIST MLP (784-512-512-512-10) for ``--epochs`` epochs with
:class:`callbacks.NeuronEntropyMonitor` attached, tests it, then runs a second ``fit`` with
:class:`callbacks.MagnitudePruning` (``finetune_once``: prune ``--rate`` of every layer at the
first step, fine-tune ``--finetune-epochs`` epochs with a fresh optimizer of the same recipe) and
tests again. Entropy is the first layer's per-element H̃ with the default estimator (pooled 2^10
bins over [-1, 1], plus ln Δ; comparable to the closed forms, e.g. ½ ln(2πe σ_He²) = -1.57 for
He-normal init of a 784-input layer, ln(2/28) = -2.64 for PyTorch's default U(-1/28, 1/28)).

Two training recipes (``configs/callbacks/mnist_mlp_entropy.yaml`` is the first):

* ``sgd`` (the key line): He-normal init (000 §4.1 with c_d = 1), SGD lr 0.1, momentum 0.9,
  weight decay 5e-4, batch 100 (000 A.1.2: SGD, batch 100; momentum and weight decay are lmc's,
  000 sets weight decay only for ResNet20). Weight decay pulls the weights of uninformative
  inputs towards zero, so the first-layer neuron distribution concentrates and H̃ falls, the
  training-time entropy decrease of 000 §4.2.
* ``adam`` (``--contrast``): the 004 App. B.1 recipe of ``configs/mnist/mlp.yaml`` (default
  init, Adam 1e-3, batch 512, no weight decay). Here training spreads the small initial weights
  and H̃ *rises*; the same happens with He-normal init and SGD without weight decay. The
  entropy decrease on MNIST is a property of the recipe, not of training as such.

Also times the pure functions against baselines measured in the same run: our exact-count mask vs
``torch.nn.utils.prune.l1_unstructured`` (same counts), and the entropy histogram vs
``numpy.histogram``.

Run ``LMC_DATA_DIR=<writable copy of the datasets> python benchmarks/callbacks.py``. The last line
is ``entropy_init=<..> entropy_trained=<..> dense_acc=<..> pruned50_acc=<..>`` (``sgd`` recipe).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as a script, this folder is on sys.path and this file would shadow the `callbacks` package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch.nn.utils import prune  # noqa: E402

from benchmarks._endpoints import require_data  # noqa: E402
from callbacks import MagnitudePruning, NeuronEntropyMonitor  # noqa: E402
from lmc.data import MNISTDataModule  # noqa: E402
from lmc.metrics import histogram_entropy, neuron_entropy, weight_layers  # noqa: E402
from lmc.models import MLP  # noqa: E402
from lmc.pruning import prune_magnitude  # noqa: E402
from lmc.tasks import ClassificationTask  # noqa: E402


def _trainer(epochs: int, callbacks: list[L.Callback], root: Path, accelerator: str) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        accelerator=accelerator,
        devices=1,
        callbacks=callbacks,
        logger=CSVLogger(root, name="bench"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def _best_of(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def baselines(net: torch.nn.Module) -> None:
    """Print time ratios of our pure functions against plain-PyTorch / NumPy baselines.

    Timed on one thread, like NumPy: on a shared 2-core machine OpenMP threads mostly contend.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ours = _best_of(lambda: prune_magnitude(copy.deepcopy(net), 0.5))
    theirs = _best_of(
        lambda: [
            prune.l1_unstructured(m, "weight", amount=0.5)
            for m in weight_layers(copy.deepcopy(net)).values()
        ]
    )
    w = net.layers[0].weight.detach()
    edges = np.linspace(-1.0, 1.0, 1025)

    def numpy_entropy() -> float:
        counts, _ = np.histogram(np.clip(w.numpy().ravel(), -1.0, 1.0), bins=edges)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())

    assert abs(numpy_entropy() - histogram_entropy(w, 10)) < 1e-6
    t_ours = _best_of(lambda: histogram_entropy(w, 10))
    t_numpy = _best_of(numpy_entropy)
    print(f"prune_magnitude / torch l1_unstructured time: {ours / theirs:.2f}")
    print(f"entropy histogram / numpy.histogram time: {t_ours / t_numpy:.2f}")
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Recipe:
    """How the MLP is initialised and trained (the fine-tuning optimizer is the same)."""

    init: str
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    batch_size: int
    note: str


RECIPES = {
    "sgd": Recipe(
        "he_normal",
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4),
        100,
        "He-normal init, SGD 0.1 / momentum 0.9 / weight decay 5e-4, batch 100 (000)",
    ),
    "adam": Recipe(
        "default",
        lambda p: torch.optim.Adam(p, lr=1e-3),
        512,
        "default init, Adam 1e-3, batch 512, no weight decay (004 App. B.1)",
    ),
}


def run(
    epochs: int = 3,
    finetune_epochs: int = 1,
    rate: float = 0.5,
    seed: int = 0,
    accelerator: str = "cpu",
    root: Path | None = None,
    recipe: str = "sgd",
) -> dict[str, float]:
    """Train, prune and fine-tune; returns the four numbers of the final line and extras."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    cfg = RECIPES[recipe]
    root = Path(root or tempfile.mkdtemp(prefix="lmc_bench_callbacks_"))
    L.seed_everything(seed, verbose=False)
    dm = MNISTDataModule(batch_size=cfg.batch_size, val_size=5000, alignment_size=5000)
    net = MLP(784, 10, width=512, depth=3, init=cfg.init)  # type: ignore[arg-type]
    task = ClassificationTask(net, 10, optimizer=cfg.optimizer)
    out = {"entropy_init": neuron_entropy(net.layers[0].weight)}

    start = time.perf_counter()
    trainer = _trainer(epochs, [NeuronEntropyMonitor(layers=["layers.0"])], root, accelerator)
    trainer.fit(task, datamodule=dm)
    out["dense_acc"] = trainer.test(task, datamodule=dm, verbose=False)[0]["test/acc"]
    out["entropy_trained"] = neuron_entropy(net.layers[0].weight.cpu())
    out["entropy_trained_discrete"] = neuron_entropy(net.layers[0].weight.cpu(), differential=False)
    baselines(copy.deepcopy(net).cpu())

    pruning = MagnitudePruning("finetune_once", rate=rate, prune_epoch=0)
    trainer = _trainer(finetune_epochs, [pruning], root, accelerator)
    trainer.fit(task, datamodule=dm)
    out["pruned_acc"] = trainer.test(task, datamodule=dm, verbose=False)[0]["test/acc"]
    w = net.layers[0].weight.detach().cpu()
    out["sparsity_layer0"] = float((w == 0).double().mean())
    out["entropy_pruned_discrete"] = neuron_entropy(w, differential=False)
    out["seconds"] = time.perf_counter() - start
    return out


def _report(name: str, r: dict[str, float]) -> None:
    print(
        f"[{name}] {RECIPES[name].note}: first-layer H̃ {r['entropy_init']:.4f} at init -> "
        f"{r['entropy_trained']:.4f} trained; test acc {r['dense_acc']:.4f} dense, "
        f"{r['pruned_acc']:.4f} pruned + fine-tuned; discrete H_Δ {r['entropy_trained_discrete']:.4f}"
        f" -> {r['entropy_pruned_discrete']:.4f} after pruning (sparsity "
        f"{r['sparsity_layer0']:.3f}); {r['seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--finetune-epochs", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument(
        "--contrast", action="store_true", help="also run the 'adam' recipe (entropy rises)"
    )
    args = parser.parse_args(argv)
    require_data("MNIST", "benchmarks/callbacks.py")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    names = ["sgd", "adam"] if args.contrast else ["sgd"]
    results = {}
    for name in names:
        results[name] = run(
            args.epochs, args.finetune_epochs, args.rate, args.seed, args.accelerator, recipe=name
        )
    for name, r in results.items():
        _report(name, r)
    r = results["sgd"]
    print(
        f"entropy_init={r['entropy_init']:.4f} entropy_trained={r['entropy_trained']:.4f} "
        f"dense_acc={r['dense_acc']:.4f} pruned{round(100 * args.rate)}_acc={r['pruned_acc']:.4f}"
    )


if __name__ == "__main__":
    main()
