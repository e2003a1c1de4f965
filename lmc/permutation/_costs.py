"""Cost-matrix products and objective of weight matching (004 Alg. 2 line 6), shared by the
plain and accelerated methods."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmc.permutation.spec import PermutationSpec, StateDict, read_back


def _trace(prod: Tensor, p: Tensor) -> Tensor:
    """``sum_i prod[i, p[i]]`` (float64, left on the device: the objective reads it back once
    a sweep, not once a solve)."""
    return prod.gather(1, p.view(-1, 1)).sum(dtype=torch.float64)


def _dot(x: Tensor, y: Tensor) -> Tensor:
    """``<x, y>`` computed in their dtype, as float64, on their device."""
    if not x.numel():
        return torch.zeros((), dtype=torch.float64, device=x.device)
    return torch.dot(x.reshape(-1), y.reshape(-1)).to(torch.float64)


class Member:
    """One ``(key, axis)`` of a group, unfolded for cost-matrix products.

    The source side (``b``, unfolded, and optionally the source gathered by the permutations
    of its other axes) depends only on the source tensor, so accelerated matching keeps members
    across calls (:class:`SourceCache`) while the target side ``a`` is set anew every call.
    """

    __slots__ = ("key", "axis", "a", "b", "src", "others", "_gathered", "_used", "_prod", "_at")

    def __init__(
        self, key: str, axis: int, b: Tensor, axes: tuple[str | None, ...], keep: bool = False
    ) -> None:
        self.key = key
        self.axis = axis
        self.src = b  # the source entry in its own layout
        # (n, *other axes in original order): a view for one call; a contiguous copy for a member
        # kept across calls, whose slices are gathered again when a permutation moves a few units
        self.b = b.movedim(axis, 0).contiguous() if keep else b.movedim(axis, 0)
        others = [ax for i, ax in enumerate(axes) if i != axis]
        self.others = [(dim + 1, g) for dim, g in enumerate(others) if g is not None]
        self.a = b.new_empty(0)
        self._gathered: Tensor | None = None
        self._used: list[Tensor] = []
        self._prod: Tensor | None = None  # the last product (this call's target) ...
        self._at: list[Tensor] = []  # ... and the permutation tensors it was computed with

    def set_target(self, a: Tensor) -> None:
        """The target's entry, unfolded along this member's axis (a view when axis == 0)."""
        self.a = a.movedim(self.axis, 0).reshape(a.shape[self.axis], -1)
        self.release()

    def release(self) -> None:
        """Forget the kept product (it belongs to one target)."""
        self._prod, self._at = None, []

    def _gather(self, b: Tensor, perm: Mapping[str, Tensor], skip: int = -1) -> Tensor:
        for dim, g in self.others:
            if dim != skip:
                b = b.index_select(dim, perm[g])
        return b

    def _full(self, perm: Mapping[str, Tensor]) -> Tensor:
        """The whole source permuted on its other axes, unfolded: gathered in the source's own
        layout (contiguous slices), then one transposing copy, as a plain implementation does."""
        t = self.src
        for dim, g in self.others:
            t = t.index_select(dim - 1 if dim - 1 < self.axis else dim, perm[g])
        return t.movedim(self.axis, 0).reshape(t.shape[self.axis], -1)

    def gathered(self, perm: Mapping[str, Tensor]) -> Tensor:
        """The source with its other axes permuted by ``perm``, kept for the next request.

        Reused as is when those permutations are unchanged (equal values) since the last
        request, patched at the moved positions when one of them moved a few units, else
        gathered afresh.
        """
        used = [perm[g] for _, g in self.others]
        if self._gathered is not None:
            moved = [i for i, (o, u) in enumerate(zip(self._used, used)) if not torch.equal(o, u)]
            if not moved:
                return self._gathered
            if len(moved) == 1:
                dim = self.others[moved[0]][0]
                new, old = used[moved[0]], self._used[moved[0]]
                changed = (new != old).nonzero().flatten()
                if changed.numel() * 3 <= new.numel():
                    part = self._gather(self.b.index_select(dim, new[changed]), perm, skip=dim)
                    self._gathered.index_copy_(dim, changed, part)
                    self._used[moved[0]] = new.clone()
                    return self._gathered
        self._gathered = self._full(perm).view(self.b.shape)  # a new tensor: others is not empty
        self._used = [u.clone() for u in used]
        return self._gathered

    def product(self, perm: Mapping[str, Tensor], cached: bool = False) -> Tensor:
        """``A_k B~_k^T`` with the source's other axes permuted by ``perm``.

        ``cached`` reuses (and keeps) the gathered source, see :meth:`gathered`.
        """
        b = self.gathered(perm).reshape(self.b.shape[0], -1) if cached else self._full(perm)
        return self.a @ b.T

    def kept_product(self, perm: Mapping[str, Tensor]) -> Tensor:
        """:meth:`product`, kept until the next call with other permutation tensors: reused
        as is, updated in place when one neighbouring permutation moved a few units (see
        :meth:`update`), else recomputed from the kept gather. Permutations are compared by
        identity: weight matching replaces a group's tensor whenever it changes."""
        at = [perm[g] for _, g in self.others]
        if self._prod is not None:
            moved = [i for i, (o, u) in enumerate(zip(self._at, at)) if o is not u]
            if not moved:
                return self._prod
            i = moved[0]
            if len(moved) == 1 and self.update(self._prod, perm, self.others[i][0], self._at[i]):
                self._at = at
                return self._prod
        self._prod, self._at = self.product(perm, cached=True), at
        return self._prod

    def value(self, perm: Mapping[str, Tensor], group: str) -> Tensor:
        """``<A_k, pi(B_k)>`` from the kept gathered source: one row gather, no full permute."""
        b = self.gathered(perm)
        rows = b.reshape(b.shape[0], -1).index_select(0, perm[group])
        return _dot(self.a, rows)

    def update(self, prod: Tensor, perm: Mapping[str, Tensor], dim: int, old: Tensor) -> bool:
        """Update ``prod`` in place after the permutation on ``dim`` changed from ``old``.

        Only the slices of the changed positions are multiplied (cost proportional to their
        number). Returns ``False``, leaving ``prod`` untouched, if too many positions changed
        for this to pay off.
        """
        new = perm[dict(self.others)[dim]]
        changed = (new != old).nonzero().flatten()
        if changed.numel() * 3 > new.numel():
            return False
        if changed.numel():
            n = self.b.shape[0]
            a_sel = self.a.view(self.b.shape).index_select(dim, changed)
            b_new = self.b.index_select(dim, new[changed])
            b_old = self.b.index_select(dim, old[changed])
            diff = self._gather(b_new.sub_(b_old), perm, skip=dim)
            prod.addmm_(a_sel.reshape(n, -1), diff.reshape(n, -1).T)
        return True


