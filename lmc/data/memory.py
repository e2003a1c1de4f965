"""In-memory image datasets with per-sample torchvision augmentation (no PIL, no per-item loads).

A whole dataset is held as one uint8 tensor. :class:`InMemoryImageDataset` implements
``__getitems__`` so a ``DataLoader`` fetches a batch with one indexing op, augments it with
:class:`BatchAugment` (random crop with zero padding, horizontal flip, rotation: the CIFAR recipes
of 002 §4 and 004 App. B, as ``torchvision.transforms.v2`` ops) and normalises it. Randomness
comes from torch's global RNG (or the worker's), so ``seed_everything`` fixes it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import grid_sample
from torch.utils.data import Dataset, default_collate
from torchvision.transforms.v2 import functional as TF


def rotate_per_sample(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate each image of ``x`` (B, C, H, W) by its own angle in degrees (counter-clockwise,
    about the centre, nearest, zero fill, same size): ``v2.functional.rotate(x[i], angles[i])``.

    torchvision's rotate kernel builds one sampling grid from one matrix; this builds the same
    grid (``rotate_image``: inverse rotation of pixel-centred coordinates scaled by half the size)
    with one matrix per sample and samples the batch with one ``grid_sample``, so the result
    equals the per-image calls (tested) at a fraction of their Python overhead.
    """
    b, _, h, w = x.shape
    rad = torch.deg2rad(angles.double().to(x.device))
    cos, sin = rad.cos().float(), rad.sin().float()
    zero = torch.zeros(b, device=x.device)
    theta = torch.stack([cos, -sin, zero, sin, cos, zero], dim=1).view(b, 2, 3)
    base = torch.empty(1, h, w, 3, device=x.device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], device=x.device)
    grid = base.view(1, h * w, 3).expand(b, -1, -1).bmm(scaled).view(b, h, w, 2)
    out = grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out if x.is_floating_point() else out.round_().to(x.dtype)


@dataclass(frozen=True)
class BatchAugment:
    """Random augmentation of an image batch, drawn independently for every sample.

    A ``torchvision.transforms.v2`` transform called on a (B, C, H, W) batch draws one parameter
    set for the whole batch. Here the parameters are drawn per sample, in one call each from
    torch's global RNG, with the distributions of the v2 transforms named below, and applied with
    ``torchvision.transforms.v2.functional`` ops: zero padding of the whole batch, then one
    crop per sample (one gather, equal to ``crop`` of each image), ``horizontal_flip`` of the
    whole batch kept where a sample's coin says so; rotation by :func:`rotate_per_sample`
    (torchvision's ``rotate``, batched). The parameters are drawn on the CPU and applied on the
    images' device, so a batch augmented on a GPU equals the same batch augmented on the CPU.

    Args:
        crop_padding: zero-pad each side by this many pixels, then crop back to the original
            size at a random offset (``v2.RandomCrop(size, padding=crop_padding)``).
        flip: flip horizontally with probability 1/2 (``v2.RandomHorizontalFlip()``).
        rotate: rotate by an angle drawn uniformly from [-rotate, rotate] degrees, nearest
            interpolation, zero fill (``v2.RandomRotation(rotate)``; 002 §4). Applied first.
    """

    crop_padding: int = 0
    flip: bool = False
    rotate: float = 0.0

    @property
    def active(self) -> bool:
        """Whether this augmentation changes anything."""
        return self.crop_padding > 0 or self.flip or self.rotate > 0

    def __call__(self, x: Tensor) -> Tensor:
        """Augment images ``x`` of shape (B, C, H, W), uint8 or float; padding and fill are 0."""
        if len(x) == 0:
            return x
        if self.rotate > 0:
            x = rotate_per_sample(x, torch.empty(len(x)).uniform_(-self.rotate, self.rotate))
        if self.crop_padding > 0:
            p, (h, w), dev = self.crop_padding, x.shape[-2:], x.device
            padded = TF.pad(x, [p], fill=0)
            tops, lefts = torch.randint(0, 2 * p + 1, (2, len(x))).to(dev)
            # one gather: sample i's crop is padded[i, :, tops[i]:tops[i]+h, lefts[i]:lefts[i]+w]
            rows = (tops[:, None] + torch.arange(h, device=dev))[:, None, :, None]
            cols = (lefts[:, None] + torch.arange(w, device=dev))[:, None, None, :]
            batch = torch.arange(len(x), device=dev)[:, None, None, None]
            chans = torch.arange(x.shape[1], device=dev)[None, :, None, None]
            x = padded[batch, chans, rows, cols]
        if self.flip:
            coin = (torch.rand(len(x)) < 0.5).to(x.device)
            x = torch.where(coin[:, None, None, None], TF.horizontal_flip(x), x)
        return x


