"""Apply, invert and compose permutations of a state dict (004 §2.2: pi(theta))."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lmc.io import load_state
from lmc.permutation.spec import Permutation, PermutationSpec, StateDict, check_permutation


def apply_permutation(
    state: StateDict, spec: PermutationSpec, perm: Mapping[str, Tensor], *, check: bool = True
) -> dict[str, Tensor]:
    """Return pi(theta): every axis of every entry permuted by its group's permutation.

    New unit ``i`` of a group is old unit ``perm[group][i]`` on every axis the group acts on
    (weights, biases, norm affine parameters and BatchNorm running statistics alike).

    Entries with no permuted axis are returned as the *same* tensor objects (no copy); permuted
    entries are new tensors. ``state`` is never modified.

    Args:
        state: a state dict matching ``spec``.
        spec: the permutation spec.
        perm: group -> int64 index tensor.
        check: validate the spec against ``state`` and that ``perm`` is a permutation.

    Raises:
        SpecError: if ``check`` and the state, spec or permutation are inconsistent.
    """
    if check:
        check_permutation(perm, spec.sizes(state))
    if spec.pieces:  # block-structured entries: permute their pieces, then reassemble
        return spec.join(apply_permutation(spec.split(state), spec.flat, perm, check=False), state)
    out: dict[str, Tensor] = {}
    cache: dict[tuple[str, torch.device], Tensor] = {}
    for key, t in state.items():
        for axis, group in enumerate(spec.axes[key]):
            if group is None:
                continue
            idx = cache.get((group, t.device))
            if idx is None:
                idx = cache[(group, t.device)] = perm[group].to(t.device, torch.long)
            t = t.index_select(axis, idx)
        out[key] = t
    return out


def invert_permutation(perm: Mapping[str, Tensor]) -> Permutation:
    """The inverse permutation: ``apply(apply(s, p), invert(p)) == s``."""
    return {g: torch.argsort(p) for g, p in perm.items()}


def compose_permutations(outer: Mapping[str, Tensor], inner: Mapping[str, Tensor]) -> Permutation:
    """The permutation applying ``inner`` first, then ``outer``.

    ``apply(apply(s, inner), outer) == apply(s, compose_permutations(outer, inner))``.
    """
    return {g: inner[g][outer[g].to(inner[g].device)] for g in outer}


def permutation_equal(p: Mapping[str, Tensor], q: Mapping[str, Tensor]) -> bool:
    """Whether two permutations agree on every group."""
    return p.keys() == q.keys() and all(torch.equal(p[g].cpu(), q[g].cpu()) for g in p)


@torch.no_grad()
def permute_model_(
    model: nn.Module, spec: PermutationSpec, perm: Mapping[str, Tensor]
) -> nn.Module:
    """Permute ``model``'s parameters and buffers in place and return it."""
    state = model.state_dict()
    load_state(model, apply_permutation(state, spec, perm))
    return model
