"""Permutation specs: which axes of which state-dict entries share one permutation (C2).

A hidden unit of a network can be renamed without changing the function it computes, as long
as every tensor that reads or writes that unit is renamed the same way (004 §2.2, 000 §2.2).
A :class:`PermutationSpec` records this: for every state-dict key, one entry per tensor axis
naming the permutation group acting on it (or ``None``). The inverse view, group -> list of
``(key, axis)`` pairs, is :attr:`PermutationSpec.groups`.

A structured entry (a classifier reading a flattened feature map, a convolution reading a
concatenation, a grouped convolution) is split into *pieces* (:class:`Piece`): blocks of the
entry, each reshaped so that every axis carries one group or none; ``axes`` then names the
pieces instead of the entry (see :attr:`PermutationSpec.pieces`).

Permutations are ``dict[str, torch.Tensor]`` of int64 indices, one per group. Applying ``perm``
takes new unit ``i`` of a group from old unit ``perm[group][i]``: in matrix form
``W' = P W`` with ``P[i, perm[i]] = 1`` on the output axis and ``W' = W P^T`` on the input axis.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

StateDict = Mapping[str, Tensor]
Permutation = dict[str, Tensor]
Axes = tuple[str | None, ...]


class SpecError(ValueError):
    """A spec, state dict or permutation is inconsistent; the message names the key or group."""


@dataclass(frozen=True)
class Piece:
    """A block of a state-dict entry permuted as its own tensor: ``entry[index].reshape(shape)``.

    Args:
        key: the piece's name in :attr:`PermutationSpec.axes` (e.g. ``"classifier.0.weight#0"``).
        index: ``(start, stop)`` per axis of the entry.
        shape: the block's shape for permuting, e.g. ``(4096, 512, 49)`` for a Linear reading a
            flattened ``512 x 7 x 7`` map (a channel permutation moves blocks of 49 features).
    """

    key: str
    index: tuple[tuple[int, int], ...]
    shape: tuple[int, ...]


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
        pieces: optional, state-dict key -> its :class:`Piece` s, for entries whose axes carry
            block or block-diagonal permutations; ``axes`` holds the pieces' keys instead of
            the entry's. Consumers that work per axis call :meth:`split` / :meth:`join` and use
            :attr:`flat`.
    """

    axes: Mapping[str, Axes]
    activations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pieces: Mapping[str, tuple[Piece, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, ax in self.axes.items():
            if not isinstance(ax, tuple):
                raise SpecError(f"spec axes of {key!r} must be a tuple, got {type(ax).__name__}")
        for key, ps in self.pieces.items():
            if key in self.axes:
                raise SpecError(f"{key!r} has pieces and axes; give its pieces' axes only")
            for p in ps:
                if p.key not in self.axes or len(self.axes[p.key]) != len(p.shape):
                    raise SpecError(
                        f"piece {p.key!r} of {key!r} needs axes for its shape {p.shape}"
                    )
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

    @cached_property
    def flat(self) -> PermutationSpec:
        """The spec over :meth:`split` state dicts: every piece a key of its own."""
        return PermutationSpec(self.axes, self.activations) if self.pieces else self

    def _piece_shapes(self, key: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        numel = 0
        for p in self.pieces[key]:
            if len(p.index) != len(shape) or any(
                not 0 <= a < b <= n for (a, b), n in zip(p.index, shape)
            ):
                raise SpecError(f"piece {p.key!r} index {p.index} does not fit {key!r} {shape}")
            block = math.prod(b - a for a, b in p.index)
            if block != math.prod(p.shape):
                raise SpecError(f"piece {p.key!r} shape {p.shape} does not hold block {p.index}")
            numel += block
        if numel != math.prod(shape):
            raise SpecError(f"the pieces of {key!r} do not cover its shape {shape}")
        return {p.key: p.shape for p in self.pieces[key]}

    def split(self, state: StateDict) -> dict[str, Tensor]:
        """``state`` with every entry that has pieces replaced by its pieces (views if possible)."""
        if not self.pieces:
            return dict(state)
        out: dict[str, Tensor] = {}
        for key, t in state.items():
            if key not in self.pieces:
                out[key] = t
                continue
            for p in self.pieces[key]:
                out[p.key] = t[tuple(slice(a, b) for a, b in p.index)].reshape(p.shape)
        return out

    def join(self, pieces: StateDict, like: StateDict) -> dict[str, Tensor]:
        """The inverse of :meth:`split`: entries of ``like`` rebuilt from ``pieces``."""
        if not self.pieces:
            return dict(pieces)
        out: dict[str, Tensor] = {}
        for key, t in like.items():
            if key not in self.pieces:
                out[key] = pieces[key]
                continue
            ps = self.pieces[key]
            if len(ps) == 1:
                out[key] = pieces[ps[0].key].reshape(t.shape)
                continue
            new = pieces[ps[0].key].new_empty(t.shape)
            for p in ps:
                idx = tuple(slice(a, b) for a, b in p.index)
                new[idx] = pieces[p.key].reshape(tuple(b - a for a, b in p.index))
            out[key] = new
        return out

    def split_keys(self, keys: Iterable[str]) -> list[str]:
        """State-dict keys -> the keys of :meth:`split` (a key with pieces -> its pieces)."""
        out: list[str] = []
        for k in keys:
            out.extend(p.key for p in self.pieces[k]) if k in self.pieces else out.append(k)
        return out

    def sizes(self, state: StateDict) -> dict[str, int]:
        """Check ``state`` against the spec and return each group's size.

        Raises:
            SpecError: a key of ``state`` is missing from the spec or vice versa, a key's rank
                differs from its number of spec axes, or two members of a group disagree on
                the group's size.
        """
        if self.pieces:
            _match_keys(state, (self.axes, self.pieces), self.pieces)
            shapes: dict[str, tuple[int, ...]] = {}
            for k, t in state.items():
                if k in self.pieces:
                    shapes.update(self._piece_shapes(k, tuple(t.shape)))
                else:
                    shapes[k] = tuple(t.shape)
            return self.flat._sizes(shapes)
        return self._sizes({k: tuple(t.shape) for k, t in state.items()})

    def _sizes(self, state: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        _match_keys(state, (self.axes,), self.axes)
        sizes: dict[str, int] = {}
        first: dict[str, tuple[str, int]] = {}
        for key, ax in self.axes.items():
            shape = state[key]
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
        pieces = {k: p for k, p in self.pieces.items() if k in keys}
        keys |= {p.key for ps in pieces.values() for p in ps}
        axes = {k: a for k, a in self.axes.items() if k in keys}
        groups = {g for a in axes.values() for g in a if g is not None}
        acts = {g: p for g, p in self.activations.items() if g in groups}
        return PermutationSpec(axes, acts, pieces)


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


def read_back(values: Sequence[Tensor]) -> list[Any]:
    """The Python values of 0-d tensors of one dtype, in order, read back once per device (one
    stack, one copy) instead of once per tensor: each read-back of a GPU value waits for it."""
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    out: list[Any] = [None] * len(values)
    for index in by_device.values():
        for i, v in zip(index, torch.stack([values[i] for i in index]).tolist()):
            out[i] = v
    return out


def check_permutation(perm: Mapping[str, Tensor], sizes: Mapping[str, int]) -> None:
    """Raise :class:`SpecError` unless ``perm`` holds a valid permutation for every group.

    The values of every group are checked together, one read-back from the device in all;
    the group at fault is then named."""
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
    flags = []
    for g, n in sizes.items():
        if n:  # in range, and each index once (counted in range, so no index can go astray)
            p = perm[g]
            once = torch.bincount(p.clamp(0, n - 1), minlength=n) == 1
            flags.append((p.min() >= 0) & (p.max() < n) & once.all())
    if all(read_back(flags)):
        return
    for g, n in sizes.items():
        p = perm[g]
        if n and (p.min() < 0 or p.max() >= n):
            raise SpecError(f"permutation of group {g!r} has indices outside [0, {n})")
        if n and not bool((torch.bincount(p, minlength=n) == 1).all()):
            raise SpecError(f"permutation of group {g!r} repeats an index; it is not a permutation")


def check_finite(state: StateDict, name: str = "state dict") -> None:
    """Raise :class:`SpecError` naming the first floating-point entry with NaN or inf values.

    One reduction per entry (``<t, t>``: NaN and inf propagate), read back from the device once
    for all of them; only when one is not finite (or overflows) are its values counted."""
    dots = [
        torch.dot(t.reshape(-1), t.reshape(-1)).float()
        for t in state.values()
        if t.dtype.is_floating_point and t.numel()
    ]
    if all(math.isfinite(v) for v in read_back(dots)):
        return
    for key, t in state.items():
        if not t.dtype.is_floating_point or not t.numel():
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


def aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """State-dict name -> the other names of the same tensor (a module registered twice),
    each group's first name first: derive_spec gives every name its permutation, check_spec
    passes the tensor once."""
    names: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(name)
    return {
        n: [o for o in group if o != n] for group in names.values() if len(group) > 1 for n in group
    }


def _match_keys(
    state: Collection[str], known: Sequence[Container[str]], named: Iterable[str]
) -> None:
    """Every entry of ``state`` is in one of ``known`` (the spec's keys), every key the spec names (``named``) is
    in ``state``.

    Raises:
        SpecError: the first few keys of either side that the other lacks.
    """
    keys = set(state)  # the named keys looked up in it
    missing = [k for k in state if not any(k in c for c in known)]
    if missing:
        raise SpecError(
            f"state dict entries {missing[:5]} are not in the permutation spec; every "
            "parameter and buffer needs an entry (use None for axes that are not permuted)"
        )
    absent = [k for k in named if k not in keys]
    if absent:
        raise SpecError(
            f"permutation spec names keys {absent[:5]} that the state dict does not have; "
            "was the spec built for a different architecture or options?"
        )
