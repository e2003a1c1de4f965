"""Small building blocks: activation and normalisation factories."""

from __future__ import annotations

from typing import Literal

from torch import nn

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
