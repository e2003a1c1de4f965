"""Small building blocks: activation and normalisation factories."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from lmc.models.init import InitScheme, init_weights

Activation = Literal["relu", "gelu", "tanh", "sigmoid", "leaky_relu", "identity"]
Norm = Literal["batch", "layer", "none"]

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "leaky_relu": nn.LeakyReLU,
    "identity": nn.Identity,
}


def make_activation(name: str) -> nn.Module:
    """Return a fresh elementwise activation module by name."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; use one of {', '.join(_ACTIVATIONS)}"
        ) from None


def make_norm2d(norm: str, channels: int) -> nn.Module:
    """Per-channel normalisation for conv features.

    ``layer`` is LayerNorm over (C, H, W) with a per-channel affine map, implemented as
    ``GroupNorm(1, C)`` so that permuting channels permutes its parameters like BatchNorm's.
    """
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "layer":
        return nn.GroupNorm(1, channels)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {norm!r}; use one of batch, layer, none")


def make_norm1d(norm: str, features: int) -> nn.Module:
    """Per-feature normalisation for fully connected layers."""
    if norm == "batch":
        return nn.BatchNorm1d(features)
    if norm == "layer":
        return nn.LayerNorm(features)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {norm!r}; use one of batch, layer, none")


class PooledConvNet(nn.Module):
    """The end shared by the conv nets (VGG, TinyTen): ``features`` (their conv blocks), global
    average pooling and a linear ``classifier``, initialised by the model's scheme."""

    def _finish(
        self,
        layers: list[nn.Module],
        channels: int,
        num_classes: int,
        init: InitScheme,
        scale: float,
    ) -> None:
        """Set the blocks, the pool and the classifier over ``channels`` features, then
        initialise every weight with ``init`` scaled by ``scale``."""
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(channels, num_classes)
        self.init_scheme, self.init_scale = init, scale
        init_weights(self, init, scale)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.flatten(self.pool(self.features(x))))