class Problem:
    """Unfolded members per group and the objective, for one (target, source) pair.

    The objective ``<theta_a, pi(theta_b)>`` is tracked per key: one pass over the weights at
    the start (:meth:`start`), then, whenever a group is solved, the values of its keys are read
    off the member products of its cost matrix in O(n) each (:meth:`refresh`),
    ``<A_k, pi(B_k)> = sum_i P[i, p_g(i)]``; no further pass over the weights is needed.
    """

    def __init__(
        self,
        a: StateDict,
        b: StateDict,
        spec: PermutationSpec,
        keys: list[str],
        cache: SourceCache | None = None,
    ) -> None:
        if spec.pieces:  # block-structured entries: match over their pieces
            a, b, keys, spec = spec.split(a), spec.split(b), spec.split_keys(keys), spec.flat
        self.spec = spec
        self.keys = keys
        self.cache = cache
        if cache is not None:
            cache.start_call(b, keys)
        keyset = set(keys)
        self.static: dict[str, Tensor | None] = {}
        self.dynamic: dict[str, list[Member]] = {}
        self.static_keys: set[str] = set()  # keys with one permuted axis: summed into static
        self.first_member: dict[str, tuple[Member, str]] = {}
        for g, members in spec.groups.items():
            stat_a, stat_b, dyn = [], [], []
            for key, axis in members:
                if key not in keyset:
                    continue
                if cache is not None:
                    m = cache.member(key, axis, b[key], spec.axes[key])
                else:
                    m = Member(key, axis, b[key], spec.axes[key])
                m.set_target(a[key])
                if m.others:
                    dyn.append(m)
                    self.first_member.setdefault(key, (m, g))
                else:
                    self.static_keys.add(key)
                    stat_a.append(m.a)
                    stat_b.append(m.b.reshape(m.b.shape[0], -1))
            self.static[g] = torch.cat(stat_a, 1) @ torch.cat(stat_b, 1).T if stat_a else None
            self.dynamic[g] = dyn
        self.a, self.b = a, b
        self.const = sum(_dot(a[k], b[k]) for k in keys if all(g is None for g in spec.axes[k]))
        # keys carrying one group on two axes: a product is only linear in the other axis
        self.self_loop = {
            k
            for k in keys
            if len([g for g in spec.axes[k] if g]) > len({g for g in spec.axes[k] if g})
        }
        self.values: dict[str, Tensor] = {}  # on the device, read back by total()
        self.static_values: dict[str, Tensor] = {}

    def _value(self, key: str, perm: Mapping[str, Tensor]) -> Tensor:
        t = self.b[key]
        for axis, g in enumerate(self.spec.axes[key]):
            if g is not None:
                t = t.index_select(axis, perm[g])
        return _dot(self.a[key], t)

    def start(self, perm: Mapping[str, Tensor]) -> float:
        """Compute every key's value at ``perm`` (one pass over the weights); the objective."""
        for g, stat in self.static.items():
            if stat is not None:
                self.static_values[g] = _trace(stat, perm[g])
        for k in self.keys:
            axes = self.spec.axes[k]
            if k not in self.static_keys and any(g is not None for g in axes):
                first = self.first_member.get(k)
                if self.cache is not None and first is not None and k not in self.self_loop:
                    self.values[k] = first[0].value(perm, first[1])
                else:
                    self.values[k] = self._value(k, perm)
        return self.total()

    def refresh(
        self, g: str, products: list[tuple[Member, Tensor]], perm: Mapping[str, Tensor]
    ) -> None:
        """After group ``g`` was solved: update its keys from its (current) member products."""
        stat = self.static[g]
        if stat is not None:
            self.static_values[g] = _trace(stat, perm[g])
        for m, prod in products:
            if m.key in self.self_loop:
                self.values[m.key] = self._value(m.key, perm)
            else:
                self.values[m.key] = _trace(prod, perm[g])

    def release(self) -> None:
        """Drop the members' kept products (kept members outlive the call)."""
        for members in self.dynamic.values():
            for m in members:
                m.release()

    def total(self) -> float:
        """The tracked objective ``<theta_a, pi(theta_b)>`` (one read-back from the device)."""
        parts = [*self.static_values.values(), *self.values.values()]
        if not parts:
            return float(self.const)
        return float(self.const + torch.stack(parts).sum())


