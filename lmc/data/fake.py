"""Tiny, seeded fake datasets written in torchvision's exact on-disk formats.

The files are what ``torchvision.datasets.MNIST`` / ``FashionMNIST`` / ``CIFAR10`` / ``CIFAR100``
read (names and folders from those classes); only their md5 sums differ from the originals.

Used by the tests to run every shipped config for a step without the real data. Labels cover
every class when there are enough images (classes repeat round-robin, then get shuffled), and
each class has its own random pixel template plus noise, so a model can learn them and a smoke
test sees the loss fall. Command line::

    python -m lmc.data ROOT [--datasets mnist fashion cifar10 cifar100] [--archive]
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torchvision import datasets

from lmc.data.formats import MNIST_FILES, CifarSpec

CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]


def fake_images(
    n_train: int, n_test: int, num_classes: int, shape: tuple[int, ...], seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Class-template images plus noise: ``(train_x, train_y, test_x, test_y)``, uint8 / int64."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(num_classes, *shape)).astype(np.float64)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(n) % num_classes)
        noise = rng.normal(0.0, 20.0, size=(n, *shape))
        images = 0.75 * templates[labels] + 32.0 + noise
        return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels.astype(np.int64)

    return (*draw(n_train), *draw(n_test))


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}i", *array.shape
    )
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_fake_mnist(
    root: str | Path,
    name: Literal["MNIST", "FashionMNIST"] = "MNIST",
    n_train: int = 64,
    n_test: int = 32,
    compress: bool = True,
    seed: int = 0,
) -> Path:
    """Write a fake MNIST / Fashion-MNIST as idx files in ``<root>/<name>/raw/``.

    Args:
        root: data directory (what ``data_dir`` / ``LMC_DATA_DIR`` points at).
        name: ``"MNIST"`` or ``"FashionMNIST"`` (the torchvision folder name).
        n_train: training images (28x28, 10 classes).
        n_test: test images.
        compress: write the original ``*-ubyte.gz`` form; else the decompressed ``*-ubyte``.
        seed: seed of the pixels and labels.

    Returns:
        The ``raw`` folder.
    """
    raw = Path(root) / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    tx, ty, sx, sy = fake_images(n_train, n_test, 10, (28, 28), seed)
    arrays = {"train": (tx, ty.astype(np.uint8)), "test": (sx, sy.astype(np.uint8))}
    for split, (img_name, lbl_name) in MNIST_FILES.items():
        for fname, array in zip((img_name, lbl_name), arrays[split]):
            data = _idx_bytes(array)
            target, stale = (
                (raw / f"{fname}.gz", raw / fname)
                if compress
                else (raw / fname, raw / f"{fname}.gz")
            )
            target.write_bytes(gzip.compress(data, mtime=0) if compress else data)
            stale.unlink(missing_ok=True)
    return raw


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _write_cifar(
    root: str | Path,
    spec: CifarSpec,
    names: list[str],
    n_train: int,
    n_test: int,
    archive: bool,
    seed: int,
) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    num_classes = len(names)
    tx, ty, sx, sy = fake_images(n_train, n_test, num_classes, (3, 32, 32), seed)
    label_key = "fine_labels" if issubclass(spec, datasets.CIFAR100) else "labels"
    with tempfile.TemporaryDirectory(dir=root, prefix=".fake-") as tmp:
        folder = Path(tmp) / spec.base_folder
        folder.mkdir()
        splits = [(spec.train_list, tx, ty), (spec.test_list, sx, sy)]
        for files, images, labels in splits:
            chunks = np.array_split(np.arange(len(images)), len(files))
            for (fname, _), idx in zip(files, chunks):
                batch = {
                    "batch_label": f"fake {fname}",
                    "data": images[idx].reshape(len(idx), -1),
                    label_key: labels[idx].tolist(),
                    "filenames": [f"fake_{i:05d}.png" for i in idx],
                }
                if label_key == "fine_labels":
                    batch["coarse_labels"] = (labels[idx] // 5).tolist()
                _pickle(folder / fname, batch)
        meta: dict[str, Any]
        if label_key == "fine_labels":
            meta = {
                "fine_label_names": names,
                "coarse_label_names": [f"super_{i}" for i in range(20)],
            }
        else:
            meta = {
                "label_names": names,
                "num_cases_per_batch": max(1, n_train // 5),
                "num_vis": 3072,
            }
        _pickle(folder / spec.meta["filename"], meta)
        if archive:
            target = root / spec.filename
            with tarfile.open(target, "w:gz") as tar:
                tar.add(folder, arcname=spec.base_folder)
        else:
            target = root / spec.base_folder
            if target.exists():
                shutil.rmtree(target)
            folder.rename(target)
    return target


def write_fake_cifar10(
    root: str | Path, n_train: int = 64, n_test: int = 32, archive: bool = False, seed: int = 0
) -> Path:
    """Write a fake CIFAR-10 in the python-pickle layout (``data_batch_1..5``, ``test_batch``,
    ``batches.meta``): the folder ``<root>/cifar-10-batches-py/``, or with ``archive=True`` only
    ``<root>/cifar-10-python.tar.gz`` holding that folder. Returns the folder or archive path."""
    return _write_cifar(root, datasets.CIFAR10, CIFAR10_CLASSES, n_train, n_test, archive, seed)


def write_fake_cifar100(
    root: str | Path, n_train: int = 128, n_test: int = 32, archive: bool = False, seed: int = 0
) -> Path:
    """Write a fake CIFAR-100 (``train``, ``test``, ``meta``; fine and coarse labels): the folder
    ``<root>/cifar-100-python/``, or with ``archive=True`` only ``<root>/cifar-100-python.tar.gz``.
    Returns the folder or archive path."""
    names = [f"class_{i:03d}" for i in range(100)]
    return _write_cifar(root, datasets.CIFAR100, names, n_train, n_test, archive, seed)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: write the chosen fake datasets under ROOT."""
    parser = argparse.ArgumentParser(
        prog="python -m lmc.data", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("root", type=Path)
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["mnist", "fashion", "cifar10", "cifar100"],
        choices=["mnist", "fashion", "cifar10", "cifar100"],
    )
    parser.add_argument("--n-train", type=int, default=None, help="default: 64 (CIFAR-100: 128)")
    parser.add_argument("--n-test", type=int, default=32)
    parser.add_argument("--archive", action="store_true", help="write CIFAR as .tar.gz archives")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n = {} if args.n_train is None else {"n_train": args.n_train}
    for ds in args.datasets:
        if ds in ("mnist", "fashion"):
            name: Literal["MNIST", "FashionMNIST"] = "MNIST" if ds == "mnist" else "FashionMNIST"
            out = write_fake_mnist(args.root, name, n_test=args.n_test, seed=args.seed, **n)
        else:
            writer = write_fake_cifar10 if ds == "cifar10" else write_fake_cifar100
            out = writer(args.root, n_test=args.n_test, archive=args.archive, seed=args.seed, **n)
        print(out)
