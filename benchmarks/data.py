"""One training epoch's data path: the torchvision-based data modules vs the old reader (issue 12).

The data modules read their files through ``torchvision.datasets`` and augment with
``torchvision.transforms.v2`` ops, parameters drawn per sample (:class:`lmc.data.BatchAugment`).
The old reader's batch path is kept here as the baseline, verbatim from before the change: index
the uint8 tensor, convert to float, batched crop / flip / rotation by ``gather`` and
``grid_sample``, normalise. Both iterate the same images in the same ``DataLoader`` (same
sampler, batch size and collate), in paired, interleaved repeats so machine load hits both alike:

* ``mnist``: the train split of MNIST (55000 images, batch 512 as ``configs/mnist/mlp.yaml``) from
  ``$LMC_DATA_DIR``; without it the script stops and names the files expected, unless
  ``--fake-mnist`` asks for a fake MNIST of the same size (a timing only; its figures are then
  labelled ``mnist_fake``).
* ``cifar``: a fake CIFAR-10 (``--cifar-n`` training images, default 50000; batch 128 as
  ``configs/cifar10/tinyten.yaml``), random crop with 4-pixel padding and flip (004 App. B).
* ``cifar_rot``: the same plus rotation in [-15, 15] degrees (``configs/curves/cifar10_*``, 002 §4).
* ``*_v2_compose`` (for information): the textbook per-image ``v2.Compose([RandomRotation,
  RandomCrop(32, padding=4), RandomHorizontalFlip()])``, one call per image.

Run ``LMC_DATA_DIR=<writable copy of the datasets> python benchmarks/data.py``. The last line is
``mnist_epoch_s=.. mnist_ratio_vs_old=.. cifar_epoch_s=.. cifar_ratio_vs_old=..`` and the same
pair for ``cifar_v2_compose``, ``cifar_rot``, ``cifar_rot_v2_compose`` (best epoch time of the
new path, median of the paired new/old ratios).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from benchmarks._endpoints import require_data  # noqa: E402
from lmc.data import (  # noqa: E402
    CIFAR10DataModule,
    InMemoryImageDataset,
    MNISTDataModule,
    write_fake_cifar10,
    write_fake_mnist,
)
from lmc.data.memory import collate  # noqa: E402


class OldBatchAugment:
    """The batched augmentation of the old ``lmc/data/memory.py``, on float batches."""

    def __init__(self, crop_padding: int = 0, flip: bool = False, rotate: float = 0.0) -> None:
        self.crop_padding, self.flip, self.rotate = crop_padding, flip, rotate

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rotate > 0:
            angle = (torch.rand(x.shape[0]) * 2 - 1) * math.radians(self.rotate)
            cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
            theta = torch.stack([cos, -sin, zero, sin, cos, zero], dim=1).view(-1, 2, 3)
            grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        if self.crop_padding > 0:
            b, c, h, w = x.shape
            p = self.crop_padding
            padded = F.pad(x, (p, p, p, p))
            dy = torch.randint(0, 2 * p + 1, (b,))
            dx = torch.randint(0, 2 * p + 1, (b,))
            rows = (dy[:, None] + torch.arange(h)).view(b, 1, h, 1).expand(b, c, h, w + 2 * p)
            cols = (dx[:, None] + torch.arange(w)).view(b, 1, 1, w).expand(b, c, h, w)
            x = padded.gather(2, rows).gather(3, cols)
        if self.flip:
            mask = torch.rand(x.shape[0]) < 0.5
            x = torch.where(mask[:, None, None, None], x.flip(-1), x)
        return x


class OldDataset(InMemoryImageDataset):
    """The same images and split with the old batch path: float first, then old augmentation."""

    def __init__(self, new: InMemoryImageDataset, augment: OldBatchAugment | None) -> None:
        mean, std = new.mean.flatten().tolist(), new.std.flatten().tolist()
        super().__init__(new.images, new.labels, mean, std, None, new.indices)
        self.old_augment = augment

    def batch(self, idx: object) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.indices[torch.as_tensor(idx, dtype=torch.long)]
        x = self.images[rows].float()
        if self.old_augment is not None:
            x = self.old_augment(x)
        return torch.addcmul(self._shift, x, self._scale), self.labels[rows]


class ComposeDataset(InMemoryImageDataset):
    """The textbook v2 usage: one ``v2.Compose`` call per image (for information)."""

    def __init__(self, new: InMemoryImageDataset, rotate: float) -> None:
        mean, std = new.mean.flatten().tolist(), new.std.flatten().tolist()
        super().__init__(new.images, new.labels, mean, std, None, new.indices)
        steps = [v2.RandomRotation(rotate, v2.InterpolationMode.NEAREST)] if rotate else []
        self.compose = v2.Compose([*steps, v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])

    def batch(self, idx: object) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.indices[torch.as_tensor(idx, dtype=torch.long)]
        x = torch.stack([self.compose(img) for img in self.images[rows]])
        return torch.addcmul(self._shift, x.float(), self._scale), self.labels[rows]


def epoch_seconds(dataset: InMemoryImageDataset, batch_size: int, epochs: int = 1) -> float:
    """Seconds per shuffled pass over ``dataset`` as the data modules' train loader makes it."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate)
    t = time.perf_counter()
    for _ in range(epochs):
        assert sum(len(y) for _, y in loader) == len(dataset)
    return (time.perf_counter() - t) / epochs


