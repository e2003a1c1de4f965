"""Plain ``nn.Module`` architectures (no Lightning): MLP, VGG, ResNet, TinyTen, two-layer ReLU,
and MultiHead (several networks answering as one)."""

from lmc.models.init import init_weights, reinitialize
from lmc.models.mlp import MLP, TwoLayerReLU
from lmc.models.multihead import MultiHead
from lmc.models.resnet import ResNet
from lmc.models.tinyten import TinyTen
from lmc.models.vgg import VGG

__all__ = [
    "MLP",
    "VGG",
    "MultiHead",
    "ResNet",
    "TinyTen",
    "TwoLayerReLU",
    "init_weights",
    "reinitialize",
]
