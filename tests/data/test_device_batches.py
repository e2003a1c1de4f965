"""Device-resident data (issue #16 item 2): the splits held as tensors on the training device,
batches drawn there without a DataLoader, and exactly the DataLoader's batches."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lmc.data import CIFAR10DataModule, MNISTDataModule, TeacherStudentDataModule
from lmc.data.base import DeviceBatches
from lmc.models import MLP
from lmc.tasks import ClassificationTask


def _epochs(loader, epochs: int = 2) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)  # what Lightning does before every epoch
        out += [tuple(b) for b in loader]
    return out


def test_device_batches_equal_the_dataloader_batches_with_augmentation(fake_root):
    """Same order per epoch, same crop/flip/rotation draws, same last (short) batch."""
    kw = {"batch_size": 24, "val_size": 10, "alignment_size": 8, "rotate": 15.0}
    ref = CIFAR10DataModule(str(fake_root), on_device=False, **kw)
    dev = CIFAR10DataModule(str(fake_root), **kw)  # default: on where it fits
    L.seed_everything(3)
    a = _epochs(ref.train_dataloader())
    L.seed_everything(3)
    loader = dev.train_dataloader()
    assert isinstance(loader, DeviceBatches) and isinstance(ref.train_dataloader(), DataLoader)
    b = _epochs(loader)
    assert [len(y) for _, y in b] == [24, 24, 6] * 2 and len(loader) == 3
    assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))
    assert not torch.equal(b[0][1], b[3][1])  # epoch 1 is another order
    for split in ("val", "test"):  # fixed order, not augmented
        ra, rb = getattr(ref, f"{split}_dataloader")(), getattr(dev, f"{split}_dataloader")()
        assert all(torch.equal(u, v) for x, y in zip(ra, rb) for u, v in zip(x, y))
    assert isinstance(dev.alignment_dataloader(), DataLoader)  # matching code keeps its loader


def test_device_batches_of_tensor_splits_equal_the_dataloader():
    kw = {"input_dim": 4, "n_train": 50, "n_val": 10, "n_test": 10, "batch_size": 16}
    L.seed_everything(0)
    a = _epochs(TeacherStudentDataModule(on_device=False, **kw).train_dataloader())
    L.seed_everything(0)
    b = _epochs(TeacherStudentDataModule(**kw).train_dataloader())
    assert [len(y) for _, y in b] == [16, 16, 16, 2] * 2
    assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))


def _fit(root, on_device: bool | None) -> dict[str, torch.Tensor]:
    L.seed_everything(0)
    dm = MNISTDataModule(
        str(root), batch_size=16, val_size=8, alignment_size=4, rotate=10.0, on_device=on_device
    )
    task = ClassificationTask(MLP(width=16, depth=2))
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(task, datamodule=dm)
    assert isinstance(trainer.train_dataloader, DeviceBatches) == (on_device is not False)
    return {k: v.clone() for k, v in task.state_dict().items()}


def test_a_run_on_device_batches_is_bitwise_the_run_on_a_dataloader(fake_root, tmp_path):
    """Rotation draws from the global random stream in the same order either way."""
    a, b = _fit(fake_root, on_device=False), _fit(fake_root, on_device=None)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_on_device_true_that_cannot_hold_says_why_and_the_fix(fake_root):
    with pytest.raises(ValueError, match="num_workers=2.*set num_workers=0 or on_device=false"):
        MNISTDataModule(str(fake_root), num_workers=2, on_device=True)
    dm = MNISTDataModule(str(fake_root), val_size=8, alignment_size=4, on_device=True)
    dm.trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device="cpu"))
    with pytest.raises(ValueError, match="2 processes each need their shard.*on_device=false"):
        dm.train_dataloader()
    dm.on_device = None  # auto: falls back to a DataLoader (Lightning shards it)
    assert isinstance(dm.train_dataloader(), DataLoader)

    class Lazy(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return torch.zeros(2), 0

    dm.trainer, dm.on_device = None, True
    with pytest.raises(ValueError, match="the split is a Lazy, not tensors in memory"):
        dm._loader(Lazy(), 2, shuffle=True)
