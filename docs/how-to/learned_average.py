"""A merge method that trains, added in its own file: a weighted average of the models whose
weights (a softmax over one logit per model) are trained on the training loss."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmc.evaluation import LossName, batch_loss
from lmc.merging import MERGE_METHODS, Merged, MergeInputs, MergeSearch, ModelBank, Progress


class LearnedAverage(MergeSearch):
    lr = 0.05  # Adam's learning rate when the config gives no optimizer

    def __init__(self, net: nn.Module, inputs: MergeInputs, temperature: float) -> None:
        super().__init__()
        object.__setattr__(self, "net", net)  # a template: its own weights are not trained
        self.bank = ModelBank(inputs.states)  # the models, moved with the search
        self.n, self.temperature = len(inputs.states), temperature
        self.logits = nn.Parameter(torch.zeros(self.n))  # the only trained parameters

    def weights(self) -> Tensor:
        return (self.logits / self.temperature).softmax(0)

    def merged(self) -> dict[str, Tensor]:
        w, states = self.weights(), [self.bank.state(i) for i in range(self.n)]
        return {
            k: sum(w[i] * s[k] for i, s in enumerate(states)) if v.is_floating_point() else v
            for k, v in states[0].items()
        }

    def output(self, x: Tensor) -> Tensor:
        return functional_call(self.net, self.merged(), (x,))

    def step_loss(self, x: Tensor, y: Tensor, loss: LossName, progress: Progress) -> Tensor:
        return batch_loss(self.output(x), y, loss) / y.shape[0]

    def result(self) -> Merged:
        with torch.no_grad():
            state = {k: v.detach().clone() for k, v in self.merged().items()}
            return Merged(state, None, {"weight_max": float(self.weights().max())})


@MERGE_METHODS.register(
    "learned_average", trains=True, needs=("net", "train_batches"), paper="an example"
)
def learned_average(inputs: MergeInputs, *, temperature: float = 1.0) -> LearnedAverage:
    """A weighted average of the models, its weights trained on the training loss."""
    return LearnedAverage(inputs.need("net", "learned_average"), inputs, temperature)
