"""CIFAR ResNet-20/32 (He et al. 2016; 002 §4, 004 App. B.1) with a width multiplier."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from lmc.models.init import InitScheme, ResettableMixin, init_weights
from lmc.models.layers import make_norm2d

ResNetNorm = Literal["batch", "layer"]


class BasicBlock(nn.Module):
    """conv-norm-ReLU-conv-norm plus a shortcut, then ReLU.

    The shortcut is a 1x1 conv + norm (``shortcut.0``, ``shortcut.1``) whenever the stride or
    channel count changes, else the identity (an empty ``nn.Sequential``).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = make_norm2d(norm, out_ch)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = make_norm2d(norm, out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), make_norm2d(norm, out_ch)
            )
        self.act2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(out + self.shortcut(x))


class ResNet(ResettableMixin, nn.Module):
    """ResNet-(6n+2) for small images: a stem, three stages of ``n`` blocks, global pool, linear.

    Stage widths are 16, 32, 64 times ``width`` (16 gives the 004 ResNet-20 x16). Every block of a
    stage adds into one residual stream, so a permutation of that stream is shared by the stem (or
    the previous stage's shortcut), all blocks' second norms and the stage's shortcut conv/norm.

    Args:
        depth: 20 or 32 (any 6n+2 works).
        width: channel multiplier.
        norm: ``batch`` or ``layer``.
        in_channels: image channels.
        num_classes: classifier outputs.
        init: weight initialisation scheme; ``init_scale`` multiplies its standard deviation.
    """

    def __init__(
        self,
        depth: int = 20,
        width: float = 1.0,
        norm: ResNetNorm = "batch",
        in_channels: int = 3,
        num_classes: int = 10,
        init: InitScheme = "default",
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"ResNet depth must be 6n+2 (20, 32, ...), got {depth}")
        if norm not in ("batch", "layer"):
            raise ValueError(f"ResNet norm must be 'batch' or 'layer', got {norm!r}")
        n = (depth - 2) // 6
        widths = [max(1, int(round(c * width))) for c in (16, 32, 64)]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = make_norm2d(norm, widths[0])
        self.act = nn.ReLU()
        stages = []
        in_ch = widths[0]
        for i, out_ch in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(in_ch, out_ch, 2 if (i > 0 and j == 0) else 1, norm))
                in_ch = out_ch
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(widths[-1], num_classes)
        self.init_scheme, self.init_scale = init, init_scale
        init_weights(self, init, init_scale)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.linear(self.flatten(self.pool(x)))
