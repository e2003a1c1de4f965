"""Linear interpolation and weighted averages of full model states (parameters and buffers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

StateDict = Mapping[str, Tensor]


def check_compatible(states: Sequence[StateDict], names: Sequence[str] | None = None) -> None:
    """Raise ``ValueError`` naming the first key whose presence or shape differs between states."""
    names = list(names) if names is not None else [f"model {i}" for i in range(len(states))]
    ref, ref_name = states[0], names[0]
    for state, name in zip(states[1:], names[1:]):
        missing = sorted(set(ref) - set(state))
        extra = sorted(set(state) - set(ref))
        if missing or extra:
            raise ValueError(
                f"{name} and {ref_name} are different architectures: keys only in {ref_name}: "
                f"{missing[:5]}, only in {name}: {extra[:5]}. Use checkpoints of the same network."
            )
        for key, value in ref.items():
            if state[key].shape != value.shape:
                raise ValueError(
                    f"{name} and {ref_name} differ at '{key}': shape {tuple(state[key].shape)} vs "
                    f"{tuple(value.shape)}. Use checkpoints of the same network (same width/depth)."
                )


def lerp_state(a: StateDict, b: StateDict, alpha: float) -> dict[str, Tensor]:
    """The state ``(1 - alpha) * a + alpha * b``; ``alpha = 0`` is ``a``, ``alpha = 1`` is ``b``.

    Floating-point entries (parameters, BatchNorm running statistics) are interpolated; integer
    buffers such as ``num_batches_tracked`` are taken from ``a``. This is the path of the loss
    barrier of 000 Def. 2.1 (with that paper's alpha being ``1 - alpha`` here).
    """
    return {
        k: torch.lerp(v, b[k], alpha) if v.is_floating_point() else v.clone() for k, v in a.items()
    }


def weighted_average(
    states: Sequence[StateDict], weights: Sequence[float] | None = None
) -> dict[str, Tensor]:
    """``sum_i w_i * state_i`` over floating-point entries (uniform weights by default)."""
    if len(states) == 0:
        raise ValueError("weighted_average needs at least one state")
    n = len(states)
    w = [1.0 / n] * n if weights is None else [float(x) for x in weights]
    if len(w) != n:
        raise ValueError(f"got {n} states but {len(w)} weights")
    out: dict[str, Tensor] = {}
    for key, value in states[0].items():
        if value.is_floating_point():
            acc = value * w[0]
            for wi, s in zip(w[1:], states[1:]):
                acc.add_(s[key], alpha=wi)
            out[key] = acc
        else:
            out[key] = value.clone()
    return out


@torch.no_grad()
def load_lerp_(model: nn.Module, a: StateDict, b: StateDict, alpha: float) -> nn.Module:
    """Write ``lerp_state(a, b, alpha)`` into ``model`` in place (no copy of the model).

    ``a`` and ``b`` must hold the model's full state dict; this is what evaluation along a path
    uses instead of a per-point ``deepcopy``.
    """
    target = model.state_dict(keep_vars=True)
    for key, dest in target.items():
        if dest.is_floating_point():
            torch.lerp(a[key].to(dest.device), b[key].to(dest.device), alpha, out=dest.data)
        else:
            dest.data.copy_(a[key])
    return model
