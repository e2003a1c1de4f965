"""Functional-equivalence check for a permutation spec: a wrong spec must not pass silently."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmc.permutation.apply import apply_permutation
from lmc.permutation.spec import PermutationSpec, SpecError, aliases, check_finite


class SpecCheckError(AssertionError):
    """Permuting the model by its spec changed its outputs; the message names the groups."""


@dataclass
class SpecCheckFailure:
    """One group (or ``"<all groups>"``) whose permutation changed the output in one mode."""

    group: str
    mode: str
    max_abs_diff: float


@dataclass
class SpecCheckReport:
    """Result of :func:`check_spec`: ``ok`` iff every permutation left the outputs unchanged."""

    failures: list[SpecCheckFailure] = field(default_factory=list)
    max_abs_diff: float = 0.0
    checked_groups: int = 0

    @property
    def ok(self) -> bool:
        """Whether the spec passed."""
        return not self.failures

    @property
    def broken_groups(self) -> list[str]:
        """Names of the groups whose permutation changed the function."""
        return list(dict.fromkeys(f.group for f in self.failures))


def _randomized(state: Mapping[str, Tensor], gen: torch.Generator) -> dict[str, Tensor]:
    """A copy in which constant float entries (a fresh norm layer's unit weights, zero biases and
    running statistics) are made distinct per unit, so that they cannot hide a missing
    permutation. Running variances are drawn from U(0.5, 1.5); other constants get N(0, 0.1^2)
    relative noise. Non-constant entries are kept, so the network stays in its regime."""
    out = {}
    for k, t in state.items():
        t = t.detach().clone()
        if t.dtype.is_floating_point and t.numel() > 1 and bool((t == t.flatten()[0]).all()):
            rand = torch.rand if k.endswith("running_var") else torch.randn
            noise = rand(t.shape, generator=gen, dtype=t.dtype).to(t.device)
            if k.endswith("running_var"):
                t = 0.5 + noise
            else:
                t = t + 0.1 * max(float(t.flatten()[0].abs()), 1.0) * noise
        out[k] = t
    return out


def _permuted(
    state: Mapping[str, Tensor], spec: PermutationSpec, perm: dict[str, Tensor], group: str | None
) -> dict[str, Tensor]:
    """``state`` permuted by ``perm``; if only ``group`` moves, only the entries it touches are
    (a network of hundreds of groups, e.g. RegNet's grouped convolutions, is checked group by
    group without copying every weight for each)."""
    if group is None:
        return apply_permutation(state, spec, perm, check=False)
    parent = {p.key: k for k, ps in spec.pieces.items() for p in ps}
    touched = {parent.get(key, key) for key, _ in spec.groups[group]}
    sub = spec.restrict(touched)
    sizes = sub.sizes({k: state[k] for k in touched})
    moved = apply_permutation(
        {k: state[k] for k in touched}, sub, {h: perm[h] for h in sizes}, check=False
    )
    return {**state, **moved}


@contextmanager
def _no_functional_dropout(on: bool) -> Iterator[None]:
    """``F.dropout`` and its kin as the identity: a module that calls them with its own rate
    (timm's classifier heads: ``F.dropout(x, self.drop_rate, self.training)``) draws masks that
    would not follow the permutation either."""
    if not on:
        yield
        return
    names = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout")
    saved = {n: getattr(F, n) for n in names}
    try:
        for n in names:
            setattr(F, n, lambda x, *args, **kwargs: x)
        yield
    finally:
        for n, fn in saved.items():
            setattr(F, n, fn)


def _untied(state: Mapping[str, Tensor], names: Mapping[str, list[str]]) -> dict[str, Tensor]:
    """``state`` with one name per tensor the model shares between modules (CoaT's shared
    position encoding; ``names``: :func:`~lmc.permutation.spec.aliases` of the model):
    ``functional_call`` takes each shared tensor once. The names of one shared tensor must
    have been permuted alike, else the spec is wrong (checked here)."""
    shared: set[str] = set()
    for name, others in names.items():  # the first name of each tensor comes first
        if name in shared or name not in state:
            continue
        for other in others:
            if other not in state:
                continue
            shared.add(other)
            if not torch.equal(state[other], state[name]):
                raise SpecCheckError(
                    f"{other!r} and {name!r} are one shared tensor, but the spec "
                    "permutes them differently"
                )
    return {k: v for k, v in state.items() if k not in shared}


def _forward(
    model: nn.Module,
    state: Mapping[str, Tensor],
    x: tuple[Tensor, ...],
    train: bool,
    shared: Mapping[str, list[str]],
) -> Tensor:
    # buffers are cloned: train-mode BatchNorm updates running stats in the tensors it is given
    buffers = dict(model.named_buffers())
    state = {k: v.clone() if k in buffers else v for k, v in _untied(state, shared).items()}
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    for k, b in buffers.items():  # buffers outside the state dict (non-persistent) in its dtype
        if k not in state and b.is_floating_point() and dtype is not None and b.dtype != dtype:
            state[k] = b.to(dtype)
    was = model.training
    model.train(train)
    if train:  # dropout masks would not follow the permutation; keep them off
        for m in model.modules():
            # torchvision's StochasticDepth and timm's DropPath drop whole samples: off as well
            if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ in (
                "StochasticDepth",
                "DropPath",
            ):
                m.eval()
    try:
        with torch.no_grad(), _no_functional_dropout(train):
            out = functional_call(model, state, x)
    finally:
        model.train(was)
    if not isinstance(out, Tensor):
        raise TypeError("check_spec needs a model whose forward returns a single tensor")
    return out


def check_spec(
    model: nn.Module,
    spec: PermutationSpec | None,
    example_input: Tensor | tuple[Tensor, ...],
    *,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    randomize: bool = True,
    raise_on_failure: bool = True,
    dtype: torch.dtype | None = torch.float64,
) -> SpecCheckReport:
    """Check that permuting ``model`` by ``spec`` leaves its function unchanged (C2).

    All groups are permuted together by random non-identity permutations; if that changes the
    outputs, each group is then permuted alone, to name the broken ones. Outputs are compared
    with the unpermuted model in train mode (batch statistics; dropout off) and in eval mode
    (running statistics). A group that changes the output is
    reported: typically a parameter or buffer reading or writing its units is missing from it
    or belongs to another group.

    Args:
        model: the network (not modified).
        spec: its spec; built-in or derived from ``example_input`` if ``None``.
        example_input: a batch (more than one sample, for train-mode BatchNorm).
        seed: seed of the permutations and of the perturbation.
        rtol: tolerance relative to the largest output magnitude.
        atol: absolute tolerance.
        randomize: perturb every float entry first (default), so that constant entries of a
            freshly initialised model (BatchNorm statistics, unit norm weights) are tested.
        raise_on_failure: raise :class:`SpecCheckError` instead of returning a failed report.
        dtype: the floating dtype of the weights and inputs in the comparison (``None``: as
            given). float64 by default: in float32 a permutation changes the summation order,
            and train-mode BatchNorm over small maps (Inception-V3 at 80 x 80) amplifies that
            rounding past any tolerance that would still catch a wrong spec.

    Raises:
        SpecError: the spec does not fit the model's state dict, or weights are NaN/inf.
        SpecCheckError: if ``raise_on_failure`` and a permutation changed the outputs.
    """
    if spec is None:
        from lmc.permutation.builtin import spec_for

        spec = spec_for(model, example_input)
    base = model.state_dict()
    sizes = spec.sizes(base)
    check_finite(base, "model")
    gen = torch.Generator().manual_seed(seed)
    if randomize:
        base = _randomized(base, gen)
    x = example_input if isinstance(example_input, tuple) else (example_input,)
    if dtype is not None:
        base = {k: v.to(dtype) if v.is_floating_point() else v for k, v in base.items()}
        x = tuple(t.to(dtype) if t.is_floating_point() else t for t in x)
    shared = aliases(model)  # names of one tensor shared by modules
    ref = {mode: _forward(model, base, x, mode == "train", shared) for mode in ("train", "eval")}

    def derange(n: int) -> Tensor:
        if n < 2:
            return torch.arange(n)
        while True:
            p = torch.randperm(n, generator=gen)
            if not torch.equal(p, torch.arange(n)):
                return p

    trials = [
        (g, {h: derange(m) if h == g else torch.arange(m) for h, m in sizes.items()}) for g in sizes
    ]
    trials.append(("<all groups>", {h: derange(m) for h, m in sizes.items()}))
    report = SpecCheckReport(checked_groups=len(sizes))

    def run(name: str, perm: dict[str, Tensor]) -> list[SpecCheckFailure]:
        permuted = _permuted(base, spec, perm, None if name == "<all groups>" else name)
        failed = []
        for mode in ("train", "eval"):
            out = _forward(model, permuted, x, mode == "train", shared)
            diff = float((out - ref[mode]).abs().max()) if out.numel() else 0.0
            bound = atol + rtol * float(ref[mode].abs().max())
            report.max_abs_diff = max(report.max_abs_diff, diff)
            if not diff <= bound:  # also catches NaN
                failed.append(SpecCheckFailure(name, mode, diff))
        return failed

    # all groups at once first: a unit moved by the wrong group, or by none, changes the
    # output; only then is every group tried alone, to name the broken ones (a network of
    # hundreds of groups costs one trial, not hundreds, when its spec is right)
    joint = run(*trials[-1])
    if joint:
        for name, perm in trials[:-1]:
            report.failures += run(name, perm)
        report.failures += joint
    if raise_on_failure and not report.ok:
        lines = [
            f"  group {f.group!r} ({f.mode} mode): max |diff| = {f.max_abs_diff:.3g}"
            for f in report.failures
        ]
        raise SpecCheckError(
            "permuting the model by its spec changed its outputs:\n"
            + "\n".join(lines)
            + "\nsome parameter or buffer that reads or writes these units is missing from the "
            "group (or sits in another group); eval-only failures point at BatchNorm running "
            "statistics"
        )
    return report


__all__ = ["SpecCheckError", "SpecCheckFailure", "SpecCheckReport", "SpecError", "check_spec"]
