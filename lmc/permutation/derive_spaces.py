"""Channel spaces for :func:`~lmc.permutation.derive_spec`: which units share a permutation.

A *space* is the identity of a tensor axis's units. It is a leaf (one permutation group), the
*concatenation* of spaces (``torch.cat``: block-diagonal composition of their permutations) or
their *Kronecker product* (row-major: a flattened ``C x H x W`` map is ``C`` blocks of ``H W``
units, attention's ``E`` features are ``heads x head_dim``). Spaces are merged with a union-find;
the fixed space (model inputs and outputs) absorbs whatever is merged with it. When two
structures cannot be reconciled exactly, both are fixed: fewer permutations, never a wrong one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import fx

from lmc.permutation.spec import Axes, PermutationSpec, Piece

Segment = list[tuple[int | None, int]]  # factors (group root or None, size), row-major
Layout = list[Segment]  # concatenated segments


def node_shape(node: Any) -> tuple[int, ...] | None:
    """The shape :class:`torch.fx.passes.shape_prop.ShapeProp` recorded for a tensor node."""
    if not isinstance(node, fx.Node):
        return None
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def node_arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Argument ``i`` (or keyword ``name``) of a graph node."""
    return node.args[i] if i < len(node.args) else node.kwargs.get(name, default)


@dataclass(frozen=True)
class Feature:
    """A feature tensor in the traced graph: ``axis`` carries ``space`` (other axes are not
    permuted)."""

    space: int
    axis: int


@dataclass(frozen=True)
class ParamUse:
    """A parameter used outside its module (``get_attr``), right-aligned with ``offset`` new
    leading axes after ``expand``."""

    key: str
    ndim: int
    offset: int = 0


@dataclass(frozen=True)
class ParamT:
    """A 2-D parameter used outside its module transposed (``rel_k.transpose(-1, -2)`` in
    BoTNet's relative position logits); only a matrix product reads it (its axes swapped)."""

    key: str


@dataclass(frozen=True)
class ParamCat:
    """One-axis parameters and constants concatenated (EVA's and Swin V2's ``qkv_bias =
    cat(q_bias, k_bias, v_bias)``): each part's state-dict key (``None``: a constant, with
    ``uniform`` saying whether all its entries are equal) and size."""

    parts: tuple[tuple[str | None, int, bool], ...]


@dataclass(frozen=True)
class Several:
    """A tuple of values (``chunk``/``split`` pieces, attention's output and weights)."""

    items: tuple[Any, ...]


class NotExpressible(ValueError):
    """A space whose permutation cannot be written as blocks of one tensor axis."""


