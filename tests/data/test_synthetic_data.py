"""Synthetic regressions: teacher-student targets equal the closed form (003 §2), polynomial
data lie in their ranges with the stated noise (000 A.1.1), splits are seeded and independent."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from lmc.data import PolynomialDataModule, TeacherStudentDataModule


def test_teacher_student_targets_equal_the_closed_form():
    dm = TeacherStudentDataModule(input_dim=6, teacher_width=3, n_train=300, n_val=50, n_test=70)
    assert dm.task == "regression"
    assert torch.equal(dm.teacher_weight, torch.eye(6)[:3])
    x, y = dm.train_dataset.tensors
    assert x.shape == (300, 6) and y.shape == (300, 1)
    torch.testing.assert_close(y, x[:, :3].clamp(min=0).sum(1, keepdim=True))  # sum_j relu(e_j . x)
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1  # x ~ N(0, I)
    assert len(dm.val_dataset) == 50 and len(dm.test_dataset) == 70


def test_random_orthonormal_teacher_and_noise():
    dm = TeacherStudentDataModule(
        input_dim=8, teacher_width=5, n_train=4000, noise_std=0.3, random_orthonormal=True
    )
    w = dm.teacher_weight
    assert w.shape == (5, 8)
    torch.testing.assert_close(w @ w.T, torch.eye(5), atol=1e-5, rtol=0)
    assert not torch.equal(w, torch.eye(8)[:5])
    assert torch.equal(w, TeacherStudentDataModule(8, 5, random_orthonormal=True).teacher_weight)
    assert not torch.equal(
        w, TeacherStudentDataModule(8, 5, random_orthonormal=True, seed=1).teacher_weight
    )
    x, y = dm.train_dataset.tensors
    residual = y - torch.relu(x @ w.T).sum(1, keepdim=True)
    assert abs(residual.std().item() - 0.3) < 0.02 and abs(residual.mean().item()) < 0.02


def test_teacher_wider_than_input_is_rejected():
    with pytest.raises(ValueError, match="teacher_width"):
        TeacherStudentDataModule(input_dim=3, teacher_width=4)


@pytest.mark.parametrize("cls", [TeacherStudentDataModule, PolynomialDataModule])
def test_synthetic_splits_are_seeded_and_independent(cls):
    def data(seed=0, n_test=40):
        dm = cls(n_train=64, n_val=16, n_test=n_test, alignment_size=10, seed=seed, batch_size=32)
        dm.setup()
        return dm

    a, b, c = data(), data(), data(seed=1)
    for split in ("train_dataset", "val_dataset", "test_dataset", "alignment_dataset"):
        assert all(
            torch.equal(s, t) for s, t in zip(getattr(a, split).tensors, getattr(b, split).tensors)
        )
        assert not torch.equal(getattr(a, split).tensors[0], getattr(c, split).tensors[0])
    x_train, x_val, x_test = (
        getattr(a, s).tensors[0] for s in ("train_dataset", "val_dataset", "test_dataset")
    )
    assert not torch.equal(x_train[:16], x_val) and not torch.equal(x_train[:40], x_test)
    # the test size does not move the training data; the alignment subset is the first train samples
    assert torch.equal(data(n_test=5).train_dataset.tensors[0], x_train)
    assert torch.equal(a.alignment_dataset.tensors[0], x_train[:10])
    xs, ys = zip(*a.alignment_dataloader(batch_size=4))
    assert [len(y) for y in ys] == [4, 4, 2] and torch.equal(torch.cat(xs), x_train[:10])
    assert [len(y) for _, y in a.train_dataloader()] == [32, 32]
    xg, yg = next(iter(DataLoader(a.val_dataset, batch_size=16)))  # default collate works too
    assert torch.equal(xg, x_val) and torch.equal(yg, a.val_dataset.tensors[1])
    assert len(cls(n_train=64, n_val=16, n_test=8).alignment_dataset) == 64  # default: all of train


def test_alignment_size_above_n_train_is_rejected():
    with pytest.raises(ValueError, match="lower alignment_size"):
        PolynomialDataModule(n_train=10, alignment_size=11)


@pytest.mark.parametrize(("degree", "lo", "hi"), [(1, -4.0, -2.0), (3, 2.0, 4.0)])
def test_polynomial_ranges_targets_and_noise(degree, lo, hi):
    dm = PolynomialDataModule(degree=degree, n_train=8000, n_val=10, n_test=10)
    x, y = dm.train_dataset.tensors
    assert x.shape == (8000, 1) and y.shape == (8000, 1) and dm.task == "regression"
    assert dm.x_range == (lo, hi) and lo <= x.min().item() and x.max().item() <= hi
    assert x.min().item() < lo + 0.01 and x.max().item() > hi - 0.01  # covers the interval
    clean = x + 3 if degree == 1 else (x - 3) ** 3
    residual = y - clean
    assert abs(residual.std().item() - 0.05) < 0.003 and abs(residual.mean().item()) < 0.003
    noiseless = PolynomialDataModule(degree=degree, n_train=50, noise_std=0.0).train_dataset.tensors
    torch.testing.assert_close(noiseless[1], dm.target(noiseless[0]))


def test_polynomial_rejects_other_degrees():
    with pytest.raises(ValueError, match="degree"):
        PolynomialDataModule(degree=2)
