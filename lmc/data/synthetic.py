"""Synthetic regression data modules, generated in memory from ``seed`` (no files).

- :class:`TeacherStudentDataModule`: two-layer ReLU teacher with orthonormal neurons,
  Gaussian inputs (003 §2, App. B.1).
- :class:`PolynomialDataModule`: the first- and third-degree 1-D polynomial regressions
  (000 App. A.1.1, after von Oswald et al. 2019 and Peña et al. 2023).

Train, validation and test samples are drawn from independent seeded streams, so changing one
split's size leaves the others unchanged. The alignment subset is the first ``alignment_size``
training samples (an i.i.d. draw, hence a fixed random subset), in a fixed order.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lmc.data.base import BaseDataModule, seeded_generator
from lmc.data.memory import SampleList

_TRAIN, _VAL, _TEST, _TEACHER = 1, 2, 3, 4


class RegressionTensors(TensorDataset):
    """``TensorDataset`` of (inputs, targets) that hands a ``DataLoader`` whole batches."""

    def __getitems__(self, idx: Sequence[int]) -> SampleList:
        rows = torch.as_tensor(idx, dtype=torch.long)
        return SampleList(*(t[rows] for t in self.tensors))


class SyntheticRegressionDataModule(BaseDataModule):
    """Base for in-memory regression tasks: inputs (N, input_dim), targets (N, 1). The splits
    are tensors drawn in memory, so their loaders use no worker processes.

    Args:
        n_train: training samples.
        n_val: validation samples (drawn independently of train and test).
        n_test: test samples (drawn independently).
        alignment_size: training samples in the alignment subset (``None``: all of them).
        batch_size: training batch size.
        eval_batch_size: batch size for validation/test/predict/alignment (``None``: batch_size).
        on_device: hold the splits on the training device and draw batches there (``None``:
            where they fit; see :class:`lmc.data.base.BaseDataModule`).
        seed: seed of the generated data (and teacher), independent of the training seed.
    """

    task: ClassVar[str] = "regression"
    output_dim: ClassVar[int] = 1
    model_keys: ClassVar[tuple[str, ...]] = ("seed", "noise_std")

    def __init__(
        self,
        n_train: int,
        n_val: int,
        n_test: int,
        alignment_size: int | None = None,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        on_device: bool | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, 0, on_device)
        if n_train < 1 or n_val < 0 or n_test < 0:
            raise ValueError(
                f"need n_train >= 1 and n_val, n_test >= 0, got {n_train=}, {n_val=}, {n_test=}"
            )
        if alignment_size is not None and not 0 <= alignment_size <= n_train:
            raise ValueError(
                f"alignment_size={alignment_size} must lie in [0, n_train={n_train}]; "
                "lower alignment_size (data.init_args.alignment_size) or raise n_train."
            )
        self.n_train = n_train
        self.n_val = n_val
        self.n_test = n_test
        self.alignment_size = n_train if alignment_size is None else alignment_size
        self.seed = seed

    @abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``n`` (input, target) pairs with ``generator``; targets include the noise."""

    def _draw(self, n: int, stream: int) -> RegressionTensors:
        return RegressionTensors(*self.sample(n, seeded_generator(self.seed, stream)))

    def _setup_fit(self) -> None:
        self._train = self._draw(self.n_train, _TRAIN)
        self._val = self._draw(self.n_val, _VAL)
        x, y = self._train.tensors
        self._alignment = RegressionTensors(x[: self.alignment_size], y[: self.alignment_size])

    def _setup_test(self) -> None:
        self._test = self._draw(self.n_test, _TEST)


