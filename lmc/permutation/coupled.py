"""A starting point for weight matching on *coupled* groups: a group whose units each hold a
block of another group's units on one tensor axis, as attention heads hold their query/key and
value dimensions (a projection's ``H d`` rows are a piece ``H x d`` with the heads group on the
first factor and the within-head group on the second; :mod:`lmc.permutation.derive_attention`).

Coordinate descent over groups (004 Alg. 2) changes one group at a time. For coupled groups that
stalls: with the within-head dimensions unaligned, the cost of pairing two heads is noise, and
with the heads mispaired, so is the cost of the within-head permutation; on a randomly permuted
copy of a ViT or Swin block it ends in a local optimum well below the true one. This module
pairs the heads first by a description of each head that no permutation of the other groups
changes: the sorted values of every block the head owns (exactly equal for a permuted copy),
solved as one assignment; coordinate descent then starts from it. Only the outer groups of such
pairs are set, every other group starts at the identity; specs without coupled groups are not
affected.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmc.permutation.lap import solve_max
from lmc.permutation.spec import PermutationSpec


def coupled_groups(spec: PermutationSpec) -> list[str]:
    """The outer groups of coupled pairs: groups on a piece axis that, together with the next
    axis (another group), splits one axis of the entry."""
    outer: set[str] = set()
    for pieces in spec.pieces.values():
        for p in pieces:
            axes = spec.axes.get(p.key, ())
            block = [b - a for a, b in p.index]
            # which entry axis each piece axis comes from (row-major split of the block)
            origin, k, acc = [], 0, 1
            for n in p.shape:
                origin.append(k)
                acc *= n
                while k < len(block) and acc == block[k]:
                    k, acc = k + 1, 1
            for i in range(len(axes) - 1):
                g, h = axes[i], axes[i + 1]
                if g is not None and h is not None and g != h and origin[i] == origin[i + 1]:
                    outer.add(g)
    return sorted(outer)


def _describe(state: Mapping[str, Tensor], members: tuple[tuple[str, int], ...]) -> Tensor:
    """Per unit of the group: the sorted values of each of its blocks, concatenated."""
    parts = []
    for key, axis in members:
        t = state[key]
        if not t.is_floating_point():
            continue
        rows = t.movedim(axis, 0).reshape(t.shape[axis], -1).double()
        parts.append(rows.sort(dim=1).values)
    return torch.cat(parts, dim=1)


def coupled_start(
    target: Mapping[str, Tensor], source: Mapping[str, Tensor], spec: PermutationSpec
) -> dict[str, Tensor] | None:
    """The starting permutation of the outer coupled groups (``None`` if the spec has none):
    unit ``i`` of the target paired with the source unit whose sorted blocks match it best."""
    outer = coupled_groups(spec)
    if not outer:
        return None
    a, b = spec.split(target), spec.split(source)
    groups = spec.groups
    start = {}
    for g in outer:
        da, db = _describe(a, groups[g]), _describe(b, groups[g])
        start[g] = torch.as_tensor(solve_max((da @ db.T).cpu().numpy()), dtype=torch.long)
    return start
