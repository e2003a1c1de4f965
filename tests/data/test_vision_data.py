"""Vision data modules: seeded disjoint splits, the fixed un-augmented alignment subset,
augmentation, and data order driven by ``seed_everything``."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms.v2 import functional as TF

from lmc.data import BatchAugment, CIFAR10DataModule, CIFAR100DataModule, MNISTDataModule
from lmc.data.memory import rotate_per_sample
from lmc.data.vision import split_indices


def test_split_indices_are_disjoint_sized_and_seeded():
    train, val, align = split_indices(1000, val_size=100, alignment_size=50, seed=0)
    assert (len(train), len(val), len(align)) == (900, 100, 50)
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert set(train.tolist()) | set(val.tolist()) == set(range(1000))
    assert set(align.tolist()) <= set(train.tolist()) and len(set(align.tolist())) == 50
    again = split_indices(1000, val_size=100, alignment_size=50, seed=0)
    assert all(torch.equal(a, b) for a, b in zip((train, val, align), again))
    other = split_indices(1000, val_size=100, alignment_size=50, seed=1)
    assert not torch.equal(val, other[1]) and not torch.equal(align, other[2])
    limited, val_l, _ = split_indices(
        1000, val_size=100, alignment_size=50, seed=0, limit_train=200
    )
    assert (
        len(limited) == 200
        and torch.equal(val_l, val)
        and set(limited.tolist()) <= set(train.tolist())
    )


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"val_size": 64}, "val_size"),
        ({"val_size": 8, "alignment_size": 57}, "alignment_size"),
        ({"val_size": 8, "alignment_size": 20, "limit_train": 10}, "alignment_size"),
    ],
)
def test_too_large_sizes_name_the_option_to_lower(kwargs, option, tmp_path, write_fake):
    write_fake(MNISTDataModule, tmp_path)
    with pytest.raises(ValueError, match=f"Lower {option}"):
        MNISTDataModule(str(tmp_path), **kwargs).setup("fit")


def test_data_module_splits_follow_the_split_seed_only(fake_root):
    def split(seed):
        dm = CIFAR10DataModule(str(fake_root), val_size=10, alignment_size=8, seed=seed)
        dm.setup("fit")
        return dm.train_dataset.indices, dm.val_dataset.indices, dm.alignment_dataset.indices

    train, val, align = split(0)
    assert (len(train), len(val), len(align)) == (54, 10, 8)
    assert set(train.tolist()).isdisjoint(val.tolist()) and set(align.tolist()) <= set(
        train.tolist()
    )
    L.seed_everything(123)  # the training seed does not move the split
    assert all(torch.equal(a, b) for a, b in zip((train, val, align), split(0)))
    assert not torch.equal(val, split(1)[1])


def test_alignment_subset_is_fixed_unaugmented_and_complete(fake_root):
    dm = CIFAR10DataModule(
        str(fake_root), batch_size=8, val_size=10, alignment_size=13, rotate=10.0
    )
    assert dm.train_augment == BatchAugment(crop_padding=4, flip=True, rotate=10.0)
    ds = dm.alignment_dataset
    x1, y1 = ds.tensors()
    x2, _ = ds.tensors()
    assert torch.equal(x1, x2)
    clean = CIFAR10DataModule(str(fake_root), val_size=10, alignment_size=13, augment=False)
    assert torch.equal(x1, clean.alignment_dataset.tensors()[0])  # same as with augment off
    xs, ys = zip(*dm.alignment_dataloader(batch_size=5))
    assert [len(y) for y in ys] == [5, 5, 3]  # nothing dropped, fixed order
    assert torch.equal(torch.cat(xs), x1) and torch.equal(torch.cat(ys), y1)
    assert len(list(dm.alignment_dataloader())) == 2  # eval_batch_size defaults to batch_size
    # training images are augmented, validation images are not
    idx = list(range(6))
    assert not torch.equal(dm.train_dataset.batch(idx)[0], dm.train_dataset.batch(idx)[0])
    assert torch.equal(dm.val_dataset.batch(idx)[0], dm.val_dataset.batch(idx)[0])


def test_mnist_has_no_augmentation_unless_rotation(fake_root):
    assert MNISTDataModule(str(fake_root)).train_augment is None
    assert MNISTDataModule(str(fake_root), rotate=15).train_augment == BatchAugment(rotate=15)
    assert CIFAR100DataModule(str(fake_root), augment=False).train_augment is None


def test_training_order_follows_seed_everything(fake_root):
    dm = CIFAR10DataModule(str(fake_root), batch_size=16, val_size=8, alignment_size=4)

    def first_batch(seed):
        L.seed_everything(seed)
        return next(iter(dm.train_dataloader()))

    a, b, c = first_batch(1), first_batch(1), first_batch(2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
    assert a[0].shape == (16, 3, 32, 32) and a[1].shape == (16,)


def test_loaders_shapes_and_generic_dataloader_compat(fake_root):
    dm = MNISTDataModule(
        str(fake_root), batch_size=10, eval_batch_size=7, val_size=8, alignment_size=4
    )
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("fit")  # idempotent
    assert [len(y) for _, y in dm.val_dataloader()] == [7, 1]
    assert sum(len(y) for _, y in dm.train_dataloader()) == 56
    assert [len(y) for _, y in dm.test_dataloader()] == [7] * 4 + [4]
    xp, yp = next(iter(dm.predict_dataloader()))
    xt, yt = next(iter(dm.test_dataloader()))
    assert torch.equal(xp, xt) and torch.equal(yp, yt)
    # a plain DataLoader with the default collate yields the same tensors
    xg, yg = next(iter(DataLoader(dm.test_dataset, batch_size=7)))
    assert torch.equal(xg, xt) and torch.equal(yg, yt)
    x0, y0 = dm.test_dataset[0]
    assert x0.shape == (1, 28, 28) and torch.equal(x0, xt[0]) and int(y0) == int(yt[0])


def test_batch_augment_crop_flip_and_rotation_known_answers():
    torch.manual_seed(0)
    x = torch.rand(16, 3, 8, 8)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    out = BatchAugment(crop_padding=2)(x)
    for i in range(16):  # every crop is a window of the zero-padded image
        windows = [padded[i, :, r : r + 8, c : c + 8] for r in range(5) for c in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    flipped = BatchAugment(flip=True)(x)
    same = [torch.equal(flipped[i], x[i]) for i in range(16)]
    assert all(s or torch.equal(flipped[i], x[i].flip(-1)) for i, s in enumerate(same))
    assert 0 < sum(same) < 16
    assert torch.equal(BatchAugment(rotate=1e-6)(x), x)  # (nearly) zero angle is the identity
    assert BatchAugment(rotate=30)(x).shape == x.shape
    assert not BatchAugment().active


def test_augmentation_is_drawn_per_sample_from_torchs_rng():
    torch.manual_seed(0)
    img = torch.randint(1, 256, (3, 10, 10), dtype=torch.uint8)  # no zeros: padding shows
    batch = img.expand(64, -1, -1, -1)  # 64 identical images
    aug = BatchAugment(crop_padding=4, flip=True)
    torch.manual_seed(1)
    out = aug(batch)
    padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
    crops = [padded[:, r : r + 10, c : c + 10] for r in range(9) for c in range(9)]
    outcomes = crops + [c.flip(-1) for c in crops]  # the 81 padded crops and their flips
    hits = [next((k for k, o in enumerate(outcomes) if torch.equal(x, o)), None) for x in out]
    assert None not in hits  # every output is one crop of the padded input, maybe flipped
    assert len(set(hits)) > 30  # one draw per sample, not one for the whole batch
    assert any(h < 81 for h in hits) and any(h >= 81 for h in hits)
    torch.manual_seed(1)
    assert torch.equal(aug(batch.float()), out.float())  # same draws from the same seed


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28), (3, 12, 20)])
def test_batched_rotation_equals_torchvisions_rotate_per_image(shape):
    torch.manual_seed(0)
    x = torch.randint(1, 256, (24, *shape), dtype=torch.uint8)
    angles = torch.empty(24).uniform_(-40, 40)
    expected = torch.stack(
        [TF.rotate(img, a, TF.InterpolationMode.NEAREST) for img, a in zip(x, angles.tolist())]
    )
    assert torch.equal(rotate_per_sample(x, angles), expected)
    assert torch.equal(rotate_per_sample(x.float(), angles), expected.float())


def test_rotation_is_drawn_per_sample_with_nearest_zero_fill():
    img = torch.randint(1, 256, (1, 3, 12, 12), dtype=torch.uint8)
    out = BatchAugment(rotate=40)(img.expand(32, -1, -1, -1))
    assert len({tuple(x.flatten().tolist()) for x in out}) > 20
    assert set(out.unique().tolist()) <= set(img.unique().tolist()) | {0}  # nearest, black fill
    assert (out == 0).any()


def test_training_batch_of_one_image_gets_independent_augmentations(fake_root):
    dm = CIFAR10DataModule(str(fake_root), val_size=8, alignment_size=4)
    x, y = dm.train_dataset.batch([0] * 32)
    assert len({tuple(v.flatten().tolist()) for v in x}) > 10 and len(set(y.tolist())) == 1


def test_in_memory_subset_batches_are_the_normalised_rows_and_index_like_a_sequence():
    from lmc.data.memory import InMemoryImageDataset

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (20, 1, 4, 4), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (20,), generator=g)
    subset = torch.tensor([7, 3, 19, 0, 11])
    ds = InMemoryImageDataset(images, labels, mean=[0.5], std=[0.25], indices=subset)
    x, y = ds.batch(torch.tensor([4, 0, 2, 0]))
    rows = subset[[4, 0, 2, 0]]
    torch.testing.assert_close(x, (images[rows].float() / 255 - 0.5) / 0.25)
    assert torch.equal(y, labels[rows])
    assert torch.equal(ds[-1][0], ds[4][0]) and int(ds[-5][1]) == int(labels[7])
    for bad in (5, -6):
        with pytest.raises(IndexError, match="out of range for a dataset of 5"):
            ds[bad]
