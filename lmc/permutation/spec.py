"""Permutation specs: which axes of which state-dict entries share one permutation (C2).

A hidden unit of a network can be renamed without changing the function it computes, as long
as every tensor that reads or writes that unit is renamed the same way (004 §2.2, 000 §2.2).
A :class:`PermutationSpec` records this: for every state-dict key, one entry per tensor axis
naming the permutation group acting on it (or ``None``). The inverse view, group -> list of
``(key, axis)`` pairs, is :attr:`PermutationSpec.groups`.

Permutations are ``dict[str, torch.Tensor]`` of int64 indices, one per group. Applying ``perm``
takes new unit ``i`` of a group from old unit ``perm[group][i]``: in matrix form
``W' = P W`` with ``P[i, perm[i]] = 1`` on the output axis and ``W' = W P^T`` on the input axis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

StateDict = Mapping[str, Tensor]
Permutation = dict[str, Tensor]
Axes = tuple[str | None, ...]


class SpecError(ValueError):
    """A spec, state dict or permutation is inconsistent; the message names the key or group."""


@dataclass(frozen=True)
class PermutationSpec:
    """Named permutation groups over the axes of a state dict.

    Args:
        axes: for every state-dict key (parameters and buffers, including ones that are never
            permuted such as ``num_batches_tracked`` or the logits bias), one group name or
            ``None`` per tensor axis.
        activations: optional, for activation matching: group -> names of modules whose output
            features (axis 1) carry that group's permutation, e.g. the ReLU after a layer. A
            residual stream lists every point on the stream (002 App. D).
    """

    axes: Mapping[str, Axes]
    activations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, ax in self.axes.items():
            if not isinstance(ax, tuple):
                raise SpecError(f"spec axes of {key!r} must be a tuple, got {type(ax).__name__}")
        unknown = set(self.activations) - set(self.groups)
        if unknown:
            raise SpecError(f"activation points given for unknown groups {sorted(unknown)}")

    @cached_property
    def groups(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """Group name -> ``(key, axis)`` pairs it acts on, in key order."""
        out: dict[str, list[tuple[str, int]]] = {}
        for key, ax in self.axes.items():
            for axis, group in enumerate(ax):
                if group is not None:
                    out.setdefault(group, []).append((key, axis))
        return {g: tuple(m) for g, m in out.items()}

    @cached_property
    def neighbors(self) -> dict[str, frozenset[str]]:
        """Group -> groups acting on another axis of one of its keys.

        A group's weight-matching cost matrix depends only on the permutations of its neighbours
        (itself included when a key carries the same group on two axes).
        """
        out: dict[str, set[str]] = {g: set() for g in self.groups}
        for g, members in self.groups.items():
            for key, axis in members:
                for other_axis, h in enumerate(self.axes[key]):
                    if h is not None and other_axis != axis:
                        out[g].add(h)
        return {g: frozenset(n) for g, n in out.items()}

    def partition(self) -> frozenset[frozenset[tuple[str, int]]]:
        """The groups as a set of sets of ``(key, axis)``: specs equal up to group naming."""
        return frozenset(frozenset(m) for m in self.groups.values())

    def sizes(self, state: StateDict) -> dict[str, int]:
        """Check ``state`` against the spec and return each group's size.

        Raises:
            SpecError: a key of ``state`` is missing from the spec or vice versa, a key's rank
                differs from its number of spec axes, or two members of a group disagree on
                the group's size.
        """
        missing = [k for k in state if k not in self.axes]
        if missing:
            raise SpecError(
                f"state dict entries {missing[:5]} are not in the permutation spec; every "
                "parameter and buffer needs an entry (use None for axes that are not permuted)"
            )
        extra = [k for k in self.axes if k not in state]
        if extra:
            raise SpecError(
                f"permutation spec names keys {extra[:5]} that the state dict does not have; "
                "was the spec built for a different architecture or options?"
            )
        sizes: dict[str, int] = {}
        first: dict[str, tuple[str, int]] = {}
        for key, ax in self.axes.items():
            shape = tuple(state[key].shape)
            if len(shape) != len(ax):
                raise SpecError(f"{key!r} has shape {shape} but the spec gives {len(ax)} axes {ax}")
            for axis, group in enumerate(ax):
                if group is None:
                    continue
                if group not in sizes:
                    sizes[group] = shape[axis]
                    first[group] = (key, axis)
                elif sizes[group] != shape[axis]:
                    k0, a0 = first[group]
                    raise SpecError(
                        f"group {group!r} has size {sizes[group]} on {k0!r} axis {a0} but "
                        f"{shape[axis]} on {key!r} axis {axis}"
                    )
        return sizes

    def restrict(self, keys: Iterable[str]) -> PermutationSpec:
        """The spec limited to ``keys`` (activation points of vanished groups are dropped)."""
        keys = set(keys)
        axes = {k: a for k, a in self.axes.items() if k in keys}
        groups = {g for a in axes.values() for g in a if g is not None}
        acts = {g: p for g, p in self.activations.items() if g in groups}
        return PermutationSpec(axes, acts)


def identity_permutation(
    sizes: Mapping[str, int], device: torch.device | None = None
) -> Permutation:
    """The identity permutation for groups of the given sizes."""
    return {g: torch.arange(n, device=device) for g, n in sizes.items()}


def random_permutation(
    sizes: Mapping[str, int], generator: torch.Generator | int | None = None
) -> Permutation:
    """A uniformly random permutation of every group (seeded by ``generator`` if an int)."""
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    return {g: torch.randperm(n, generator=generator) for g, n in sizes.items()}


def check_permutation(perm: Mapping[str, Tensor], sizes: Mapping[str, int]) -> None:
    """Raise :class:`SpecError` unless ``perm`` holds a valid permutation for every group."""
    missing = [g for g in sizes if g not in perm]
    if missing:
        raise SpecError(f"permutation is missing groups {missing[:5]}")
    for g, n in sizes.items():
        p = perm[g]
        if p.ndim != 1 or p.numel() != n:
            raise SpecError(
                f"permutation of group {g!r} has shape {tuple(p.shape)}, expected ({n},)"
            )
        if p.dtype.is_floating_point or p.dtype == torch.bool:
            raise SpecError(f"permutation of group {g!r} must hold integer indices, got {p.dtype}")
        seen = torch.zeros(n, dtype=torch.bool, device=p.device)
        if n and (p.min() < 0 or p.max() >= n):
            raise SpecError(f"permutation of group {g!r} has indices outside [0, {n})")
        seen[p] = True
        if not bool(seen.all()):
            raise SpecError(f"permutation of group {g!r} repeats an index; it is not a permutation")


def check_finite(state: StateDict, name: str = "state dict") -> None:
    """Raise :class:`SpecError` naming the first floating-point entry with NaN or inf values."""
    for key, t in state.items():
        if not t.dtype.is_floating_point or not t.numel():
            continue
        flat = t.reshape(-1)
        if bool(torch.isfinite(torch.dot(flat, flat))):  # one reduction; inf/NaN propagate
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise SpecError(
                f"{name} entry {key!r} has {bad} NaN/inf values; matching needs finite weights "
                "(was the model diverged or loaded from a broken checkpoint?)"
            )


def check_same_architecture(
    a: StateDict, b: StateDict, names: tuple[str, str] = ("a", "b")
) -> None:
    """Raise :class:`SpecError` unless ``a`` and ``b`` have the same keys, shapes and kinds of
    dtype (floating point or not)."""
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    if only_a or only_b:
        raise SpecError(
            f"models do not match: keys only in {names[0]}: {only_a[:5]}, only in {names[1]}: "
            f"{only_b[:5]}; both must be the same architecture"
        )
    for k in a:
        if a[k].shape != b[k].shape:
            raise SpecError(
                f"models do not match at {k!r}: shape {tuple(a[k].shape)} in {names[0]} vs "
                f"{tuple(b[k].shape)} in {names[1]} (different width or options?)"
            )
        if a[k].is_floating_point() != b[k].is_floating_point():
            raise SpecError(
                f"models do not match at {k!r}: dtype {a[k].dtype} in {names[0]} vs "
                f"{b[k].dtype} in {names[1]}; convert both state dicts the same way"
            )
