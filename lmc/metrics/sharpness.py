"""Loss sharpness tr(H ⊙ θθᵀ) and tr(H) by Hutchinson's estimator (004 §6.2, eq. 6, App. D.2).

For the Hessian H of the loss at parameters θ and a Rademacher vector z (entries ±1),

    tr(H ⊙ θθᵀ) = tr(diag(θ) H diag(θ)) = E_z[(z ⊙ θ)ᵀ H (z ⊙ θ)]        (004 eq. 6, D.2)

and tr(H) = E_z[zᵀ H z]. Each term is one Hessian-vector product (autograd double backward).
The loss is the size-weighted mean of ``loss_fn(model(x), y)`` over the caller's fixed
``batches``, so methods are compared on equal terms when they share batches, probe count and
seed. The model is evaluated in ``eval()`` mode (BatchNorm running statistics, no dropout).
Parameters are those with ``requires_grad``; under ``torch.nn.utils.prune`` that is
``weight_orig``, whose masked entries have zero Hessian rows and so add nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

LossFn = Callable[[Tensor, Tensor], Tensor]
Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class TraceEstimate:
    """A Hutchinson estimate: the probe mean, its standard error and the per-probe values."""

    mean: float
    stderr: float
    values: Tensor

    @property
    def num_probes(self) -> int:
        return int(self.values.numel())


def _params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no parameter with requires_grad=True")
    return params


def _weights(batches: Sequence[Batch]) -> list[float]:
    if not batches:
        raise ValueError("need at least one (x, y) batch to define the loss")
    sizes = [len(x) for x, _ in batches]
    total = sum(sizes)
    return [s / total for s in sizes]


def rademacher_probe(num_params: int, generator: torch.Generator) -> Tensor:
    """One Rademacher vector (±1, float32, CPU) drawn from ``generator``; probes are drawn in turn."""
    return torch.randint(0, 2, (num_params,), generator=generator).float().mul_(2).sub_(1)


def _probes(
    params: Sequence[Tensor], num_probes: int, seed: int, weighted: bool
) -> Iterator[list[Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = [p.numel() for p in params]
    for _ in range(num_probes):
        z = rademacher_probe(sum(sizes), gen).split(sizes)
        vs = [zi.to(p.device, p.dtype).view_as(p) for zi, p in zip(z, params)]
        yield [v * p.detach() for v, p in zip(vs, params)] if weighted else vs


def _dot(a: Sequence[Tensor | None], b: Sequence[Tensor]) -> Tensor | int:
    """``<a, b>`` over the entries of ``a`` that are not ``None`` (0 if there are none)."""
    return sum((x * y).sum() for x, y in zip(a, b) if x is not None)


def hutchinson_traces(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Batch],
    num_probes: int = 10,
    seed: int = 0,
    kinds: Sequence[str] = ("weighted", "plain"),
) -> dict[str, TraceEstimate]:
    """Hutchinson estimates of tr(H ⊙ θθᵀ) (``weighted``) and/or tr(H) (``plain``), 004 eq. 6.

    Both kinds use the same ``num_probes`` Rademacher vectors, drawn in turn by
    :func:`rademacher_probe` from a generator seeded with ``seed``. Each batch's gradient graph
    is built once and reused for every probe.

    Args:
        model: the network; its parameters with ``requires_grad`` span H.
        loss_fn: ``loss_fn(model(x), y)``, a mean over the batch.
        batches: the fixed data subset as (x, y) pairs on the model's device.
        num_probes: Rademacher probes per estimate (the standard error needs >= 2).
        seed: seed of the probes.
        kinds: which traces to estimate.

    Returns:
        ``{kind: TraceEstimate}``; ``stderr`` is the sample std over probes / sqrt(num_probes).
    """
    if num_probes < 1:
        raise ValueError(f"num_probes must be >= 1, got {num_probes}")
    unknown = set(kinds) - {"weighted", "plain"}
    if unknown or not kinds:
        raise ValueError(f"kinds must be drawn from ('weighted', 'plain'), got {kinds}")
    params = [p for _, p in _params(model)]
    weights = _weights(batches)
    values = {k: torch.zeros(num_probes, dtype=torch.float64) for k in kinds}
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for (x, y), w in zip(batches, weights):
                loss = loss_fn(model(x), y) * w
                grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
                for kind in kinds:
                    for j, v in enumerate(_probes(params, num_probes, seed, kind == "weighted")):
                        gv = _dot(grads, v)
                        if not isinstance(gv, Tensor) or not gv.requires_grad:
                            continue  # the loss is at most linear in θ here: no curvature
                        hv = torch.autograd.grad(gv, params, retain_graph=True, allow_unused=True)
                        values[kind][j] += float(_dot(hv, v))
    finally:
        model.train(was_training)
    out = {}
    for kind, vals in values.items():
        se = float(vals.std() / math.sqrt(num_probes)) if num_probes > 1 else float("nan")
        out[kind] = TraceEstimate(float(vals.mean()), se, vals)
    return out


def hutchinson_trace(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Batch],
    num_probes: int = 10,
    seed: int = 0,
    weighted: bool = True,
) -> TraceEstimate:
    """One Hutchinson estimate: tr(H ⊙ θθᵀ) when ``weighted`` (004 eq. 6), else tr(H)."""
    kind = "weighted" if weighted else "plain"
    return hutchinson_traces(model, loss_fn, batches, num_probes, seed, (kind,))[kind]


def hessian_matrix(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], max_params: int = 5000
) -> tuple[Tensor, Tensor]:
    """The exact Hessian H (P × P) of the same loss and the flat parameter vector θ.

    Reference for tiny models only (``torch.autograd.functional.hessian``); the parameter order
    is that of ``model.named_parameters()`` restricted to ``requires_grad``.
    """
    named = _params(model)
    names = [n for n, _ in named]
    shapes = [p.shape for _, p in named]
    theta = torch.cat([p.detach().reshape(-1) for _, p in named])
    if theta.numel() > max_params:
        raise ValueError(
            f"{theta.numel()} parameters exceed max_params={max_params}: the exact Hessian is "
            "for tiny reference models; use hutchinson_traces for real networks"
        )
    weights = _weights(batches)

    def loss_of(flat: Tensor) -> Tensor:
        chunks = flat.split([math.prod(s) for s in shapes])
        state = {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}
        total = sum(
            w * loss_fn(functional_call(model, state, (x,)), y)
            for (x, y), w in zip(batches, weights)
        )
        assert isinstance(total, Tensor)  # batches is not empty (_weights checked)
        return total

    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            hess = torch.autograd.functional.hessian(loss_of, theta)
    finally:
        model.train(was_training)
    return hess, theta


def exact_hessian_trace(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], weighted: bool = True
) -> float:
    """tr(H ⊙ θθᵀ) = Σ_i H_ii θ_i² (``weighted``) or tr(H), from :func:`hessian_matrix`."""
    hess, theta = hessian_matrix(model, loss_fn, batches)
    diag = hess.diagonal()
    return float((diag * theta**2).sum() if weighted else diag.sum())
