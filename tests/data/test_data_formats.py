"""On-disk formats: fake MNIST/CIFAR files load with the right shapes, classes and pixels;
preparation decompresses/extracts offline; a missing dataset is a clear FileNotFoundError."""

from __future__ import annotations

import gzip
import pickle
import tarfile

import numpy as np
import pytest
import torch

from lmc.data import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    DatasetNotFoundError,
    FashionMNISTDataModule,
    MNISTDataModule,
)
from lmc.data import formats as F

VISION = [MNISTDataModule, FashionMNISTDataModule, CIFAR10DataModule, CIFAR100DataModule]
CIFAR = [CIFAR10DataModule, CIFAR100DataModule]

EXPECTED = {  # num_classes, in_channels, image_size, mean, std
    MNISTDataModule: (10, 1, 28, (0.1307,), (0.3081,)),
    FashionMNISTDataModule: (10, 1, 28, (0.2860,), (0.3530,)),
    CIFAR10DataModule: (10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    CIFAR100DataModule: (100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def raw_pixels(cls: type, root, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Read the fake files independently of lmc: idx via numpy, CIFAR pickles via pickle."""
    if cls in (MNISTDataModule, FashionMNISTDataModule):
        raw = root / cls.dataset_name / "raw"
        img, lbl = F.MNIST_FILES[split]

        def read(name):
            path = raw / name
            data = (
                path.read_bytes()
                if path.exists()
                else gzip.decompress((raw / f"{name}.gz").read_bytes())
            )
            return np.frombuffer(data, np.uint8)

        return read(img)[16:].reshape(-1, 1, 28, 28), read(lbl)[8:].astype(np.int64)
    spec = cls.spec
    folder = root / spec.base_folder
    if not folder.exists():
        with tarfile.open(root / spec.filename) as tar:
            tar.extractall(root / "check", filter="data")
        folder = root / "check" / spec.base_folder
    xs, ys = [], []
    for name, _ in spec.train_list if split == "train" else spec.test_list:
        batch = pickle.loads((folder / name).read_bytes(), encoding="bytes")
        xs.append(batch["data"].reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch.get("labels", batch.get("fine_labels"))))
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
def test_fake_dataset_loads_with_shapes_classes_and_normalisation(
    cls, packed, tmp_path, write_fake
):
    write_fake(cls, tmp_path, packed=packed)
    num_classes, channels, size, mean, std = EXPECTED[cls]
    dm = cls(str(tmp_path), val_size=8, alignment_size=4)
    assert (dm.num_classes, dm.in_channels, dm.image_size, dm.mean, dm.std) == EXPECTED[cls][:5]
    assert dm.task == "classification"
    dm.setup()  # without prepare_data: setup unpacks the .gz / .tar.gz itself
    test = dm.test_dataset
    assert len(test) == 32 and len(dm.train_dataset) + len(dm.val_dataset) == (
        128 if num_classes == 100 else 64
    )
    x, y = test.tensors()
    assert (
        x.shape == (32, channels, size, size)
        and x.dtype == torch.float32
        and y.dtype == torch.int64
    )
    raw_x, raw_y = raw_pixels(cls, tmp_path, "test")
    expected = (
        torch.from_numpy(raw_x.copy()).float() / 255 - torch.tensor(mean).view(1, -1, 1, 1)
    ) / torch.tensor(std).view(1, -1, 1, 1)
    torch.testing.assert_close(x, expected)
    assert torch.equal(y, torch.from_numpy(raw_y))
    train_labels = dm.train_dataset.labels
    assert set(train_labels.tolist()) == set(range(num_classes))  # every class present


@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
def test_prepare_data_unpacks_next_to_the_originals(cls, tmp_path, write_fake):
    write_fake(cls, tmp_path)
    dm = cls(str(tmp_path), val_size=8, alignment_size=4)
    dm.prepare_data()
    dm.prepare_data()  # idempotent
    if cls in CIFAR:
        assert all(
            (tmp_path / cls.spec.base_folder / n).is_file() for n, _ in F.cifar_files(cls.spec)
        )
    else:
        raw = tmp_path / cls.dataset_name / "raw"
        assert sorted(p.name for p in raw.iterdir() if not p.name.endswith(".gz")) == sorted(
            n for pair in F.MNIST_FILES.values() for n in pair
        )  # decompressed siblings, no temporary leftovers
    assert not [p for p in tmp_path.rglob(".*")]
    x_packed = cls(str(tmp_path), val_size=8, alignment_size=4).test_dataset.tensors()[0]
    assert x_packed.shape[0] == 32


@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
def test_read_only_folder_warns_and_reads_packed_files(cls, tmp_path, monkeypatch, write_fake):
    write_fake(cls, tmp_path)
    monkeypatch.setattr(F, "_writable", lambda folder: False)
    dm = cls(str(tmp_path), val_size=8, alignment_size=4)
    with pytest.warns(UserWarning, match="not writable"):
        dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_dataset) == (120 if cls is CIFAR100DataModule else 56)


@pytest.mark.parametrize("cls", VISION, ids=lambda c: c.__name__)
@pytest.mark.parametrize("hook", ["prepare_data", "setup"])
def test_missing_dataset_names_path_layout_and_fix(cls, hook, tmp_path):
    empty = tmp_path / "nowhere"
    dm = cls(str(empty))
    with pytest.raises(FileNotFoundError) as err:
        getattr(dm, hook)()
    assert isinstance(err.value, DatasetNotFoundError)
    msg = str(err.value)
    assert str(empty) in msg and "LMC_DATA_DIR" in msg and "data.init_args.data_dir" in msg
    if cls in CIFAR:
        assert cls.spec.filename in msg and cls.spec.base_folder in msg
        assert all(name in msg for name, _ in F.cifar_files(cls.spec))
    else:
        assert f"{cls.dataset_name}/raw" in msg and "train-images-idx3-ubyte.gz" in msg
        assert "t10k-labels-idx1-ubyte.gz" in msg


def test_partially_present_mnist_lists_the_missing_file(tmp_path, write_fake):
    raw = write_fake(MNISTDataModule, tmp_path)
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="missing t10k-labels-idx1-ubyte"):
        MNISTDataModule(str(tmp_path)).prepare_data()


def test_data_dir_defaults_to_env_then_local(monkeypatch, tmp_path):
    monkeypatch.setenv("LMC_DATA_DIR", str(tmp_path))
    assert MNISTDataModule().data_dir == tmp_path
    assert MNISTDataModule(data_dir="elsewhere").data_dir.name == "elsewhere"
    monkeypatch.delenv("LMC_DATA_DIR")
    assert str(CIFAR10DataModule().data_dir) == "data"


@pytest.mark.parametrize("cls", [MNISTDataModule, CIFAR10DataModule], ids=lambda c: c.__name__)
def test_checksums_are_optional_and_reject_fake_files(cls, tmp_path, write_fake):
    write_fake(cls, tmp_path, packed=cls is MNISTDataModule)
    cls(str(tmp_path)).prepare_data()
    with pytest.raises(ValueError, match="md5"):
        cls(str(tmp_path), verify_checksums=True).prepare_data()


def test_corrupt_idx_file_is_reported(tmp_path, write_fake):
    raw = write_fake(MNISTDataModule, tmp_path, packed=False)
    data = (raw / "train-images-idx3-ubyte").read_bytes()
    (raw / "train-images-idx3-ubyte").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        MNISTDataModule(str(tmp_path), val_size=8, alignment_size=4).setup("fit")


def test_fake_images_carry_a_learnable_signal(tmp_path, write_fake):
    write_fake(MNISTDataModule, tmp_path, n_train=200)
    x, y = MNISTDataModule(str(tmp_path), val_size=8, alignment_size=4).train_dataset.tensors()
    torch.manual_seed(0)
    model = torch.nn.Linear(28 * 28, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
