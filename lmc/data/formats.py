"""Offline access to torchvision's on-disk dataset layouts (MNIST idx files, CIFAR pickles).

``torchvision.datasets`` (``MNIST``, ``FashionMNIST``, ``CIFAR10``, ``CIFAR100``, always with
``download=False``) reads the files; this module gets them ready and explains failures. Nothing
here touches the network.

- A missing dataset raises :class:`DatasetNotFoundError`, naming the path searched, the layout
  expected there and how to fix it, before torchvision's terse "Dataset not found".
- ``prepare_*`` unpack the ``.gz`` / ``.tar.gz`` originals next to themselves with torchvision's
  ``extract_archive`` (into a temporary folder renamed into place, so an interrupted run never
  leaves a truncated file) and, when asked, compare md5 sums against torchvision's own lists.
- ``load_*`` return uint8 image tensors and int64 labels. When the originals are still packed
  and their folder is read-only, they are unpacked into a temporary folder for that one read.
- A damaged file raises :class:`DatasetCorruptError`, naming the file, what is wrong and the fix.

torchvision reads CIFAR batches with ``pickle.load``, which can run code stored in the file: only
point ``data_dir`` at files you trust (``verify_checksums=True`` compares them with the originals
first).
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import tarfile
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch
from torch import Tensor
from torchvision import datasets
from torchvision.datasets.mnist import read_image_file, read_label_file
from torchvision.datasets.utils import calculate_md5, check_integrity, extract_archive

MNIST_DATASETS: dict[str, type[datasets.MNIST]] = {
    "MNIST": datasets.MNIST,
    "FashionMNIST": datasets.FashionMNIST,
}
_MNIST_NAMES = [name.removesuffix(".gz") for name, _ in datasets.MNIST.resources]
MNIST_FILES = {"train": tuple(_MNIST_NAMES[:2]), "test": tuple(_MNIST_NAMES[2:])}
"""Decompressed idx file names per split, (images, labels), as torchvision reads them."""

CifarSpec = type[datasets.CIFAR10]
"""A torchvision CIFAR class: its file names, folder, archive and md5 lists describe the layout."""

FIX_HINT = (
    "Fix: put the files there, or point the data module at the folder that holds them with the "
    "environment variable LMC_DATA_DIR or the config key data.init_args.data_dir. "
    "Nothing is ever downloaded."
)
_UNPACK_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, tarfile.TarError)


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where the data module looked; the message says what to do."""


class DatasetCorruptError(ValueError):
    """A dataset file is damaged or not the original; the message names it and the fix."""


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _warn_read_only(folder: Path, archive: str) -> None:
    warnings.warn(
        f"{folder} is not writable, so {archive} cannot be unpacked next to itself; it is "
        "unpacked into a temporary folder on every load instead. Copy the dataset into a "
        "writable data_dir to unpack it once and start faster.",
        stacklevel=3,
    )


def _check_md5(path: Path, expected: str) -> None:
    """Raise :class:`DatasetCorruptError` if ``path``'s md5 (torchvision's) is not ``expected``."""
    if not check_integrity(path, expected):
        raise DatasetCorruptError(
            f"Checksum mismatch for {path}: md5 {calculate_md5(path)}, expected {expected} "
            "(the original distribution file). Fix: copy the original file there again, or set "
            "verify_checksums=False for files that are not the originals (e.g. fake test data)."
        )


def _unpack(archive: Path, dest: Path, md5: str | None) -> list[Path]:
    """Unpack ``archive`` (``.gz`` or ``.tar.gz``) into ``dest`` with torchvision's
    ``extract_archive``: into a temporary folder inside ``dest``, then renamed into place.

    Returns:
        The unpacked top-level paths in ``dest``.

    Raises:
        DatasetCorruptError: the archive is truncated or damaged; names it, its md5 and the fix.
    """
    with tempfile.TemporaryDirectory(dir=dest, prefix=".extract-") as tmp:
        try:
            extract_archive(archive, tmp)
        except _UNPACK_ERRORS as err:
            expected = f"; the original's md5 is {md5}" if md5 else ""
            raise DatasetCorruptError(
                f"{archive} is truncated or corrupt and cannot be unpacked ({err}). Its md5 is "
                f"{calculate_md5(archive)}{expected}. Fix: copy the original file there again."
            ) from err
        out = []
        for item in sorted(Path(tmp).iterdir()):
            target = dest / item.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
            out.append(target)
    return out


# ----------------------------------------------------------------------------- MNIST (idx)


def _mnist_md5(name: str) -> dict[str, str]:
    return dict(MNIST_DATASETS[name].resources) if name in MNIST_DATASETS else {}


