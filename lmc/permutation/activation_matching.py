"""Activation matching and correlation alignment of post-activations (C3).

Both models see the same inputs; forward hooks capture, for every permutation group, the
features at its activation points (``spec.activations``: the ReLU after a layer, or every point
of a residual stream). Per point, running sums over the samples (every spatial position of a
conv map is a sample) give the cross-covariance ``E[a b^T] - E[a] E[b]^T`` and, normalised by
the standard deviations, the Pearson correlation; memory is O(channels^2) per point whatever
the number of batches (002 Alg. 1, streamed). A group's similarity is the sum over its points
(one shared permutation for a residual stream from the summed correlations, 002 App. D), and its
permutation is the assignment maximising the matched similarity, solved per group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lmc.permutation.lap import LapSolver, get_solver
from lmc.permutation.spec import Permutation, PermutationSpec, SpecError, check_same_architecture

Similarity = Literal["correlation", "covariance"]


class CrossStatistics:
    """Streaming first and second moments of paired features ``a, b`` of ``n`` channels.

    Accumulates in float64: count, sums, sums of squares and the cross sum ``sum a b^T``.
    """

    def __init__(self, n: int, device: torch.device | str = "cpu") -> None:
        self.n = n
        self.count = 0
        kw: dict[str, Any] = {"dtype": torch.float64, "device": device}
        self.sum_a = torch.zeros(n, **kw)
        self.sum_b = torch.zeros(n, **kw)
        self.sq_a = torch.zeros(n, **kw)
        self.sq_b = torch.zeros(n, **kw)
        self.cross = torch.zeros(n, n, **kw)

    def update(self, a: Tensor, b: Tensor) -> None:
        """Add samples ``a, b`` of shape ``(m, n)`` (row ``r`` of both is the same input)."""
        if a.shape != b.shape or a.ndim != 2 or a.shape[1] != self.n:
            raise ValueError(
                f"expected two (m, {self.n}) feature matrices, got {tuple(a.shape)}, {tuple(b.shape)}"
            )
        a = a.to(self.cross.device, torch.float64)
        b = b.to(self.cross.device, torch.float64)
        self.count += a.shape[0]
        self.sum_a += a.sum(0)
        self.sum_b += b.sum(0)
        self.sq_a += (a * a).sum(0)
        self.sq_b += (b * b).sum(0)
        self.cross.addmm_(a.T, b)

    def covariance(self) -> Tensor:
        """Cross-covariance matrix ``cov(a_i, b_j)``."""
        if self.count == 0:
            raise ValueError("no samples were accumulated")
        m = self.count
        return self.cross / m - torch.outer(self.sum_a / m, self.sum_b / m)

    def correlation(self, eps: float = 1e-12) -> Tensor:
        """Pearson correlation ``corr(a_i, b_j)``; constant (dead) units get correlation 0."""
        m = self.count
        var_a = (self.sq_a / m - (self.sum_a / m) ** 2).clamp_min(0)
        var_b = (self.sq_b / m - (self.sum_b / m) ** 2).clamp_min(0)
        return self.covariance() / torch.outer(var_a.sqrt() + eps, var_b.sqrt() + eps)


@dataclass
class ActivationMatchingResult:
    """Outcome of :func:`activation_matching`.

    Attributes:
        perm: group -> int64 indices; ``apply_permutation(state_b, spec, perm)`` aligns model b.
        similarity: group -> mean matched similarity per unit after alignment (correlation
            averaged over points for ``"correlation"``).
        similarity_before: the same for the identity permutation.
        samples: number of samples per point (batch size times spatial positions, summed).
    """

    perm: Permutation
    similarity: dict[str, float]
    similarity_before: dict[str, float]
    samples: dict[str, int]


def _features(t: Any, name: str) -> Tensor:
    if not isinstance(t, Tensor) or t.ndim < 2:
        raise SpecError(f"activation point {name!r} must output a tensor with a channel axis 1")
    return t.movedim(1, -1).reshape(-1, t.shape[1]) if t.ndim > 2 else t


def _inputs(batch: Any) -> tuple[Tensor, ...]:
    if isinstance(batch, Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        return (batch[0],)
    if isinstance(batch, Mapping):
        for k in ("x", "input", "inputs", "image"):
            if k in batch:
                return (batch[k],)
    raise TypeError("loader batches must be a tensor, an (x, y, ...) sequence or a dict with 'x'")


def activation_matching(
    model_a: nn.Module,
    model_b: nn.Module,
    loader: Iterable[Any],
    spec: PermutationSpec | None = None,
    *,
    similarity: Similarity = "covariance",
    solver: str | LapSolver = "scipy",
    max_batches: int | None = None,
    device: torch.device | str | None = None,
) -> ActivationMatchingResult:
    """Permute model b's units to match model a's by the similarity of their activations.

    ``similarity="covariance"`` is activation matching by cross-covariance of post-activations;
    ``"correlation"`` is Tatro et al.'s correlation alignment (002 Alg. 1, App. D). Both models
    run in eval mode under ``torch.inference_mode`` and are left unchanged.

    Args:
        model_a: the reference model.
        model_b: the model whose units are permuted; same architecture.
        loader: iterable of batches (tensors, ``(x, y)`` pairs or dicts with ``"x"``), e.g. the
            alignment subset.
        spec: permutation spec with activation points; built-in if omitted.
        similarity: ``"covariance"`` or ``"correlation"``.
        solver: LAP solver.
        max_batches: stop after this many batches.
        device: where to run the models and accumulate (default: model a's device).

    Raises:
        SpecError: the architectures differ, or a group has no activation points.
    """
    if similarity not in ("covariance", "correlation"):
        raise ValueError(f"similarity must be 'covariance' or 'correlation', got {similarity!r}")
    if spec is None:
        from lmc.permutation.builtin import spec_for

        spec = spec_for(model_a)
    check_same_architecture(model_a.state_dict(), model_b.state_dict(), ("model_a", "model_b"))
    sizes = spec.sizes(model_a.state_dict())
    missing = [g for g in sizes if not spec.activations.get(g)]
    if missing:
        raise SpecError(
            f"groups {missing[:5]} have no activation points in the spec; activation matching "
            "needs spec.activations (built-in and derived specs provide them)"
        )
    if device is None:
        param = next(iter(model_a.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
    points = sorted({name for g in sizes for name in spec.activations[g]})
    captured: dict[str, dict[str, Tensor]] = {"a": {}, "b": {}}
    stats: dict[str, CrossStatistics] = {}
    handles = []

    def hook(side: str, name: str):
        def fn(_module: nn.Module, _inp: Any, out: Any) -> None:
            if name in captured[side]:
                raise SpecError(
                    f"activation point {name!r} ran twice in one forward; use a module called once"
                )
            captured[side][name] = _features(out, name)

        return fn

    modes = (model_a.training, model_b.training)
    try:
        for side, model in (("a", model_a), ("b", model_b)):
            for name in points:
                handles.append(model.get_submodule(name).register_forward_hook(hook(side, name)))
        model_a.eval()
        model_b.eval()
        with torch.inference_mode():
            for i, batch in enumerate(loader):
                if max_batches is not None and i >= max_batches:
                    break
                x = tuple(t.to(device) for t in _inputs(batch))
                model_a(*x)
                model_b(*x)
                for name in points:
                    fa, fb = captured["a"].pop(name), captured["b"].pop(name)
                    if name not in stats:
                        stats[name] = CrossStatistics(fa.shape[1], device)
                    stats[name].update(fa, fb)
    finally:
        for h in handles:
            h.remove()
        model_a.train(modes[0])
        model_b.train(modes[1])
    if not stats:
        raise ValueError("the loader yielded no batches")

    fn, _ = get_solver(solver)
    perm: Permutation = {}
    after: dict[str, float] = {}
    before: dict[str, float] = {}
    samples: dict[str, int] = {}
    for g, n in sizes.items():
        sim = torch.zeros(n, n, dtype=torch.float64)
        for name in spec.activations[g]:
            st = stats[name]
            if st.n != n:
                raise SpecError(
                    f"activation point {name!r} has {st.n} channels but group {g!r} has {n}"
                )
            sim += (st.correlation() if similarity == "correlation" else st.covariance()).cpu()
            samples[g] = samples.get(g, 0) + st.count
        s = sim.numpy()
        p = fn(-s).perm
        perm[g] = torch.as_tensor(p, dtype=torch.long, device=device)  # the models' device
        k = len(spec.activations[g])
        after[g] = float(s[np.arange(n), p].mean()) / k
        before[g] = float(np.trace(s)) / n / k
    return ActivationMatchingResult(perm, after, before, samples)


def correlation_alignment(
    model_a: nn.Module,
    model_b: nn.Module,
    loader: Iterable[Any],
    spec: PermutationSpec | None = None,
    **kwargs: Any,
) -> ActivationMatchingResult:
    """Tatro et al.'s neuron alignment (002 Alg. 1, App. D): activation matching by the Pearson
    correlation of post-activations, residual streams from summed correlations."""
    return activation_matching(model_a, model_b, loader, spec, similarity="correlation", **kwargs)
