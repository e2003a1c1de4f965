"""In-memory image datasets with batched tensor augmentation (no PIL, no per-item transforms).

A whole dataset is held as one uint8 tensor. :class:`InMemoryImageDataset` implements
``__getitems__`` so a ``DataLoader`` fetches a batch with one indexing op, augments the batch
with :class:`BatchAugment` (random crop with zero padding, horizontal flip, rotation — the
CIFAR recipes of 002 §4 and 004 App. B) and normalises it. Randomness comes from torch's global
RNG (or the worker's), so ``seed_everything`` fixes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset, default_collate


@dataclass(frozen=True)
class BatchAugment:
    """Random augmentation of a float image batch, drawn independently per sample.

    Args:
        crop_padding: zero-pad each side by this many pixels, then crop back to the original
            size at a random offset (torchvision ``RandomCrop(size, padding=crop_padding)``).
        flip: flip horizontally with probability 1/2 (``RandomHorizontalFlip``).
        rotate: rotate by an angle drawn uniformly from [-rotate, rotate] degrees, nearest
            interpolation, zero fill (``RandomRotation(rotate)``; 002 §4).
    """

    crop_padding: int = 0
    flip: bool = False
    rotate: float = 0.0

    @property
    def active(self) -> bool:
        """Whether this augmentation changes anything."""
        return self.crop_padding > 0 or self.flip or self.rotate > 0

    def __call__(self, x: Tensor) -> Tensor:
        """Augment float images ``x`` of shape (B, C, H, W); padding and fill are zeros."""
        if self.rotate > 0:
            x = self._rotate(x)
        if self.crop_padding > 0:
            x = self._crop(x)
        if self.flip:
            mask = torch.rand(x.shape[0]) < 0.5
            x = torch.where(mask[:, None, None, None], x.flip(-1), x)
        return x

    def _crop(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        p = self.crop_padding
        padded = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (b,))
        dx = torch.randint(0, 2 * p + 1, (b,))
        rows = (dy[:, None] + torch.arange(h)).view(b, 1, h, 1).expand(b, c, h, w + 2 * p)
        cols = (dx[:, None] + torch.arange(w)).view(b, 1, 1, w).expand(b, c, h, w)
        return padded.gather(2, rows).gather(3, cols)

    def _rotate(self, x: Tensor) -> Tensor:
        angle = (torch.rand(x.shape[0]) * 2 - 1) * math.radians(self.rotate)
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        theta = torch.stack([cos, -sin, zero, sin, cos, zero], dim=1).view(-1, 2, 3)
        grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


class SampleList(Sequence):
    """One fetched batch seen as a sequence of ``(image, label)`` samples, built lazily.

    ``default_collate`` stacks the samples again (so any ``DataLoader`` works); :func:`collate`
    returns the already stacked tensors ``(x, y)`` and skips that copy.
    """

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        return self.x[i], self.y[i]

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return zip(self.x.unbind(0), self.y.unbind(0))


def collate(batch: Sequence) -> object:
    """Collate function: batched tensors from :class:`SampleList`, else ``default_collate``."""
    if isinstance(batch, SampleList):
        return batch.x, batch.y
    return default_collate(batch)


class InMemoryImageDataset(Dataset):
    """Images held as one uint8 tensor, returned normalised (and optionally augmented).

    ``dataset[i]`` gives ``(image, label)`` with ``image`` float32 of shape (C, H, W). A
    ``DataLoader`` fetches whole batches through ``__getitems__`` (one indexing op, batched
    augmentation); with ``collate_fn=collate`` it also skips re-stacking the samples.

    Args:
        images: uint8 tensor (N, C, H, W) of raw pixels.
        labels: int64 tensor (N,).
        mean: per-channel mean of the pixels scaled to [0, 1].
        std: per-channel standard deviation of the pixels scaled to [0, 1].
        augment: augmentation applied to raw pixels before normalisation; ``None`` for none.
        indices: optional subset (into ``images``) this dataset exposes, in this order.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        augment: BatchAugment | None = None,
        indices: Tensor | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError("images must be uint8 (N, C, H, W) with one label per image")
        self.images = images
        self.labels = labels
        self.indices = torch.arange(len(images)) if indices is None else indices.long()
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        # (pixel / 255 - mean) / std == pixel * scale + shift
        self._scale = 1.0 / (255.0 * self.std)
        self._shift = -self.mean / self.std
        self.augment = augment if augment is not None and augment.active else None

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, idx: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(images, labels)`` at positions ``idx``, stacked: (B, C, H, W), (B,)."""
        rows = self.indices[torch.as_tensor(idx, dtype=torch.long)]
        x = self.images[rows].float()
        if self.augment is not None:
            x = self.augment(x)  # on raw pixels: padding and fill are black, as in torchvision
        return torch.addcmul(self._shift, x, self._scale), self.labels[rows]

    def __getitems__(self, idx: Sequence[int]) -> SampleList:
        return SampleList(*self.batch(idx))

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x, y = self.batch([i])
        return x[0], y[0]

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All samples at once, in order, as ``(images, labels)`` (augmented if enabled)."""
        return self.batch(torch.arange(len(self)))