def mnist_raw_dir(root: str | Path, name: str) -> Path:
    """Return ``<root>/<name>/raw`` after checking that all four idx files are there.

    Each file may be the original ``.gz`` or its decompressed sibling.

    Raises:
        DatasetNotFoundError: some file is missing; the message lists the expected layout.
    """
    raw = Path(root).expanduser().absolute() / name / "raw"
    missing = [
        n for n in _MNIST_NAMES if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()
    ]
    if missing:
        expected = "\n".join(f"  {raw / n}.gz" for n in _MNIST_NAMES)
        raise DatasetNotFoundError(
            f"{name} not found: missing {', '.join(missing)} in {raw}.\n"
            f"Expected the original distribution files (gzip-compressed, or already "
            f"decompressed without the .gz suffix):\n{expected}\n"
            f"{FIX_HINT} For {name}, point it at a writable folder holding a copy of the "
            f"original .gz files under {name}/raw/."
        )
    return raw


def prepare_mnist(root: str | Path, name: str, verify_checksums: bool = False) -> Path:
    """Decompress each ``<root>/<name>/raw/*-ubyte.gz`` next to itself if not done yet.

    torchvision's ``MNIST(download=False)`` reads only the decompressed files. A read-only folder
    is not an error: a warning says so and loading unpacks into a temporary folder instead.

    Args:
        root: the data directory.
        name: ``"MNIST"`` or ``"FashionMNIST"``.
        verify_checksums: compare each ``.gz`` present with torchvision's md5 of the original.

    Returns:
        The ``raw`` folder.
    """
    raw = mnist_raw_dir(root, name)
    md5 = _mnist_md5(name)
    for fname in _MNIST_NAMES:
        gz = raw / f"{fname}.gz"
        if verify_checksums and gz.is_file() and gz.name in md5:
            _check_md5(gz, md5[gz.name])
        if (raw / fname).is_file() or not gz.is_file():
            continue
        if not _writable(raw):
            _warn_read_only(raw, gz.name)
            continue
        _unpack(gz, raw, md5.get(gz.name))
    return raw


@contextmanager
def _readable_mnist(root: Path, name: str) -> Iterator[Path]:
    """A root where ``<name>/raw`` holds all four decompressed files, for torchvision."""
    raw = mnist_raw_dir(root, name)
    if all((raw / n).is_file() for n in _MNIST_NAMES):
        yield root
    elif _writable(raw):
        yield prepare_mnist(root, name).parents[1]
    else:
        md5 = _mnist_md5(name)
        with tempfile.TemporaryDirectory(prefix=f"lmc-{name}-") as tmp:
            tmp_raw = Path(tmp) / name / "raw"
            tmp_raw.mkdir(parents=True)
            for n in _MNIST_NAMES:
                if (raw / n).is_file():
                    os.symlink(raw / n, tmp_raw / n)
                else:
                    _unpack(raw / f"{n}.gz", tmp_raw, md5.get(f"{n}.gz"))
            yield Path(tmp)


def _idx_corrupt(raw: Path, shown: Path, split: str, err: Exception) -> DatasetCorruptError:
    """Name the idx file of ``split`` that torchvision's own readers reject."""
    images, labels = MNIST_FILES[split]
    bad = images
    for fname, reader in ((images, read_image_file), (labels, read_label_file)):
        try:
            reader(str(raw / fname))
        except (RuntimeError, ValueError, TypeError, AssertionError):
            bad = fname
            break
    return DatasetCorruptError(
        f"{shown / bad} is truncated or corrupt: torchvision cannot read it "
        f"({type(err).__name__}: {err}). Fix: delete it and copy the original {bad}.gz into "
        f"{shown} again; prepare_data decompresses it."
    )


def load_mnist(root: str | Path, name: str, split: str) -> tuple[Tensor, Tensor]:
    """Load an MNIST-format split (``"train"`` or ``"test"``) with torchvision's reader.

    Returns:
        ``images`` of shape (N, 1, 28, 28), uint8, and ``labels`` of shape (N,), int64.
    """
    root = Path(root).expanduser().absolute()
    shown = root / name / "raw"
    with _readable_mnist(root, name) as readable:
        try:
            ds = MNIST_DATASETS[name](readable, train=split == "train", download=False)
        except (RuntimeError, ValueError, TypeError, AssertionError) as err:
            raise _idx_corrupt(readable / name / "raw", shown, split, err) from err
    images, labels = ds.data, ds.targets
    if len(images) != len(labels):
        raise DatasetCorruptError(
            f"{shown}: the {split} split has {len(images)} images but {len(labels)} labels, so "
            f"one of {', '.join(MNIST_FILES[split])} is truncated. Fix: delete both and copy the "
            "original .gz files there again."
        )
    return images.unsqueeze(1), labels.long()


# ----------------------------------------------------------------------------- CIFAR (pickles)


def cifar_files(spec: CifarSpec) -> list[tuple[str, str]]:
    """``(file name, md5)`` of every file in the extracted folder, from torchvision's lists."""
    return [*map(tuple, spec.train_list), *map(tuple, spec.test_list)] + [
        (spec.meta["filename"], spec.meta["md5"])
    ]


