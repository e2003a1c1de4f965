"""Fully connected networks (000 §4, 003 §6, 004 App. B.1) and the two-layer ReLU student (003 §2)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from lmc.models.init import InitScheme, ResettableMixin, init_weights, sample_minimum
from lmc.models.layers import Activation, Norm, make_activation, make_norm1d


class MLP(ResettableMixin, nn.Module):
    """Multi-layer perceptron: ``depth`` hidden layers of ``width`` units.

    Inputs of any shape are flattened. Hidden layer ``i`` is ``layers.i`` (Linear), followed by
    ``norms.i`` (identity when ``norm="none"``) and ``acts.i``; the output layer is ``head``.
    ``MLP(784, 10, width=512, depth=3)`` is the 004 App. B.1 MNIST network.

    Args:
        in_features: input dimension after flattening (784 for MNIST).
        out_features: number of outputs (classes, or 1 for regression).
        width: units per hidden layer.
        depth: number of hidden layers (0 gives a linear model).
        activation: elementwise nonlinearity after each hidden layer.
        bias: whether Linear layers carry a bias.
        norm: optional normalisation after each hidden Linear.
        init: weight initialisation scheme (``he_normal`` with ``init_scale=c_d`` is 000 §4.1).
        init_scale: multiplier of the init standard deviation.
    """

    def __init__(
        self,
        in_features: int = 784,
        out_features: int = 10,
        width: int = 512,
        depth: int = 3,
        activation: Activation = "relu",
        bias: bool = True,
        norm: Norm = "none",
        init: InitScheme = "default",
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if width < 1 or depth < 0:
            raise ValueError(
                f"MLP needs width >= 1 and depth >= 0, got width={width}, depth={depth}"
            )
        dims = [in_features] + [width] * depth
        self.flatten = nn.Flatten()
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(make_norm1d(norm, width) for _ in range(depth))
        self.acts = nn.ModuleList(make_activation(activation) for _ in range(depth))
        self.head = nn.Linear(dims[-1], out_features, bias=bias)
        self.init_scheme, self.init_scale = init, init_scale
        init_weights(self, init, init_scale)

    def forward(self, x: Tensor) -> Tensor:
        x = self.flatten(x)
        for layer, norm, act in zip(self.layers, self.norms, self.acts):
            x = act(norm(layer(x)))
        return self.head(x)


class TwoLayerReLU(nn.Module):
    """Two-layer ReLU student f(x) = sum_i a_i relu(w_i . x) of the teacher-student setting (003 §2).

    Row ``i`` of ``hidden.weight`` is student neuron ``w_i``. By default the output weights
    ``a_i`` are fixed at 1 (not trained), as in 003's analysis; set ``train_output=True`` to learn
    them. Initialisation is N(0, init_std^2) per element (003 B.1), or with ``init="manifold"``
    a global minimum drawn uniformly from the manifold of minima for the teacher e_1..e_m
    (``teacher_width`` = m; 003 Assumption 3, Lemma 8, B.1:
    :func:`lmc.models.init.sample_minimum`), which gradient descent leaves where it is: the
    "uniformly sampled solutions" of 003 Figs. 1-3. It needs ``width >= teacher_width``, the
    output weights fixed at 1, no bias, and the data's teacher e_1..e_m (the
    :class:`lmc.data.TeacherStudentDataModule` default).
    """

    def __init__(
        self,
        in_features: int = 10,
        width: int = 20,
        init_std: float = 0.01,
        train_output: bool = False,
        bias: bool = False,
        init: Literal["gaussian", "manifold"] = "gaussian",
        teacher_width: int | None = None,
    ) -> None:
        super().__init__()
        if width < 1 or in_features < 1:
            raise ValueError(
                f"TwoLayerReLU needs width >= 1 and in_features >= 1, got width={width}, "
                f"in_features={in_features}"
            )
        if init not in ("gaussian", "manifold"):
            raise ValueError(f"init must be 'gaussian' or 'manifold', got {init!r}")
        if init == "manifold":
            where = "model.init_args.net.init_args"
            if teacher_width is None:
                raise ValueError(
                    f"init: manifold samples a global minimum of a teacher: set {where}."
                    "teacher_width to the data's teacher_width"
                )
            if not 1 <= teacher_width <= min(width, in_features):
                raise ValueError(
                    f"init: manifold needs 1 <= teacher_width <= width and <= in_features (every "
                    f"teacher neuron gets a student neuron), got teacher_width={teacher_width}, "
                    f"width={width}, in_features={in_features}: set {where}.width >= "
                    "teacher_width"
                )
            if train_output or bias:
                raise ValueError(
                    "init: manifold samples minima of the student with output weights fixed at 1 "
                    f"and no bias: set {where}.train_output=false and {where}.bias=false"
                )
        self.init_std, self.init, self.teacher_width = init_std, init, teacher_width
        self.hidden = nn.Linear(in_features, width, bias=bias)
        self.act = nn.ReLU()
        self.head = nn.Linear(width, 1, bias=False)
        self.head.weight.requires_grad_(train_output)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std^2) student neurons (or a uniform global minimum with ``init="manifold"``),
        zero bias, output weights 1 (003 B.1)."""
        if self.init == "manifold":
            w = self.hidden.weight
            assert self.teacher_width is not None  # checked in __init__ for init="manifold"
            w.copy_(sample_minimum(w.shape[0], self.teacher_width, w.shape[1], dtype=w.dtype))
        else:
            nn.init.normal_(self.hidden.weight, 0.0, self.init_std)
        if self.hidden.bias is not None:
            nn.init.zeros_(self.hidden.bias)
        nn.init.ones_(self.head.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.act(self.hidden(x)))
