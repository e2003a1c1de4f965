"""N networks of one architecture as one stacked, vectorised network (``torch.func``).

The members' parameters and buffers are stacked along a new leading dimension
(``torch.func.stack_module_state``'s layout) and one forward of all members is
``vmap(functional_call)`` over that dimension. Pure torch: no Lightning.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from lmc.evaluation import stacked_forward as population_forward

Stacked = dict[str, Tensor]

# Optimizers whose update of every parameter element depends only on that element's gradient,
# its own state and scalar hyper-parameters: over stacked parameters, member k's update is its
# sequential update. Factored or norm-based ones (Adafactor, LBFGS, LARS/LAMB) are not.
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Rprop,
)


def check_vectorizable(net: nn.Module, example: Tensor) -> None:
    """Refuse a network that N-member vectorised training cannot reproduce.

    Every layer is run under ``vmap`` on ``example`` (a few inputs, two stacked copies of the
    network's state, in training mode, no gradient), and a layer that fails is named. BatchNorm vectorises: each
    member's running statistics are its own slice of the stacked buffers, updated in place by
    its own batch (in float64 the members equal their sequential twins to rounding; tested); a
    BatchNorm with ``momentum=None`` (a cumulative average, which reads its step count with
    ``.item()``) does not, and is named by this probe.

    Raises:
        ValueError: names the offending layer and says to train the members as separate runs.
    """
    entered: list[str] = []
    with ExitStack() as stack:
        stack.callback(net.train, net.training)
        net.train()  # where BatchNorm updates its running statistics
        for name, module in net.named_modules():
            if name and not list(module.children()):
                hook = module.register_forward_pre_hook(
                    lambda _m, _a, name=name: entered.append(name)
                )
                stack.callback(hook.remove)
        params, buffers = stack_states([net, net])
        try:
            with torch.no_grad():
                population_forward(net, params, buffers, example, shared_input=True)
        except Exception as err:
            where = f"layer {entered[-1]!r}" if entered else "its forward"
            raise ValueError(
                f"{type(net).__name__} cannot be vectorised over population members "
                f"(torch.func.vmap failed in {where}: {str(err).splitlines()[0]}); train the "
                "members as separate runs"
            ) from None


def stack_states(nets: Sequence[nn.Module]) -> tuple[Stacked, Stacked]:
    """Members' parameters and buffers stacked along dim 0, as fresh leaf tensors.

    A parameter keeps its ``requires_grad`` (e.g. the fixed output weights of 003's student).
    """
    names = [n for n, _ in nets[0].named_parameters()]
    params = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in nets]).requires_grad_(
            dict(nets[0].named_parameters())[n].requires_grad
        )
        for n in names
    }
    buffers = {
        n: torch.stack([dict(m.named_buffers())[n] for m in nets])
        for n, _ in nets[0].named_buffers()
    }
    return params, buffers


def member_state(params: Stacked, buffers: Stacked, k: int) -> dict[str, Tensor]:
    """Member ``k``'s ``state_dict`` (parameters and buffers), detached copies."""
    return {n: t[k].detach().clone() for n, t in {**params, **buffers}.items()}


def population_losses(
    loss: Callable[[Tensor, Tensor], Tensor],
    outputs: Tensor,
    targets: Tensor,
    shared_target: bool = False,
) -> Tensor:
    """Each member's loss, shape (N,), from outputs (N, B, ...) and targets (N, B, ...), or
    (B, ...) given to every member when ``shared_target``."""
    return vmap(loss, in_dims=(0, None if shared_target else 0))(outputs, targets)


def optimizer_slots(optimizer: torch.optim.Optimizer) -> int:
    """State tensors the optimizer keeps per parameter element (momentum, moments)."""
    group = optimizer.param_groups[0]
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if group.get("momentum", 0) else 0
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 3 if group.get("amsgrad") else 2
    return 2


def available_memory(device: torch.device) -> int:
    """Bytes free for the population: free GPU memory, else the host's available RAM."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def activation_numel(net: nn.Module, example: Tensor) -> int:
    """Elements of every leaf layer's output for one forward of ``example`` (kept for backward),
    run in eval mode so that the network's own state (BatchNorm's statistics) is not touched."""
    total = 0

    def count(_m: nn.Module, _a: Any, out: Any) -> None:
        nonlocal total
        if isinstance(out, Tensor):
            total += out.numel()

    hooks = [m.register_forward_hook(count) for m in net.modules() if not list(m.children())]
    was_training = net.training
    try:
        with torch.no_grad():
            net.eval()(example)  # the same shapes, and BatchNorm's statistics left as they are
    finally:
        net.train(was_training)
        for h in hooks:
            h.remove()
    return total


def estimate_bytes(
    net: nn.Module, members: int, slots: int, example: Tensor, batch_size: int
) -> int:
    """Bytes of N members' training: parameters x N x (the member's own network + its stacked
    copy + gradient + optimizer slots) x 4, plus every layer's activations of a batch of
    ``batch_size`` per member (x 2, for the backward)."""
    params = sum(p.numel() for p in net.parameters())
    acts = activation_numel(net, example[:1]) * batch_size
    return 4 * members * (params * (3 + slots) + 2 * acts)


def check_fits(
    per_member: int, limit: int, members: int, device: torch.device, with_activations: bool = True
) -> None:
    """Refuse a population of ``members`` whose estimated memory (``per_member`` bytes each,
    :func:`estimate_bytes` of one; ``with_activations=False``: the parameters' part alone, a
    lower bound) exceeds what ``device`` has free, naming the largest population that fits."""
    estimate = per_member * members
    if estimate > limit:
        gib = 2**30
        fits = limit // max(per_member, 1)
        # the parameters alone bound the population from above only: no number of members to
        # split into that the full estimate (activations too) would then refuse again
        fit = (
            f"at most {fits} member(s) fit; split --population into runs of at most "
            f"{max(fits, 1)} seeds"
            if with_activations
            else f"fewer than {fits + 1} member(s) fit (activations, counted once the first "
            "member is built, lower that further); split --population into smaller runs"
        )
        raise MemoryError(
            f"a population of {members} members needs "
            f"{'about' if with_activations else 'at least'} {estimate / gib:.2f} GiB "
            f"(parameters x members x (network + stacked copy + gradient + optimizer slots) x 4 "
            f"bytes{' + activations' if with_activations else ''}) but {device} has "
            f"{limit / gib:.2f} GiB free: {fit} or use a larger device"
        )


def member_optimizer_state(
    state: dict[str, Any], params: Sequence[Tensor], k: int
) -> dict[str, Any]:
    """Member ``k``'s slice of a stacked optimizer's ``state_dict``: per-element state tensors
    shaped like their stacked parameter are indexed at ``k``; scalars (``step``) are kept."""
    out = copy.deepcopy({"param_groups": state["param_groups"]})
    out["state"] = {
        i: {
            key: (
                v[k].clone()
                if isinstance(v, Tensor) and v.ndim >= 1 and v.shape == params[i].shape
                else v.clone()
                if isinstance(v, Tensor)
                else v
            )
            for key, v in s.items()
        }
        for i, s in state["state"].items()
    }
    return out