class TeacherStudentDataModule(SyntheticRegressionDataModule):
    """Two-layer ReLU teacher-student regression (003 §2, App. B.1).

    Inputs x ~ N(0, I_d); targets y = f*(x) + noise_std * N(0, 1) with the teacher
    f*(x) = sum_{j=1..k} relu(w*_j . x), output weights fixed at 1, and orthonormal teacher
    neurons w*_j (rows of :attr:`teacher_weight`): the standard basis vectors e_1..e_k by
    default (003 Assumption 1; any orthonormal set is equivalent by rotational symmetry), or
    a random orthonormal set (QR of a seeded Gaussian matrix).

    Args:
        input_dim: input dimension d.
        teacher_width: number of teacher neurons k (at most d).
        n_train: training samples.
        n_val: validation samples.
        n_test: test samples.
        noise_std: standard deviation of Gaussian noise added to every split's targets.
        random_orthonormal: draw random orthonormal teacher neurons instead of e_1..e_k.
        kwargs: ``alignment_size``, ``batch_size``, ``eval_batch_size``, ``on_device`` and
            ``seed`` (of the data and any teacher, independent of the training seed), as in
            :class:`SyntheticRegressionDataModule`.
    """

    model_keys: ClassVar[tuple[str, ...]] = (
        "seed",
        "noise_std",
        "input_dim",
        "teacher_width",
        "random_orthonormal",
    )

    def __init__(
        self,
        input_dim: int = 10,
        teacher_width: int = 4,
        n_train: int = 2000,
        n_val: int = 500,
        n_test: int = 2000,
        noise_std: float = 0.0,
        random_orthonormal: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(n_train, n_val, n_test, **kwargs)
        if not 1 <= teacher_width <= input_dim:
            raise ValueError(
                f"orthonormal teacher neurons need 1 <= teacher_width <= input_dim, got "
                f"teacher_width={teacher_width}, input_dim={input_dim}"
            )
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.input_dim = input_dim
        self.teacher_width = teacher_width
        self.noise_std = noise_std
        self.random_orthonormal = random_orthonormal
        if random_orthonormal:
            g = seeded_generator(self.seed, _TEACHER)
            q, r = torch.linalg.qr(torch.randn(input_dim, teacher_width, generator=g))
            q = q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0)  # unique, Haar-distributed Q
            weight = q.T.contiguous()
        else:
            weight = torch.eye(input_dim)[:teacher_width]
        self.teacher_weight: Tensor = weight
        """Teacher neurons as rows, shape (teacher_width, input_dim), orthonormal."""

    def teacher(self, x: Tensor) -> Tensor:
        """Noise-free teacher output f*(x) = sum_j relu(w*_j . x), shape (N, 1)."""
        return torch.relu(x @ self.teacher_weight.T).sum(dim=1, keepdim=True)

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, self.input_dim, generator=generator)
        noise = torch.randn(n, 1, generator=generator) * self.noise_std
        return x, self.teacher(x) + noise


class PolynomialDataModule(SyntheticRegressionDataModule):
    """1-D polynomial regression of 000 App. A.1.1.

    ``degree=1``: y = x + 3, x ~ U(-4, -2). ``degree=3``: y = (x - 3)^3, x ~ U(2, 4).
    Gaussian noise N(0, 0.05) is added to every split's targets; the paper's 0.05 is used as
    the standard deviation (``noise_std``).

    Args:
        degree: 1 or 3, selecting the task.
        n_train: training samples.
        n_val: validation samples.
        n_test: test samples.
        noise_std: standard deviation of the target noise (0.05 in 000 A.1.1).
        kwargs: ``alignment_size``, ``batch_size``, ``eval_batch_size``, ``on_device`` and
            ``seed`` (of the data and any teacher, independent of the training seed), as in
            :class:`SyntheticRegressionDataModule`.
    """

    input_dim: ClassVar[int] = 1
    model_keys: ClassVar[tuple[str, ...]] = ("seed", "noise_std", "degree")
    RANGES: ClassVar[dict[int, tuple[float, float]]] = {1: (-4.0, -2.0), 3: (2.0, 4.0)}

    def __init__(
        self,
        degree: Literal[1, 3] = 1,
        n_train: int = 1000,
        n_val: int = 200,
        n_test: int = 1000,
        noise_std: float = 0.05,
        **kwargs: Any,
    ) -> None:
        super().__init__(n_train, n_val, n_test, **kwargs)
        if degree not in self.RANGES:
            raise ValueError(f"degree must be 1 or 3 (000 A.1.1), got {degree}")
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.degree = degree
        self.noise_std = noise_std

    @property
    def x_range(self) -> tuple[float, float]:
        """Interval the inputs are drawn from uniformly."""
        return self.RANGES[self.degree]

    def target(self, x: Tensor) -> Tensor:
        """Noise-free target: x + 3 (degree 1) or (x - 3)^3 (degree 3)."""
        return x + 3 if self.degree == 1 else (x - 3) ** 3

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        lo, hi = self.x_range
        x = lo + (hi - lo) * torch.rand(n, 1, generator=generator)
        noise = torch.randn(n, 1, generator=generator) * self.noise_std
        return x, self.target(x) + noise
