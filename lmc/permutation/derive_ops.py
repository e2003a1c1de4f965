"""Which operations :func:`~lmc.permutation.derive_spec` passes a permutation through
unchanged: activations, dropout, pooling and other elementwise modules, functions and tensor
methods, and the binary operations that broadcast (their operands' permuted axes merge)."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
    nn.Tanhshrink, nn.LogSigmoid,
)  # fmt: skip
PASS_MODULES = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout, nn.Upsample,
    nn.Softmax, nn.LogSoftmax,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
)  # fmt: skip
ELEMENTWISE_FUNCTIONS = {
    F.relu, F.relu6, F.leaky_relu, F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.softplus,
    F.hardtanh, F.hardswish, F.hardsigmoid, F.dropout, F.dropout1d, F.dropout2d, F.sigmoid,
    F.tanh, torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu_,
    F.max_pool1d, F.max_pool2d, F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d, F.adaptive_max_pool1d, F.adaptive_max_pool2d, torch.clone,
    torch.exp, torch.log, torch.abs, torch.sqrt, torch.rsqrt, torch.square, operator.neg,
    torch.clamp, torch.clip,
    # along the features' axis they sum over all features, along any other each feature alone:
    # either way a permutation of the features permutes the result the same way
    F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, F.normalize,
    F.interpolate, F.upsample,  # the spatial axes (a parameter resized is not a feature)
}  # fmt: skip
ELEMENTWISE_NAMES = {"stochastic_depth"}  # torchvision.ops (fx-wrapped): scales whole samples
BINARY_FUNCTIONS = {
    operator.add, operator.iadd, operator.sub, operator.isub, operator.mul, operator.imul,
    operator.truediv, operator.itruediv, torch.add, torch.sub, torch.mul, torch.div,
    operator.pow, torch.pow,
}  # fmt: skip
ELEMENTWISE_METHODS = {
    "relu", "relu_", "sigmoid", "tanh", "clone", "contiguous", "detach", "float", "to",
    "exp", "log", "abs", "sqrt", "rsqrt", "square", "neg", "sigmoid_", "tanh_", "half",
    "softmax", "log_softmax", "type_as", "clamp", "clamp_min", "clamp_max", "clip",
}  # fmt: skip
BINARY_METHODS = {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow"}
