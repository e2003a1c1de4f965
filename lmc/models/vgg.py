"""VGG-11/16 for 28x28 or 32x32 images (000 §4, 004 App. B.1), with a width multiplier."""

from __future__ import annotations

from typing import Literal

from torch import nn

from lmc.models.init import InitScheme, ResettableMixin
from lmc.models.layers import Norm, PooledConvNet, make_norm2d

VGG_CONFIGS: dict[int, list[int | str]] = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(ResettableMixin, PooledConvNet):
    """VGG with 3x3 convs, optional norm, ReLU and 2x2 max-pools, then one linear classifier.

    ``features`` is an ``nn.Sequential`` of conv / norm / ReLU / pool modules; the classifier is
    ``classifier``. Pools use ``ceil_mode`` so both 32x32 (CIFAR) and 28x28 (MNIST) inputs reach a
    1x1 map after the five pools. Convs carry a bias only when ``norm="none"``.

    Args:
        depth: 11 or 16.
        width: channel multiplier (4 gives the 004 VGG-11 x4).
        norm: ``batch`` (BatchNorm), ``layer`` (LayerNorm over C,H,W) or ``none``.
        in_channels: 1 for MNIST/Fashion-MNIST, 3 for CIFAR.
        num_classes: classifier outputs.
        init: weight initialisation scheme; ``init_scale`` multiplies its standard deviation.
    """

    def __init__(
        self,
        depth: Literal[11, 16] = 11,
        width: float = 1.0,
        norm: Norm = "batch",
        in_channels: int = 3,
        num_classes: int = 10,
        init: InitScheme = "default",
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if depth not in VGG_CONFIGS:
            raise ValueError(f"VGG depth must be one of {sorted(VGG_CONFIGS)}, got {depth}")
        if width <= 0:
            raise ValueError(f"VGG width multiplier must be positive, got {width}")
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG_CONFIGS[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
                continue
            out = max(1, int(round(int(item) * width)))
            layers.append(nn.Conv2d(channels, out, 3, padding=1, bias=norm == "none"))
            layers.append(make_norm2d(norm, out))
            layers.append(nn.ReLU())
            channels = out
        self._finish(layers, channels, num_classes, init, init_scale)
