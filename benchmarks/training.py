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
  On a GPU also ``lmc fit`` with the captured step (``configs/speed/capture.yaml``:
  ``train_throughput_mlp_captured``, ``..._captured_vs_device_loop``) and under Lightning's
  automatic loop instead of the lean step (``lean_step_speedup_mlp``: automatic / lean).
* ``resnet20``: ResNet-20 x1 (BatchNorm) with ``configs/cifar10/resnet20x16.yaml``'s recipe
  (SGD, batch 500 -> ``--cifar-batch``) on a fake CIFAR-10 of ``--cifar-n`` images.

* ``students`` / ``mlp_population``: ``--members`` (16) models as one ``--population`` run
  against as many sequential ``lmc fit`` runs (``benchmarks/population.py``): the 003 student
  (width 32, ``--student-epochs``) and the MNIST MLP (``--mlp-population-epochs``;
  ``--sequential-sample K`` times K of the sequential runs and scales, and
  ``--population-baseline-epochs B`` times both again at B epochs for
  ``many_models_epoch_speedup_mlp``, the extra epochs' training alone).

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


def lmc_epochs(
    args: list[str], epochs: int, root: Path, automatic: bool = False
) -> tuple[list[float], int]:
    """Epoch times of ``lmc fit <args>`` (no validation) and the training set size;
    ``automatic``: the task's step run by Lightning's automatic loop instead of the lean step."""
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
    if automatic:
        as_automatic(cli.model)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    n = len(cli.datamodule.train_dataloader().dataset)
    return timer.times, n


def as_automatic(task: L.LightningModule) -> None:
    """Run ``task``'s step under Lightning's automatic loop: a subclass with its own
    ``training_step`` (calling the task's) is one ``TrainTask`` leaves to Lightning."""
    base = type(task)
    step = lambda self, batch, i: base.training_step(self, batch, i)  # noqa: E731
    task.__class__ = type(f"Automatic{base.__name__}", (base,), {"training_step": step})
    assert task.automatic_optimization


def lmc_dataloader_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """:func:`lmc_epochs` with the data module's DataLoader (``on_device=false``)."""
    return lmc_epochs([*args, OFF_DEVICE], epochs, root)


def lmc_automatic_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """:func:`lmc_epochs` under Lightning's automatic optimization loop (before the lean step)."""
    return lmc_epochs(args, epochs, root, automatic=True)


def lmc_captured_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """:func:`lmc_epochs` with the captured training step (``configs/speed/capture.yaml``)."""
    return lmc_epochs([*args, "--model.init_args.capture_step=true"], epochs, root)


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


def plain_device_epochs(args: list[str], epochs: int, root: Path) -> tuple[list[float], int]:
    """Epoch times of the plain loop on device-resident data: the training split normalised
    once into one tensor on the training device, shuffled by ``torch.randperm`` there, batches
    gathered by indexing (no DataLoader, no host copies). Splits without augmentation only."""
    cli = _cli([*args, f"--trainer.default_root_dir={root}"])
    task, dm = cli.model, cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    device = cli.trainer.strategy.root_device
    ds = dm.train_dataset
    n = len(ds)
    x_all, y_all = ds.to(device).batch(torch.arange(n, device=device))
    net = task.net.to(device)
    optimizer = task.optimizer(net.parameters())
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    gen = torch.Generator(device=device).manual_seed(0)
    times = []
    for _ in range(epochs):
        _sync(device)
        t0 = time.perf_counter()
        for idx in torch.randperm(n, device=device, generator=gen).split(dm.batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(x_all[idx]), y_all[idx])
            loss.backward()
            optimizer.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, n


RUNNERS = {
    "lmc": lmc_epochs,
    "lmc_dataloader": lmc_dataloader_epochs,
    "lmc_captured": lmc_captured_epochs,
    "lmc_automatic": lmc_automatic_epochs,
    "plain": plain_epochs,
    "plain_device": plain_device_epochs,
}


def compare(
    name: str, args: list[str], epochs: int, repeats: int, runners: tuple[str, ...]
) -> dict[str, float]:
    """Median epoch time of each of ``runners`` (names in :data:`RUNNERS`), run in rotating
    order so that machine load hits them alike; the first epoch of each run is dropped."""
    times: dict[str, list[float]] = {r: [] for r in runners}
    k = len(runners)
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            for runner in runners[r % k :] + runners[: r % k]:
                t, n = RUNNERS[runner](args, epochs, Path(tmp))
                times[runner].extend(t[1:])  # drop warm-up
    med = {r: statistics.median(times[r]) for r in runners}
    print(
        f"{name}: {n} samples; median epoch over {len(times[runners[0]])} epochs: "
        + ", ".join(f"{r} {s:.4f} s" for r, s in med.items()),
        flush=True,
    )
    out = {f"{r}_epoch_s_{name}": s for r, s in med.items()}
    out[f"samples_{name}"] = n
    if "plain" in med:
        out[f"train_throughput_{name}"] = med["plain"] / med["lmc"]
        if "lmc_dataloader" in med:
            out[f"train_throughput_{name}_dataloader"] = med["plain"] / med["lmc_dataloader"]
    if "plain_device" in med:
        out[f"train_throughput_{name}_vs_device_loop"] = med["plain_device"] / med["lmc"]
        if "lmc_captured" in med:
            out[f"train_throughput_{name}_captured_vs_device_loop"] = (
                med["plain_device"] / med["lmc_captured"]
            )
    if "lmc_automatic" in med:
        out[f"lean_step_speedup_{name}"] = med["lmc_automatic"] / med["lmc"]
    if "plain" in med and "lmc_captured" in med:
        out[f"train_throughput_{name}_captured"] = med["plain"] / med["lmc_captured"]
    return out


def step_overhead(args: list[str], epochs: int, repeats: int) -> dict[str, float]:
    """The CPU proxy of the GPU step overhead: a width-32 MLP, whose compute is negligible, so
    that its step time is what a step costs beyond the arithmetic; lmc fit against the plain
    device-resident loop, per step in microseconds."""
    tiny = [*args, "--model.init_args.net.init_args.width=32"]
    times = compare("tiny", tiny, epochs, repeats, ("lmc", "plain_device"))
    steps = -(-times["samples_tiny"] // 512)  # configs/mnist/mlp.yaml's batch size
    return {
        **times,
        "step_overhead_tiny_us_lmc": 1e6 * times["lmc_epoch_s_tiny"] / steps,
        "step_overhead_tiny_us_plain": 1e6 * times["plain_device_epoch_s_tiny"] / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (first dropped)")
    parser.add_argument("--repeats", type=int, default=3, help="rotating run triples")
    parser.add_argument("--fake-mnist", action="store_true", help="a fake MNIST (timing only)")
    parser.add_argument("--cifar-n", type=int, default=5000, help="fake CIFAR-10 images")
    parser.add_argument("--cifar-batch", type=int, default=500)
    parser.add_argument(
        "--only", choices=["tiny", "mlp", "resnet20", "students", "mlp_population"], default=None
    )
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--members", type=int, default=16, help="population size")
    parser.add_argument("--student-epochs", type=int, default=50)
    parser.add_argument("--mlp-population-epochs", type=int, default=2)
    parser.add_argument(
        "--sequential-sample",
        type=int,
        default=None,
        help="time this many of the sequential runs and scale (default all)",
    )
    parser.add_argument(
        "--population-baseline-epochs",
        type=int,
        default=0,
        help="also time both at this many epochs: the per-epoch speedup without start-up",
    )
    ns = parser.parse_args()
    torch.manual_seed(0)
    csv = str(ROOT / "configs" / "loggers" / "csv.yaml")
    line: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as fake:
        if ns.fake_mnist:  # one fake MNIST for both MNIST parts
            write_fake_mnist(fake, n_train=60000, n_test=10000)
        mnist = ["-c", str(ROOT / "configs" / "mnist" / "mlp.yaml"), "-c", csv]
        mnist.append(f"--trainer.accelerator={ns.accelerator}")
        if ns.fake_mnist:
            mnist.append(f"--data.init_args.data_dir={fake}")
        elif ns.only in (None, "tiny", "mlp") and not os.environ.get("LMC_DATA_DIR"):
            raise SystemExit(
                "set LMC_DATA_DIR to a writable copy of ../shared/datasets (MNIST/raw), or "
                "give --fake-mnist for a timing on fake images of the same size"
            )
        if ns.only in (None, "tiny"):
            line.update(step_overhead(mnist, ns.epochs, ns.repeats))
        if ns.only in (None, "mlp"):
            runners = ("lmc", "lmc_dataloader", "plain", "plain_device")
            if ns.accelerator == "gpu":  # the captured step (CUDA graphs); the automatic loop
                runners += ("lmc_captured", "lmc_automatic")
            line.update(compare("mlp", mnist, ns.epochs, ns.repeats, runners))
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
            # augmented batches: no device-resident plain loop (it would skip the augmentation)
            runners = ("lmc", "lmc_dataloader", "plain")
            line.update(compare("resnet20", resnet, ns.epochs, ns.repeats, runners))
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
                pop = population_run(
                    Path(tmp),
                    ns.members,
                    ns.mlp_population_epochs,
                    mlp,
                    "mlp",
                    ns.sequential_sample,
                    ns.population_baseline_epochs,
                )
            line.update(pop)
        for key in [k for k in line if k.startswith("many_models")]:
            print(f"{key}: {line[key]:.2f}x", flush=True)
    device = torch.cuda.get_device_name() if ns.accelerator == "gpu" else "cpu"
    print(f"device: {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(" ".join(f"{k}={v:.4g}" for k, v in line.items() if not k.startswith("samples_")))


if __name__ == "__main__":
    main()
