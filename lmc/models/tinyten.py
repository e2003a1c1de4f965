"""TinyTen (Kornblith et al. 2019), the narrow 10-layer CNN of 002 §4 (about 0.09M parameters)."""

from __future__ import annotations

from torch import nn

from lmc.models.init import InitScheme, ResettableMixin
from lmc.models.layers import Norm, PooledConvNet, make_norm2d

# (out channels, kernel, stride, padding) of the eight conv layers; the logits layer is the tenth
# weight layer after global average pooling.
TINYTEN_LAYERS = [
    (16, 3, 1, 1),
    (16, 3, 1, 1),
    (32, 3, 2, 1),
    (32, 3, 1, 1),
    (32, 3, 1, 1),
    (64, 3, 2, 1),
    (64, 3, 1, 0),
    (64, 1, 1, 0),
]


class TinyTen(ResettableMixin, PooledConvNet):
    """Eight conv-norm-ReLU layers, global average pooling and a linear classifier.

    ``features`` is an ``nn.Sequential`` of conv / norm / ReLU triples; ``classifier`` the logits.
    ``width`` multiplies every channel count.
    """

    def __init__(
        self,
        width: float = 1.0,
        norm: Norm = "batch",
        in_channels: int = 3,
        num_classes: int = 10,
        init: InitScheme = "default",
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out, k, s, p in TINYTEN_LAYERS:
            out = max(1, int(round(out * width)))
            layers += [
                nn.Conv2d(channels, out, k, stride=s, padding=p, bias=norm == "none"),
                make_norm2d(norm, out),
                nn.ReLU(),
            ]
            channels = out
        self._finish(layers, channels, num_classes, init, init_scale)