@cache
def _reader(spec: CifarSpec) -> CifarSpec:
    """torchvision's ``spec`` with its per-load md5 checks off, so files that are not the
    originals (tiny fake data) load too; ``verify_checksums`` checks against ``spec`` itself."""
    unchecked = {
        "train_list": [[n, None] for n, _ in spec.train_list],
        "test_list": [[n, None] for n, _ in spec.test_list],
        "meta": {**spec.meta, "md5": None},
    }
    return type(spec.__name__, (spec,), unchecked)


def _cifar_not_found(root: Path, spec: CifarSpec, missing: list[str]) -> DatasetNotFoundError:
    files = ", ".join(n for n, _ in cifar_files(spec))
    folder = root / spec.base_folder
    return DatasetNotFoundError(
        f"{spec.__name__} not found in {root}"
        + (f" (missing {', '.join(missing)} in {folder})" if missing else "")
        + f".\nExpected either the archive {root / spec.filename} or the extracted folder "
        f"{folder}/ holding the python-pickle batches: {files}.\n{FIX_HINT}"
    )


def cifar_source(root: str | Path, spec: CifarSpec) -> Path:
    """Locate a CIFAR variant: the extracted folder if complete, else the ``.tar.gz`` archive.

    Raises:
        DatasetNotFoundError: neither form is present.
    """
    root = Path(root).expanduser().absolute()
    folder = root / spec.base_folder
    missing = [n for n, _ in cifar_files(spec) if not (folder / n).is_file()]
    if not missing:
        return folder
    if (root / spec.filename).is_file():
        return root / spec.filename
    raise _cifar_not_found(root, spec, missing if folder.is_dir() else [])


def _extract_cifar(archive: Path, root: Path, spec: CifarSpec) -> Path:
    """Extract the archive into ``root`` and return the folder it must hold."""
    if root / spec.base_folder not in _unpack(archive, root, spec.tgz_md5):
        raise _cifar_not_found(root, spec, [f"{spec.base_folder}/ inside {archive.name}"])
    return root / spec.base_folder


def prepare_cifar(root: str | Path, spec: CifarSpec, verify_checksums: bool = False) -> Path:
    """Extract ``<root>/<archive>.tar.gz`` into ``<root>/<folder>/`` if the folder is incomplete.

    A read-only ``root`` only warns: loading then extracts into a temporary folder instead.

    Args:
        root: the data directory.
        spec: ``torchvision.datasets.CIFAR10`` or ``CIFAR100``.
        verify_checksums: compare the archive (or each extracted file) with torchvision's md5.

    Returns:
        The folder, or the archive when it could not be extracted.
    """
    root = Path(root).expanduser().absolute()
    source = cifar_source(root, spec)
    if source.is_dir():
        if verify_checksums:
            for fname, md5 in cifar_files(spec):
                _check_md5(source / fname, md5)
        return source
    if verify_checksums:
        _check_md5(source, spec.tgz_md5)
    if not _writable(root):
        _warn_read_only(root, source.name)
        return source
    return _extract_cifar(source, root, spec)


@contextmanager
def _readable_cifar(root: Path, spec: CifarSpec) -> Iterator[Path]:
    """A root holding the complete extracted folder, for torchvision."""
    source = cifar_source(root, spec)
    if source.is_dir():
        yield root
    elif _writable(root):
        yield _extract_cifar(source, root, spec).parent
    else:
        with tempfile.TemporaryDirectory(prefix="lmc-cifar-") as tmp:
            yield _extract_cifar(source, Path(tmp), spec).parent


def load_cifar(root: str | Path, spec: CifarSpec, split: str) -> tuple[Tensor, Tensor]:
    """Load a CIFAR split (``"train"`` or ``"test"``) with torchvision's reader.

    Returns:
        ``images`` of shape (N, 3, 32, 32), uint8, and ``labels`` of shape (N,), int64.
    """
    root = Path(root).expanduser().absolute()
    with _readable_cifar(root, spec) as readable:
        try:
            # spec is type[Any] (torchvision is untyped), which typeshed's functools.cache does
            # not take as Hashable; a class is
            reader = _reader(spec)  # type: ignore[arg-type]  # typeshed: type[Any] not Hashable
            ds = reader(readable, train=split == "train", download=False)
        except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError) as err:
            folder = readable / spec.base_folder
            files = [n for n, _ in (spec.train_list if split == "train" else spec.test_list)]
            differ = [n for n, md5 in cifar_files(spec) if not check_integrity(folder / n, md5)]
            raise DatasetCorruptError(
                f"torchvision cannot read the {spec.__name__} {split} batches "
                f"({', '.join(files)}) in {root / spec.base_folder}: {type(err).__name__}: {err}. "
                f"Files that differ from the originals (by torchvision's md5 list): "
                f"{', '.join(differ) or 'none'}. Fix: copy the original archive {spec.filename} "
                f"(md5 {spec.tgz_md5}) there again and delete the folder, or copy the original "
                "folder again."
            ) from err
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # torchvision: NHWC
    return images, torch.as_tensor(ds.targets, dtype=torch.long)
