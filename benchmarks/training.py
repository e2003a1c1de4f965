"""Training throughput of ``lmc fit`` against a plain PyTorch loop (issue #16, item 1).

Both train the same network, from the same initial weights, with the same optimizer, batch
size and training batches: the plain loop iterates the data module's own ``DataLoader``
(``on_device=false``) and does ``zero_grad / forward / loss / backward / step`` and nothing
else; ``lmc fit`` runs the config as a user would (Lightning loop, per-epoch metrics, the
loss logged per step, checkpoints, the CSV logger, device-resident data where it fits: issue
#16 item 2), and once more on the ``DataLoader`` (``train_throughput_<name>_dataloader``),
without validation so that all do the same work. Epoch times are taken inside the runs (train
epoch start to end, a callback for ``lmc fit``), the first epoch of each dropped as warm-up,
and the three rotate so that machine load hits them alike.

* ``mlp``: ``configs/mnist/mlp.yaml`` (784-512x3-10, Adam, batch 512) on MNIST from
  ``$LMC_DATA_DIR``; ``--fake-mnist`` uses a fake MNIST of the same size instead (timing only).
* ``resnet20``: ResNet-20 x1 (BatchNorm) with ``configs/cifar10/resnet20x16.yaml``'s recipe
  (SGD, batch 500 -> ``--cifar-batch``) on a fake CIFAR-10 of ``--cifar-n`` images.

* ``students`` / ``mlp_population``: ``--members`` (16) models as one ``--population`` run
  against as many sequential ``lmc fit`` runs (``benchmarks/population.py``): the 003 student
  (width 32, ``--student-epochs``) and the MNIST MLP (``--mlp-population-epochs``).

Run ``LMC_DATA_DIR=<copy of the datasets> python benchmarks/training.py`` (``--accelerator gpu``
on a GPU). The last line holds ``train_throughput_mlp=<lmc samples/s / plain samples/s>
train_throughput_resnet20=<..> many_models_speedup_students=<sequential s / population s>
many_models_speedup_mlp=<..>`` and the epoch and wall times behind them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.population import run as population_run  # noqa: E402
from benchmarks.population import student_args  # noqa: E402
from lmc.cli import build_cli  # noqa: E402
from lmc.data.fake import write_fake_cifar10, write_fake_mnist  # noqa: E402

OFF_DEVICE = "--data.init_args.on_device=false"


class EpochTimer(L.Callback):
    """Wall time of every training epoch (train loop only)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t0 = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _sync(pl_module.device)
        self.times.append(time.perf_counter() - self._t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cli(args: list[str]):
    """The CLI's objects for ``lmc fit <args>``, built but not run."""
    sys.argv = sys.argv[:1]
    return build_cli(args, run=False)


def lmc_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """Epoch times of ``lmc fit <args>`` (no validation) and the training set size."""
    timer = EpochTimer()
    cli = _cli(
        [
            *args,
            f"--trainer.max_epochs={epochs}",
            "--trainer.limit_val_batches=0",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
        ]
    )
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    n = len(cli.datamodule.train_dataloader().dataset)
    return timer.times, n


def lmc_dataloader_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """:func:`lmc_epochs` with the data module's DataLoader (``on_device=false``)."""
    return lmc_epochs([*args, OFF_DEVICE], epochs, root)


def plain_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """Epoch times of the plain loop over the same data module's ``DataLoader`` (the baseline
    of item 2 too: ``on_device=false``), net and optimizer."""
    cli = _cli([*args, OFF_DEVICE, f"--trainer.default_root_dir={root}"])
    task, dm = cli.model, cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    device = cli.trainer.strategy.root_device
    net = task.net.to(device)
    optimizer = task.optimizer(net.parameters())
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    times = []
    for epoch in range(epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, len(loader.dataset)


def compare(name: str, args: list[str], epochs: int, repeats: int) -> dict[str, float]:
    """``lmc fit`` as configured (device-resident data where it fits), ``lmc fit`` on the
    DataLoader, and the plain DataLoader loop, in rotating order."""
    runners = (lmc_epochs, lmc_dataloader_epochs, plain_epochs)
    times: dict[object, list[float]] = {fn: [] for fn in runners}
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            for fn in runners[r % 3 :] + runners[: r % 3]:
                t, n = fn(args, epochs, Path(tmp))
                times[fn].extend(t[1:])  # drop warm-up
    lmc_s, loader_s, plain_s = (statistics.median(times[fn]) for fn in runners)
    print(
        f"{name}: {n} samples; epoch {lmc_s:.3f} s lmc fit, {loader_s:.3f} s lmc fit on the "
        f"DataLoader, {plain_s:.3f} s plain DataLoader loop (medians of "
        f"{len(times[plain_epochs])} epochs); throughput ratios {plain_s / lmc_s:.3f}, "
        f"{plain_s / loader_s:.3f}",
        flush=True,
    )
    return {
        f"train_throughput_{name}": plain_s / lmc_s,
        f"train_throughput_{name}_dataloader": plain_s / loader_s,
        f"lmc_epoch_s_{name}": lmc_s,
        f"plain_epoch_s_{name}": plain_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (first dropped)")
    parser.add_argument("--repeats", type=int, default=3, help="rotating run triples")
    parser.add_argument("--fake-mnist", action="store_true", help="a fake MNIST (timing only)")
    parser.add_argument("--cifar-n", type=int, default=5000, help="fake CIFAR-10 images")
    parser.add_argument("--cifar-batch", type=int, default=500)
    parser.add_argument(
        "--only", choices=["mlp", "resnet20", "students", "mlp_population"], default=None
    )
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--members", type=int, default=16, help="population size")
    parser.add_argument("--student-epochs", type=int, default=50)
    parser.add_argument("--mlp-population-epochs", type=int, default=2)
    ns = parser.parse_args()
    torch.manual_seed(0)
    csv = str(ROOT / "configs" / "loggers" / "csv.yaml")
    line: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as fake:
        if ns.fake_mnist:  # one fake MNIST for both MNIST parts
            write_fake_mnist(fake, n_train=60000, n_test=10000)
        if ns.only in (None, "mlp"):
            mnist = ["-c", str(ROOT / "configs" / "mnist" / "mlp.yaml"), "-c", csv]
            mnist.append(f"--trainer.accelerator={ns.accelerator}")
            if ns.fake_mnist:
                mnist.append(f"--data.init_args.data_dir={fake}")
            elif not os.environ.get("LMC_DATA_DIR"):
                raise SystemExit(
                    "set LMC_DATA_DIR to a writable copy of ../shared/datasets (MNIST/raw), or "
                    "give --fake-mnist for a timing on fake images of the same size"
                )
            line.update(compare("mlp", mnist, ns.epochs, ns.repeats))
        if ns.only in (None, "resnet20"):
            write_fake_cifar10(fake, n_train=ns.cifar_n, n_test=100)
            resnet = [
                "-c",
                str(ROOT / "configs" / "cifar10" / "resnet20x16.yaml"),
                "-c",
                csv,
                "--model.init_args.net.init_args.width=1.0",
                "--trainer.callbacks=[]",
                f"--data.init_args.data_dir={fake}",
                "--data.init_args.val_size=100",
                "--data.init_args.alignment_size=100",
                f"--data.init_args.batch_size={ns.cifar_batch}",
                f"--trainer.accelerator={ns.accelerator}",
            ]
            line.update(compare("resnet20", resnet, ns.epochs, ns.repeats))
        # many models as one population vs N sequential `lmc fit` runs (benchmarks/population.py)
        if ns.only in (None, "students"):
            with tempfile.TemporaryDirectory() as tmp:
                base = [*student_args(), f"--trainer.accelerator={ns.accelerator}"]
                line.update(population_run(Path(tmp), ns.members, ns.student_epochs, base))
        if ns.only in (None, "mlp_population"):
            mlp = [
                "-c",
                str(ROOT / "configs" / "mnist" / "mlp.yaml"),
                f"--trainer.accelerator={ns.accelerator}",
                "--test_after_fit=false",
            ]
            if ns.fake_mnist:
                mlp.append(f"--data.init_args.data_dir={fake}")
            with tempfile.TemporaryDirectory() as tmp:
                pop = population_run(Path(tmp), ns.members, ns.mlp_population_epochs, mlp, "mlp")
            line.update(pop)
        for key in [k for k in line if k.startswith("many_models")]:
            print(f"{key}: {line[key]:.2f}x", flush=True)
    print(" ".join(f"{k}={v:.4g}" for k, v in line.items()))


if __name__ == "__main__":
    main()