class Spaces:
    """Union-find over spaces with cat/kron structure; space 0 is the fixed space."""

    FIXED = 0

    def __init__(self) -> None:
        self.parent: list[int] = [0]
        self.size: list[int] = [0]
        self.kind: list[str | None] = [None]
        self.kids: list[list[int]] = [[]]
        self.name: list[str] = ["<fixed>"]

    def new(self, size: int, name: str, kind: str | None = None, kids: list[int] | None = None):
        """A new space (a leaf unless ``kind`` is ``"cat"`` or ``"kron"``)."""
        self.parent.append(len(self.parent))
        self.size.append(size)
        self.kind.append(kind)
        self.kids.append(list(kids or []))
        self.name.append(name)
        return len(self.parent) - 1

    def fixed_leaf(self, size: int) -> int:
        """A space of ``size`` units that is never permuted."""
        s = self.new(size, "<fixed>")
        self.parent[s] = self.FIXED
        return s

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def is_fixed(self, x: int) -> bool:
        return self.find(x) == self.FIXED

    def fix(self, x: int) -> None:
        """Merge ``x`` (and everything it is built from) with the fixed space."""
        r = self.find(x)
        if r == self.FIXED:
            return
        self.parent[r] = self.FIXED
        for k in self.kids[r]:
            self.fix(k)

    def _flat_kids(self, r: int) -> list[int]:
        out = []
        for k in self.kids[r]:
            rk = self.find(k)
            if self.kind[rk] == self.kind[r] and rk != self.FIXED:
                out.extend(self._flat_kids(rk))
            else:
                out.append(k)
        return out

    def union(self, a: int, b: int) -> None:
        """Merge spaces ``a`` and ``b`` (of equal size): they share one permutation."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if ra == self.FIXED or rb == self.FIXED:
            self.fix(rb if ra == self.FIXED else ra)
            return
        if self.size[ra] != self.size[rb]:  # no rule should ask this; never a wrong spec
            self.fix(ra)
            self.fix(rb)
            return
        ka, kb = self.kind[ra], self.kind[rb]
        if ka is None and kb is None:
            lo, hi = min(ra, rb), max(ra, rb)  # the older leaf names the group
            self.parent[hi] = lo
            return
        if ka is None or kb is None:
            leaf, other = (ra, rb) if ka is None else (rb, ra)
            self.parent[leaf] = other
            return
        xa, xb = self._flat_kids(ra), self._flat_kids(rb)
        sa, sb = [self.size[k] for k in xa], [self.size[k] for k in xb]
        if ka == kb and sa == sb:
            self.parent[rb] = ra
            for x, y in zip(xa, xb):
                self.union(x, y)
            return
        if ka == kb == "cat" and self._refine_cat(xa, sa, xb, sb):
            self.union(ra, rb)
            return
        cat, kron = (xa, xb) if ka == "cat" else (xb, xa)
        lead = self.size[kron[0]] if ka != kb and len(kron) >= 2 else 0
        if lead and lead % len(cat) == 0 and (lead == len(cat) or self.is_fixed(kron[0])):
            # n equal blocks = n x (one shared space): the blocks share one permutation (a
            # fixed leading factor of m n units is n blocks of m fixed units each)
            inner = [self.fixed_leaf(lead // len(cat))] if lead > len(cat) else []
            inner += kron[1:]
            if all(self.size[c] == math.prod(self.size[k] for k in inner) for c in cat):
                self.fix(kron[0])
                rest = inner[0] if len(inner) == 1 else self.kron(inner, self.name[kron[1]])
                for c in cat:
                    self.union(c, rest)
                self.parent[rb] = ra
                return
        self.fix(ra)
        self.fix(rb)

    def _refine_cat(self, xa: list[int], sa: list[int], xb: list[int], sb: list[int]) -> bool:
        """Split leaf segments at the other side's boundaries; False if a split is not a leaf."""
        cuts = set(_ends(sa)) | set(_ends(sb))
        for xs, ss in ((xa, sa), (xb, sb)):
            start = 0
            for x, n in zip(xs, ss):
                inner = sorted(c - start for c in cuts if start < c < start + n)
                if inner:
                    if self.kind[self.find(x)] is not None:
                        return False
                    self.split(x, [b - a for a, b in zip([0, *inner], [*inner, n])])
                start += n
        return True

    def split(self, x: int, sizes: list[int]) -> list[int]:
        """``x`` as the concatenation of parts of ``sizes`` (a leaf is refined into new leaves)."""
        r = self.find(x)
        if r == self.FIXED:
            return [self.fixed_leaf(n) for n in sizes]
        if len(sizes) == 1:
            return [x]
        if self.kind[r] is None:
            parts = [self.new(n, f"{self.name[r]}:{i}") for i, n in enumerate(sizes)]
            self.union(r, self.new(self.size[r], self.name[r], "cat", parts))
            return parts
        if (
            self.kind[r] == "kron"
        ):  # (a1 | a2) (x) b = (a1 (x) b) | (a2 (x) b): split the first factor
            kids = self._flat_kids(r)
            inner = math.prod(self.size[k] for k in kids[1:])
            if all(n % inner == 0 for n in sizes):
                heads = self.split(kids[0], [n // inner for n in sizes])
                return [
                    self.kron([h, *kids[1:]], f"{self.name[r]}:{i}") for i, h in enumerate(heads)
                ]
        parts = [self.new(n, f"{self.name[r]}:{i}") for i, n in enumerate(sizes)]
        self.union(r, self.new(self.size[r], self.name[r], "cat", parts))
        return [p if not self.is_fixed(p) else self.fixed_leaf(n) for p, n in zip(parts, sizes)]

    def cat(self, parts: list[int], name: str) -> int:
        return self.new(sum(self.size[p] for p in parts), name, "cat", parts)

    def kron(self, parts: list[int], name: str) -> int:
        parts = [p for p in parts if self.size[p] != 1 or not self.is_fixed(p)]
        if len(parts) == 1:
            return parts[0]
        return self.new(math.prod(self.size[p] for p in parts), name, "kron", parts)

    def layout(self, x: int) -> Layout:
        """``x`` as concatenated segments of row-major factors (group root or None, size)."""
        r = self.find(x)
        if r == self.FIXED:
            return [[(None, self.size[x])]]
        if self.kind[r] is None:
            return [[(r, self.size[r])]]
        if self.kind[r] == "cat":
            return [seg for k in self.kids[r] for seg in self.layout(k)]
        out: Layout = [[]]
        for k in self.kids[r]:
            lk = self.layout(k)
            if len(lk) != 1 and out != [[]]:
                if len(out) != 1 or any(g is not None for g, _ in out[0]):
                    raise NotExpressible(
                        f"space {self.name[r]!r} interleaves concatenated blocks under a "
                        "permuted factor"
                    )
                # fixed (x) (b1 | b2 | ...), e.g. per-head q, k, v blocks one head after the
                # other: the blocks repeated once per fixed index (the heads stay in order)
                out = [list(s) for _ in range(math.prod(n for _, n in out[0])) for s in lk]
                continue
            out = [seg + s for seg in out for s in lk] if out == [[]] else [s + lk[0] for s in out]
        return [_merge_fixed(s) for s in out]


def _ends(sizes: list[int]) -> list[int]:
    out, t = [], 0
    for n in sizes:
        t += n
        out.append(t)
    return out


def _merge_fixed(seg: Segment) -> Segment:
    out: Segment = []
    for g, n in seg:
        if out and g is None and out[-1][0] is None:
            out[-1] = (None, out[-1][1] * n)
        elif n != 1 or g is not None:
            out.append((g, n))
    return out or [(None, 1)]


Member = tuple[str, int, int, tuple[int, int] | None]  # key, axis, space, rows (axis 0)


def build_axes(
    sp: Spaces,
    state_shapes: dict[str, tuple[int, ...]],
    members: list[Member],
    names: dict[int, str],
) -> tuple[dict[str, Axes], dict[str, tuple[Piece, ...]]]:
    """Spec axes and pieces of every state-dict entry from the derived members."""
    by_key: dict[str, list[Member]] = {}
    for m in members:
        by_key.setdefault(m[0], []).append(m)
    axes: dict[str, Axes] = {}
    pieces: dict[str, tuple[Piece, ...]] = {}
    for key, shape in state_shapes.items():
        ms = by_key.get(key, [])
        rows = sorted({m[3] for m in ms if m[3] is not None})
        blocks: list[tuple[int, int] | None] = [*rows] if rows else [None]
        out: list[Piece] = []
        out_axes: list[Axes] = []
        plain = True
        for block in blocks:
            lay: list[Layout] = []
            for axis, n in enumerate(shape):
                sel = [m for m in ms if m[1] == axis and (m[3] is None or m[3] == block)]
                size = block[1] - block[0] if (axis == 0 and block is not None) else n
                live = sel and not sp.is_fixed(sel[0][2])  # a fixed space: any size
                lay.append(sp.layout(sel[0][2]) if live else [[(None, size)]])
            plain = plain and block is None and all(len(lo) == 1 and len(lo[0]) == 1 for lo in lay)
            combos: list[tuple[list[tuple[int, int]], list[int], list[str | None]]] = [([], [], [])]
            for axis, lo in enumerate(lay):
                start = block[0] if (axis == 0 and block is not None) else 0
                nxt = []
                for idx, shp, ax in combos:
                    off = start
                    for seg in lo:
                        n = math.prod(s for _, s in seg)
                        nxt.append(
                            (
                                [*idx, (off, off + n)],
                                shp + [s for _, s in seg],
                                ax + [names[g] if g is not None else None for g, _ in seg],
                            )
                        )
                        off += n
                combos = nxt
            for idx, shp, ax in combos:
                out.append(Piece(f"{key}#{len(out)}", tuple(idx), tuple(shp)))
                out_axes.append(tuple(ax))
        if plain:
            axes[key] = out_axes[0]
        else:
            pieces[key] = tuple(out)
            for p, p_axes in zip(out, out_axes):
                axes[p.key] = p_axes
    return axes, pieces


def spec_from(
    sp: Spaces,
    state_shapes: dict[str, tuple[int, ...]],
    members: list[Member],
    points: list[tuple[str, int, int]],
) -> PermutationSpec:
    """The :class:`PermutationSpec` (group names: the space that first produced the group)."""
    names = {r: sp.name[r] for r in range(len(sp.parent)) if sp.find(r) == r}
    axes, pieces = build_axes(sp, state_shapes, members, names)
    groups = {g for ax in axes.values() for g in ax if g is not None}
    seen: dict[str, str | None] = {}
    for target, s, _ in points:
        lo = sp.layout(s)
        g = names[lo[0][0][0]] if len(lo) == 1 and len(lo[0]) == 1 and lo[0][0][0] else None
        seen[target] = g if seen.get(target, g) == g else None
    best: dict[str, list[tuple[int, str]]] = {}
    for target, _, prio in points:
        g = seen.get(target)
        if g is not None and g in groups:
            best.setdefault(g, []).append((prio, target))
    acts = {}
    for g, pts in best.items():
        top = min(p for p, _ in pts)
        acts[g] = tuple(dict.fromkeys(t for p, t in pts if p == top))
    return PermutationSpec(axes, acts, pieces)
