"""Offline readers for torchvision's on-disk dataset layouts (MNIST idx files, CIFAR pickles).

Nothing here touches the network. ``prepare_*`` functions make the files fast to read
(decompress MNIST ``.gz``, extract the CIFAR ``.tar.gz``) and ``load_*`` functions read either
form into uint8 tensors, so loading works even when preparation was skipped or the data
directory is read-only. A missing dataset raises :class:`DatasetNotFoundError`, naming the
path searched, the layout expected there and how to fix it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import shutil
import tarfile
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# md5 of the original .gz files, as published by torchvision (datasets/mnist.py).
MNIST_MD5 = {
    "MNIST": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "FashionMNIST": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
FIX_HINT = (
    "Fix: put the files there, or point the data module at the folder that holds them with the "
    "environment variable LMC_DATA_DIR or the config key data.init_args.data_dir. "
    "Nothing is ever downloaded."
)


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where the data module looked; the message says what to do."""


@dataclass(frozen=True)
class CifarSpec:
    """Names and checksums of one CIFAR variant's python-pickle distribution (torchvision's)."""

    name: str
    folder: str
    archive: str
    archive_md5: str
    train: tuple[tuple[str, str], ...]
    test: tuple[tuple[str, str], ...]
    meta: tuple[str, str]
    label_key: str


CIFAR10 = CifarSpec(
    name="CIFAR-10",
    folder="cifar-10-batches-py",
    archive="cifar-10-python.tar.gz",
    archive_md5="c58f30108f718f92721af3b95e74349a",
    train=(
        ("data_batch_1", "c99cafc152244af753f735de768cd75f"),
        ("data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"),
        ("data_batch_3", "54ebc095f3ab1f0389bbae665268c751"),
        ("data_batch_4", "634d18415352ddfa80567beed471001a"),
        ("data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"),
    ),
    test=(("test_batch", "40351d587109b95175f43aff81a1287e"),),
    meta=("batches.meta", "5ff9c542aee3614f3951f8cda6e48888"),
    label_key="labels",
)
CIFAR100 = CifarSpec(
    name="CIFAR-100",
    folder="cifar-100-python",
    archive="cifar-100-python.tar.gz",
    archive_md5="eb9058c3a382ffc7106e4002c42a8d85",
    train=(("train", "16019d7e3df5f24257cddd939b257f8d"),),
    test=(("test", "f0ef6b0ae62326f3e7ffdfab6717acfc"),),
    meta=("meta", "7973b15100ade9c7d40fb424638fde48"),
    label_key="fine_labels",
)


def md5sum(path: Path) -> str:
    """Hex md5 digest of a file, read in 1 MiB chunks."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_md5(path: Path, expected: str) -> None:
    got = md5sum(path)
    if got != expected:
        raise ValueError(
            f"Checksum mismatch for {path}: md5 {got}, expected {expected} (the original "
            "distribution file). Replace it with an intact copy, or set verify_checksums=False."
        )


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


# ----------------------------------------------------------------------------- MNIST (idx)


def _mnist_missing(raw: Path) -> list[str]:
    names = [n for pair in MNIST_FILES.values() for n in pair]
    return [n for n in names if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()]


def mnist_raw_dir(root: str | Path, name: str) -> Path:
    """Return ``<root>/<name>/raw`` after checking that all four idx files are there.

    Each file may be the original ``.gz`` or its decompressed sibling.

    Raises:
        DatasetNotFoundError: some file is missing; the message lists the expected layout.
    """
    raw = Path(root).expanduser().absolute() / name / "raw"
    missing = _mnist_missing(raw)
    if missing:
        expected = "\n".join(f"  {raw / n}.gz" for pair in MNIST_FILES.values() for n in pair)
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

    Decompression writes to a temporary file and renames it, so an interrupted run never leaves
    a truncated file. A read-only folder is not an error: a warning says so and loading then
    reads the ``.gz`` files directly (slower on every start).

    Returns:
        The ``raw`` folder.
    """
    raw = mnist_raw_dir(root, name)
    for split_files in MNIST_FILES.values():
        for fname in split_files:
            gz, out = raw / f"{fname}.gz", raw / fname
            if verify_checksums and gz.is_file() and fname + ".gz" in MNIST_MD5.get(name, {}):
                _check_md5(gz, MNIST_MD5[name][fname + ".gz"])
            if out.is_file() or not gz.is_file():
                continue
            if not _writable(raw):
                warnings.warn(
                    f"{raw} is not writable, so {gz.name} cannot be decompressed next to itself; "
                    "reading the .gz directly instead. Copy the raw/ folder into a writable "
                    "data_dir to decompress once and start faster.",
                    stacklevel=2,
                )
                continue
            tmp = raw / f".{fname}.{os.getpid()}.tmp"
            try:
                with gzip.open(gz, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, out)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return raw