def paired(
    label: str, new: Callable[[], float], old: Callable[[], float], repeats: int
) -> tuple[float, float, float]:
    """``repeats`` adjacent runs of both, alternating which goes first (so machine load and
    warm caches hit both alike); return (best new s, best old s, median of new/old ratios)."""
    new(), old()  # warm-up
    news, olds = [], []
    for r in range(repeats):
        first, second = (new, old) if r % 2 == 0 else (old, new)
        a, b = first(), second()
        news.append(a if r % 2 == 0 else b)
        olds.append(b if r % 2 == 0 else a)
    ratio = statistics.median(n / o for n, o in zip(news, olds))
    print(
        f"[{label}] new {min(news):.3f} s, old {min(olds):.3f} s per epoch (best of {repeats}); "
        f"paired ratios {', '.join(f'{n / o:.2f}' for n, o in zip(news, olds))}"
    )
    return min(news), min(olds), ratio


def main(argv: list[str] | None = None) -> None:
    """Time both data paths and print the key=value summary line last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cifar-n", type=int, default=50000)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads; 1 as in a DataLoader worker"
    )
    parser.add_argument(
        "--fake-mnist",
        action="store_true",
        help="time a fake MNIST of the same size instead of $LMC_DATA_DIR/MNIST (labelled fake)",
    )
    args = parser.parse_args(argv)
    mnist_root = None
    if not args.fake_mnist:
        mnist_root = require_data("MNIST", "benchmarks/data.py").parents[1]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    tmp = tempfile.TemporaryDirectory(prefix="lmc-bench-data-")
    label = "mnist_fake" if mnist_root is None else "mnist"
    if mnist_root is None:
        print(f"[{label}] a fake MNIST of 60000 images (--fake-mnist): timings only")
        mnist_root = Path(tmp.name)
        write_fake_mnist(mnist_root, "MNIST", n_train=60000, n_test=100)
    t = time.perf_counter()
    mnist = MNISTDataModule(str(mnist_root), batch_size=512)
    mnist.prepare_data()
    mnist.setup("fit")
    print(f"[{label}] prepare + setup (torchvision read, split): {time.perf_counter() - t:.2f} s")
    train = mnist.train_dataset
    m_new, _, m_ratio = paired(
        label,
        lambda: epoch_seconds(train, 512, epochs=5),
        lambda: epoch_seconds(OldDataset(train, None), 512, epochs=5),
        args.repeats,
    )

    write_fake_cifar10(tmp.name, n_train=args.cifar_n + 5000, n_test=100, archive=True)
    results = {}
    for name, rotate in (("cifar", 0.0), ("cifar_rot", 15.0)):
        dm = CIFAR10DataModule(tmp.name, batch_size=128, rotate=rotate)
        dm.setup("fit")
        new_ds = dm.train_dataset
        old_ds = OldDataset(new_ds, OldBatchAugment(crop_padding=4, flip=True, rotate=rotate))
        results[name] = paired(
            name,
            lambda ds=new_ds: epoch_seconds(ds, 128),
            lambda ds=old_ds: epoch_seconds(ds, 128),
            args.repeats,
        )
        compose = ComposeDataset(new_ds, rotate)
        results[f"{name}_v2_compose"] = paired(
            f"{name}_v2_compose (per-image v2.Compose, for information)",
            lambda ds=compose: epoch_seconds(ds, 128),
            lambda ds=old_ds: epoch_seconds(ds, 128),
            max(1, args.repeats // 2),
        )
    tmp.cleanup()
    print(
        f"{label}_epoch_s={m_new:.3f} {label}_ratio_vs_old={m_ratio:.3f} "
        + " ".join(
            f"{k}_epoch_s={v[0]:.3f} {k}_ratio_vs_old={v[2]:.3f}" for k, v in results.items()
        )
    )


if __name__ == "__main__":
    main()
