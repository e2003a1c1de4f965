"""Plain ``nn.Module`` architectures (no Lightning): MLP, VGG, ResNet, TinyTen, two-layer ReLU."""

from lmc.models.init import init_weights, reinitialize
from lmc.models.mlp import MLP, TwoLayerReLU
from lmc.models.resnet import ResNet
from lmc.models.tinyten import TinyTen
from lmc.models.vgg import VGG

__all__ = ["MLP", "VGG", "ResNet", "TinyTen", "TwoLayerReLU", "init_weights", "reinitialize"]
