"""LightningDataModules: MNIST, Fashion-MNIST, CIFAR-10/100 (offline), synthetic regressions.

Every data module offers ``train/val/test/predict_dataloader`` plus ``alignment_dataloader``
(a fixed, un-augmented subset of train for matching and BatchNorm re-estimation) and a
``task`` of ``"classification"`` or ``"regression"``. Vision data is read through
``torchvision.datasets`` and augmented with ``torchvision.transforms.v2`` ops. The
``write_fake_*`` functions write tiny seeded datasets in torchvision's on-disk formats for tests.
"""

from lmc.data.base import BaseDataModule
from lmc.data.fake import write_fake_cifar10, write_fake_cifar100, write_fake_mnist
from lmc.data.federated import FederatedClients
from lmc.data.formats import DatasetCorruptError, DatasetNotFoundError
from lmc.data.memory import BatchAugment, InMemoryImageDataset
from lmc.data.subset import ClassSubset, class_counts
from lmc.data.synthetic import (
    PolynomialDataModule,
    SyntheticRegressionDataModule,
    TeacherStudentDataModule,
)
from lmc.data.vision import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    VisionDataModule,
)

__all__ = [
    "ClassSubset",
    "class_counts",
    "BaseDataModule",
    "BatchAugment",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "DatasetCorruptError",
    "DatasetNotFoundError",
    "FashionMNISTDataModule",
    "FederatedClients",
    "InMemoryImageDataset",
    "MNISTDataModule",
    "PolynomialDataModule",
    "SyntheticRegressionDataModule",
    "TeacherStudentDataModule",
    "VisionDataModule",
    "write_fake_cifar10",
    "write_fake_cifar100",
    "write_fake_mnist",
]