class SourceCache:
    """Source-side members kept across accelerated calls with the same source (STE / STE-MM /
    MergeMany match a fixed model to a moving target every step).

    The cache holds its own copy of each source entry and reuses the members built from it
    while the source passed to a call is equal to that copy, element for element (checked
    once per entry and call, a read of both); any change, in place or not (``.data`` edits,
    new tensors at a reused address), rebuilds that entry's members. With the members' unfolded
    copies and the source gathered by the permutations of their other axes, the cache holds
    about four times the source's size.
    """

    def __init__(self) -> None:
        self.copies: dict[str, Tensor] = {}
        self.members: dict[tuple[str, int, tuple[str | None, ...]], Member] = {}
        self._checked: set[str] = set()

    def start_call(self, b: StateDict, keys: list[str]) -> None:
        """Compare the kept copies with this call's source ``b`` at ``keys`` (every entry
        compared element for element, read back from the device once for all of them); the
        entries that differ are copied again, and their members rebuilt, when first used."""
        self._checked.clear()
        comparable = []
        for key in keys:
            kept, new = self.copies.get(key), b[key]
            if (
                kept is not None
                and kept.shape == new.shape
                and kept.dtype == new.dtype
                and kept.device == new.device
            ):
                comparable.append(key)
        same = read_back([(self.copies[k] == b[k]).all() for k in comparable])
        self._checked.update(key for key, ok in zip(comparable, same) if ok)

    def _copy(self, key: str, b: Tensor) -> Tensor:
        if key not in self._checked:  # new, or not equal to the kept copy
            self.copies[key] = b.detach().clone()
            self.members = {slot: m for slot, m in self.members.items() if slot[0] != key}
            self._checked.add(key)
        return self.copies[key]

    def member(self, key: str, axis: int, b: Tensor, axes: tuple[str | None, ...]) -> Member:
        """The kept member for ``(key, axis)``, rebuilt if ``b`` differs from the kept copy."""
        copy = self._copy(key, b)
        slot = (key, axis, tuple(axes))
        m = self.members.get(slot)
        if m is None:
            m = self.members[slot] = Member(key, axis, copy, axes, keep=True)
        return m

    def nbytes(self) -> int:
        """Memory held by the kept source copies and gathered tensors."""
        total = sum(t.numel() * t.element_size() for t in self.copies.values())
        for m in self.members.values():
            if m._gathered is not None:
                total += m._gathered.numel() * m._gathered.element_size()
        return total