class SampleList(Sequence):
    """One fetched batch seen as a sequence of ``(image, label)`` samples, built lazily.

    ``default_collate`` stacks the samples again (so any ``DataLoader`` works); :func:`collate`
    returns the already stacked tensors ``(x, y)`` and skips that copy.
    """

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int | slice) -> tuple[Tensor, Tensor]:
        """Sample ``i``; a slice gives the ``(x, y)`` slices."""
        return self.x[i], self.y[i]

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return zip(self.x.unbind(0), self.y.unbind(0))


def collate(batch: Sequence) -> object:
    """Collate function: batched tensors from :class:`SampleList`, else ``default_collate``."""
    if isinstance(batch, SampleList):
        return batch.x, batch.y
    return default_collate(batch)  # type: ignore[arg-type]  # torch says list; any sequence works


class InMemoryImageDataset(Dataset):
    """Images held as one uint8 tensor, returned normalised (and optionally augmented).

    ``dataset[i]`` gives ``(image, label)`` with ``image`` float32 of shape (C, H, W). A
    ``DataLoader`` fetches whole batches through ``__getitems__`` (one indexing op, per-sample
    augmentation of the batch); with ``collate_fn=collate`` it also skips re-stacking the samples.

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
        self._normalized: Tensor | None = None  # without augmentation: the subset, normalised
        self._labels: Tensor | None = None  # and its labels

    def __len__(self) -> int:
        return len(self.indices)

    def subset(self, positions: Tensor) -> InMemoryImageDataset:
        """The examples at ``positions`` (indices or a mask) of this dataset's order: the same
        images, labels, normalisation and augmentation, held once."""
        mean, std = self.mean.flatten().tolist(), self.std.flatten().tolist()
        return InMemoryImageDataset(
            self.images, self.labels, mean, std, self.augment, self.indices[positions]
        )

    def batch(self, idx: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(images, labels)`` at positions ``idx``, stacked: (B, C, H, W), (B,).

        Without augmentation the subset is normalised once, on first use, and batches are
        gathered from it (the same values: normalisation is elementwise); with augmentation
        every batch is augmented on raw uint8 pixels (padding and fill black, as in
        torchvision), then normalised."""
        # index_select, not ``t[pos]``: the same rows, ~3x faster on the CPU (a row copy instead
        # of TensorIterator's per-element gather) and less host work a batch on a GPU (issue 30)
        pos = torch.as_tensor(idx, dtype=torch.long, device=self.indices.device)
        if self.augment is None:
            if self._normalized is None:
                self._normalized = self._normalize(self.images.index_select(0, self.indices))
                self._labels = self.labels.index_select(0, self.indices)
            assert self._labels is not None  # set with _normalized
            return self._normalized.index_select(0, pos), self._labels.index_select(0, pos)
        rows = self.indices.index_select(0, pos)
        images = self.images.index_select(0, rows)
        return self._normalize(self.augment(images)), self.labels.index_select(0, rows)

    def _normalize(self, x: Tensor) -> Tensor:
        return torch.addcmul(self._shift, x.float(), self._scale)

    def to(self, device: torch.device | str) -> InMemoryImageDataset:
        """This dataset with its pixels, labels and indices on ``device`` (itself if there)."""
        device = torch.device(device)
        if self.images.device == device:
            return self
        out = copy.copy(self)
        for name in ("images", "labels", "indices", "mean", "std", "_scale", "_shift"):
            setattr(out, name, getattr(self, name).to(device))
        out._normalized = out._labels = None  # gathered again on the device, when first used
        return out

    def __getitems__(self, idx: Sequence[int]) -> SampleList:
        return SampleList(*self.batch(idx))

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} is out of range for a dataset of {len(self)} samples")
        x, y = self.batch([i % len(self)])
        return x[0], y[0]

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All samples at once, in order, as ``(images, labels)`` (augmented if enabled)."""
        return self.batch(torch.arange(len(self)))