def parse_idx(data: bytes, source: str = "<bytes>") -> Tensor:
    """Parse an idx file (LeCun's MNIST format) holding unsigned bytes into a uint8 tensor."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{source} is not an unsigned-byte idx file (bad magic number).")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(dims)):
        raise ValueError(f"{source} is truncated or corrupt: header says {dims}.")
    arr = np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)
    return torch.from_numpy(arr.copy())


def _read_maybe_gz(path: Path) -> bytes:
    if path.is_file():
        return path.read_bytes()
    with gzip.open(path.with_name(path.name + ".gz"), "rb") as f:
        return f.read()


def load_mnist(root: str | Path, name: str, split: str) -> tuple[Tensor, Tensor]:
    """Load an MNIST-format split (``"train"`` or ``"test"``) as uint8 images and int64 labels.

    Returns:
        ``images`` of shape (N, 1, 28, 28), uint8, and ``labels`` of shape (N,), int64.
    """
    raw = mnist_raw_dir(root, name)
    img_name, lbl_name = MNIST_FILES[split]
    images = parse_idx(_read_maybe_gz(raw / img_name), str(raw / img_name))
    labels = parse_idx(_read_maybe_gz(raw / lbl_name), str(raw / lbl_name)).long()
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"{raw}: {split} images {tuple(images.shape)} and labels "
            f"{tuple(labels.shape)} do not match."
        )
    return images.unsqueeze(1), labels


# ----------------------------------------------------------------------------- CIFAR (pickles)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays: a data file cannot run arbitrary code."""

    _ALLOWED = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}

    def find_class(self, module: str, name: str) -> Any:
        numpy_array = module.split(".")[0] == "numpy" and name in self._ALLOWED
        if numpy_array or (module, name) == ("_codecs", "encode"):  # py3 protocol-2 bytes
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch file")


def _unpickle(data: bytes) -> dict[str, Any]:
    obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_files(spec: CifarSpec) -> list[tuple[str, str]]:
    return [*spec.train, *spec.test, spec.meta]


def _cifar_not_found(root: Path, spec: CifarSpec, missing: list[str]) -> DatasetNotFoundError:
    files = ", ".join(n for n, _ in _cifar_files(spec))
    return DatasetNotFoundError(
        f"{spec.name} not found in {root}"
        + (f" (missing {', '.join(missing)} in {root / spec.folder})" if missing else "")
        + f".\nExpected either the archive {root / spec.archive} or the extracted folder "
        f"{root / spec.folder}/ holding the python-pickle batches: {files}.\n{FIX_HINT}"
    )


def cifar_source(root: str | Path, spec: CifarSpec) -> Path:
    """Locate a CIFAR variant: the extracted folder if complete, else the ``.tar.gz`` archive.

    Raises:
        DatasetNotFoundError: neither form is present.
    """
    root = Path(root).expanduser().absolute()
    folder = root / spec.folder
    missing = [n for n, _ in _cifar_files(spec) if not (folder / n).is_file()]
    if not missing:
        return folder
    if (root / spec.archive).is_file():
        return root / spec.archive
    raise _cifar_not_found(root, spec, missing if folder.is_dir() else [])


def prepare_cifar(root: str | Path, spec: CifarSpec, verify_checksums: bool = False) -> Path:
    """Extract ``<root>/<archive>.tar.gz`` into ``<root>/<folder>/`` if the folder is incomplete.

    Extraction goes to a temporary folder that is renamed into place, so an interrupted run never
    leaves a half-extracted dataset. A read-only ``root`` only warns: loading then reads the
    batches straight from the archive.

    Returns:
        The folder, or the archive when it could not be extracted.
    """
    root = Path(root).expanduser().absolute()
    source = cifar_source(root, spec)
    if source.is_file():
        if verify_checksums:
            _check_md5(source, spec.archive_md5)
        if not _writable(root):
            warnings.warn(
                f"{root} is not writable, so {source.name} cannot be extracted; reading batches "
                "from the archive instead. Copy it into a writable data_dir to extract it once.",
                stacklevel=2,
            )
            return source
        with tempfile.TemporaryDirectory(dir=root, prefix=".extract-") as tmp:
            with tarfile.open(source, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
            extracted = Path(tmp) / spec.folder
            if not extracted.is_dir():
                raise _cifar_not_found(root, spec, [f"{spec.folder}/ inside {source.name}"])
            if (root / spec.folder).exists():
                shutil.rmtree(root / spec.folder)
            os.replace(extracted, root / spec.folder)
        source = root / spec.folder
    elif verify_checksums:
        for fname, md5 in _cifar_files(spec):
            _check_md5(source / fname, md5)
    return source


def load_cifar(root: str | Path, spec: CifarSpec, split: str) -> tuple[Tensor, Tensor]:
    """Load a CIFAR split (``"train"`` or ``"test"``) from the folder or straight from the archive.

    Returns:
        ``images`` of shape (N, 3, 32, 32), uint8, and ``labels`` of shape (N,), int64.
    """
    source = cifar_source(root, spec)
    names = [n for n, _ in (spec.train if split == "train" else spec.test)]
    if source.is_dir():
        blobs = [(source / n).read_bytes() for n in names]
    else:
        with tarfile.open(source, "r:gz") as tar:
            blobs = []
            for n in names:
                member = tar.extractfile(f"{spec.folder}/{n}")
                if member is None:
                    raise _cifar_not_found(Path(root), spec, [f"{spec.folder}/{n} in {source}"])
                blobs.append(member.read())
    images, labels = [], []
    for n, blob in zip(names, blobs):
        batch = _unpickle(blob)
        data = np.asarray(batch["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{spec.name} batch {n} has data of shape {data.shape}, not N x 3072")
        images.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
        labels.append(torch.as_tensor(np.asarray(batch[spec.label_key]), dtype=torch.long))
    return torch.cat(images), torch.cat(labels)
