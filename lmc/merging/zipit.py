"""ZipIt! (Stoica et al., ICLR 2024): merging models feature by feature, within a model as well as
across models (SPEC C6); pure, no Lightning.

For every permutation group (a layer's units, a residual stream) the n models' features are
pooled into one set of n·k features; their Pearson correlations on the alignment subset (summed
over the group's activation points, as :func:`~lmc.permutation.activation_matching` does) drive a
greedy matching that merges the most correlated pair of features, from two models or from the
same one, until k features are left (ZipIt! Alg. 1, "zip"):

* ``alpha``: after a merge, the merged feature's correlations are the minimum of its members'
  times ``alpha``; ``alpha <= 0`` forbids a merged feature to merge again with features of the
  models it came from.
* ``beta``: each model may merge two of its own features ``beta`` times its share of the merges
  (``beta * (n·k - k) / n``, floored); 0 forbids same-model merges.

A group's merge matrix ``M`` (k x n·k) averages each merged feature's members and its unmerge
matrix ``U`` (n·k x k) copies a merged feature back to each member. Every state-dict entry is
zipped through the spec's axes: an axis that produces a group's features (axis 0) is merged
with ``M``, an axis that consumes them (axis >= 1) is unmerged with ``U``, and the n models'
zipped entries are summed -- an entry that produces no group (a classifier's output layer) is
averaged instead. Merged features are ordered by their first member (model 0's order where it
has one), so zipping a model with a permuted copy of itself returns the model.

With no same-model merges (``beta = 0``), no repeated merges (``alpha <= 0``) and two models,
the greedy matching is a bipartite one; ``lmc`` then solves it exactly with the LAP solver (the
greedy picks are its approximation), so that zip equals correlation activation matching
followed by averaging. BatchNorm statistics are zipped like parameters; re-estimate them
(``lmc.evaluation.reset_bn``) before evaluating, as the merge tasks do. Partial zipping (a zipped
trunk with per-model heads) is not built yet.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from lmc.evaluation import batch_inputs
from lmc.interpolation.states import check_compatible
from lmc.merging.contract import MERGE_METHODS, Merged, MergeInputs
from lmc.merging.otfusion import group_order, materialize
from lmc.permutation.activation_matching import CrossStatistics, activation_matching
from lmc.permutation.lap import get_solver
from lmc.permutation.spec import PermutationSpec, SpecError, StateDict, identity_permutation


def union_correlations(
    net: nn.Module,
    states: Sequence[StateDict],
    spec: PermutationSpec,
    batches: Iterable[Any],
    groups: Collection[str] | None = None,
) -> dict[str, Tensor]:
    """Group -> the ``(n·k, n·k)`` correlation of the n models' pooled features (model 0's k
    features first), summed over the group's activation points, on the CPU in float64; only
    for ``groups`` when given (the others' points are not hooked)."""
    sizes = spec.sizes(states[0])
    if groups is not None:
        sizes = {g: k for g, k in sizes.items() if g in groups}
    missing = [g for g in sizes if not spec.activations.get(g)]
    if missing:
        raise SpecError(
            f"groups {missing[:5]} have no activation points in the spec; zip needs "
            "spec.activations (built-in and derived specs provide them)"
        )
    models = [materialize(net, s).eval() for s in states]
    points = sorted({p for g in sizes for p in spec.activations[g]})
    captured: list[dict[str, Tensor]] = [{} for _ in models]
    handles = []

    def hook(i: int, name: str):
        def fn(_m: nn.Module, _inp: Any, out: Any) -> None:
            captured[i][name] = out.movedim(1, -1).reshape(-1, out.shape[1])

        return fn

    stats: dict[str, CrossStatistics] = {}
    try:
        for i, model in enumerate(models):
            for p in points:
                handles.append(model.get_submodule(p).register_forward_hook(hook(i, p)))
        with torch.inference_mode():
            for batch in batches:
                x = batch_inputs(batch)
                for model in models:
                    model(x.to(next(model.parameters()).device))
                for p in points:
                    pooled = torch.cat([c.pop(p) for c in captured], dim=1)
                    stats.setdefault(p, CrossStatistics(pooled.shape[1], pooled.device))
                    stats[p].update(pooled, pooled)
    finally:
        for h in handles:
            h.remove()
    if not stats:
        raise ValueError("zip needs the alignment subset: the batches were empty")
    out = {}
    for g, k in sizes.items():
        total = torch.zeros(len(states) * k, len(states) * k, dtype=torch.float64)
        for p in spec.activations[g]:
            if stats[p].n != len(states) * k:
                raise SpecError(
                    f"activation point {p!r} has {stats[p].n // len(states)} channels but group "
                    f"{g!r} has {k}"
                )
            total += stats[p].correlation().cpu()
        out[g] = total
    return out


def zip_clusters(
    corr: Tensor, num_models: int, alpha: float = 0.3, beta: float = 0.125
) -> list[list[int]]:
    """ZipIt!'s greedy matching of ``n·k`` pooled features into ``k`` merged ones.

    Args:
        corr: ``(n·k, n·k)`` correlations of the pooled features (model ``i``'s features at
            ``i·k .. (i+1)·k - 1``).
        num_models: n.
        alpha: weight of a merged feature's correlations (``<= 0``: it cannot merge again with
            features of its members' models).
        beta: each model's budget of same-model merges, as a fraction of its share.

    Returns:
        The k merged features as sorted lists of pooled indices, ordered by first member.
    """
    total = corr.shape[0]
    k = total // num_models
    if k * num_models != total or corr.shape != (total, total):
        raise ValueError(f"expected a square correlation of {num_models} x k features")
    origin = torch.arange(total) // k
    if num_models == 2 and alpha <= 0 and beta <= 0:  # a bipartite matching: solved exactly
        solve, _ = get_solver("scipy")
        perm = solve(-corr[:k, k:].numpy()).perm
        return [[i, k + int(perm[i])] for i in range(k)]
    sims = corr.clone().double()
    sims.fill_diagonal_(-torch.inf)
    members = [[i] for i in range(total)]
    alive = torch.ones(total, dtype=torch.bool)
    budget = [int((total - k) / num_models * beta + 1e-4)] * num_models
    for m in range(num_models):
        if budget[m] <= 0:
            block = origin == m
            sims[block[:, None] & block[None, :]] = -torch.inf
    for _ in range(total - k):
        best = int(sims.argmax())
        r, c = sorted(divmod(best, total))
        if not torch.isfinite(sims[r, c]):
            raise ValueError(
                "zip cannot merge the features down to one model's width under these alpha and "
                "beta (every remaining pair is forbidden); raise beta or alpha"
            )
        same = origin[r] == origin[c]
        members[r] += members[c]
        alive[c] = False
        merged = torch.minimum(sims[r], sims[c])
        if alpha > 0:
            merged *= alpha
        else:
            merged[(origin == origin[r]) | (origin == origin[c])] = -torch.inf
        merged[~alive] = -torch.inf
        merged[r] = -torch.inf
        sims[r], sims[:, r] = merged, merged
        sims[c], sims[:, c] = -torch.inf, -torch.inf
        if same:
            budget[int(origin[r])] -= 1
            if budget[int(origin[r])] <= 0:
                block = (origin == origin[r]) & alive
                sims[block[:, None] & block[None, :]] = -torch.inf
    clusters = [sorted(members[i]) for i in range(total) if alive[i]]
    return sorted(clusters, key=lambda c: c[0])


def merge_matrices(clusters: Sequence[Sequence[int]], total: int) -> tuple[Tensor, Tensor]:
    """``(M, U)``: ``M`` (k x n·k) averages each merged feature's members, ``U`` (n·k x k)
    copies it back to each of them."""
    unmerge = torch.zeros(total, len(clusters), dtype=torch.float64)
    for j, c in enumerate(clusters):
        unmerge[list(c), j] = 1.0
    merge = (unmerge / unmerge.sum(0, keepdim=True)).T
    return merge, unmerge


def _names(inputs: MergeInputs) -> list[str]:
    return [f"model {i}" for i in range(len(inputs.states))]


def check_zippable(net: nn.Module, spec: PermutationSpec) -> None:
    """Refuse, before any work, an entry zip cannot place: one that carries a group's features
    on a later axis but none on axis 0 is taken as a consumer of them (a Linear/Conv weight, as
    a classifier's); anything else there (a positional embedding, a class token) produces them,
    which the zip rule does not handle yet.

    Raises:
        SpecError: naming the entry, its group and the module it belongs to.
    """
    for key, axes in spec.axes.items():
        if not axes or axes[0] is not None or all(a is None for a in axes[1:]):
            continue
        prefix, _, name = key.rpartition(".")
        module = net.get_submodule(prefix) if prefix else net
        consumer = name == "weight" and isinstance(module, (nn.Linear, nn.modules.conv._ConvNd))
        if not consumer:
            group = next(a for a in axes[1:] if a is not None)
            raise SpecError(
                f"zip cannot place {key!r} ({type(module).__name__}): it carries group {group!r} "
                "on a later axis but is not a Linear/Conv weight consuming it (e.g. a positional "
                "embedding or class token); zip handles networks whose features are produced on "
                "axis 0 (MLP, VGG, ResNet and derived specs without such entries)"
            )


def _mapped(
    t: Tensor,
    i: int,
    axes: Sequence[str | None],
    sizes: Mapping[str, int],
    maps: Mapping[str, tuple[Tensor, Tensor]],
) -> Tensor:
    """Model ``i``'s entry with every axis of a zipped group mapped: axis 0 merged with ``M``,
    a later axis unmerged with ``U`` (both restricted to model ``i``'s block)."""
    t = t.double()
    for axis, g in enumerate(axes):
        if g is None or g not in maps:
            continue
        k = sizes[g]
        merge, unmerge = maps[g]
        block = slice(i * k, (i + 1) * k)
        a = merge[:, block] if axis == 0 else unmerge[block, :].T  # (k, k) either way
        t = torch.movedim(torch.tensordot(a.to(t.device), t, dims=([1], [axis])), 0, axis)
    return t


def zip_states(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    maps: Mapping[str, tuple[Tensor, Tensor]],
) -> dict[str, Tensor]:
    """The n models zipped with the ``(M, U)`` of the groups in ``maps`` (see the module
    docstring).

    With every group zipped: the merged model's state. With only the first groups zipped (a
    trunk, partial zipping): the state of a :class:`~lmc.models.MultiHead` of the n models
    (``members.{i}.{key}``): an entry that produces a trunk group is zipped (equal in every
    member), every other entry is model ``i``'s own, its inputs from the trunk unmerged.
    """
    n = len(states)
    sizes = spec.sizes(states[0])
    full = set(maps) >= set(sizes)
    out: dict[str, Tensor] = {}
    for key, ref in states[0].items():
        axes = spec.axes.get(key, (None,) * ref.ndim)
        if not ref.is_floating_point():
            own = [s[key].clone() for s in states]
        elif full or axes[0] in maps:
            # n >= 2 models: a tensor, never sum's 0 start
            zipped = cast(
                Tensor, sum(_mapped(s[key], i, axes, sizes, maps) for i, s in enumerate(states))
            )
            if axes[0] is None:  # produces no group: the models' outputs are averaged
                zipped = zipped / n
            own = [zipped.to(ref.dtype)] * n
        else:
            own = [
                _mapped(s[key], i, axes, sizes, maps).to(ref.dtype) for i, s in enumerate(states)
            ]
        if full:
            out[key] = own[0]
        else:
            out.update({f"members.{i}.{key}": t for i, t in enumerate(own)})
    return out


def trunk_groups(spec: PermutationSpec, until: str | int) -> list[str]:
    """The groups zipped by ``zip_until``: the first ``until`` groups in network order (an int)
    or those up to and including group ``until`` (a name).

    Raises:
        SpecError: a residual stream (its group spans the network: there is no cut), an int
            outside ``[1, number of groups]`` or a name that is no group; the message lists the
            groups in order.
    """
    order = group_order(spec)
    streams = [g for g in order if len(spec.activations.get(g, ())) > 1]
    if streams:
        raise SpecError(
            f"zip_until cuts a network whose groups follow one another (MLP, VGG); groups "
            f"{streams[:3]} are residual streams spanning the network: zip it whole"
        )
    if isinstance(until, bool) or not isinstance(until, (int, str)):
        raise SpecError(f"zip_until must be a group name or a depth, got {until!r}")
    if isinstance(until, int):
        if not 1 <= until <= len(order):
            raise SpecError(
                f"zip_until={until} is past the network's {len(order)} groups (or below 1); "
                f"groups in order: {', '.join(order)}"
            )
        return order[:until]
    if until not in order:
        raise SpecError(f"zip_until={until!r} names no group; groups in order: {', '.join(order)}")
    return order[: order.index(until) + 1]


@MERGE_METHODS.register("zip", needs=("net", "align_batches"), paper="ZipIt!, Stoica et al. 2024")
def zip_merge(
    inputs: MergeInputs,
    *,
    alpha: float = 0.3,
    beta: float = 0.125,
    zip_until: str | int | None = None,
) -> Merged:
    """ZipIt! (Stoica et al. 2024) as a merge method: every group zipped from the models'
    feature correlations on the alignment subset (``alpha``, ``beta``: see
    :func:`zip_clusters`; the defaults are ZipIt!'s code's). ``zip_until`` (a group name or a
    depth; :func:`trunk_groups`) zips only the groups up to it (ZipIt! §4.4, partial zipping):
    the merged model is then a :class:`~lmc.models.MultiHead` (``Merged.heads`` = n) whose
    members share the zipped trunk and keep their own later layers, their outputs averaged.
    Diagnostics: per group the fraction of merged features holding two features of one model
    (``same_model/{group}``)."""
    net = inputs.need("net", "zip")
    check_compatible([net.state_dict(), *inputs.states], ["the net", *_names(inputs)])
    check_zippable(net, inputs.spec)
    trunk = trunk_groups(inputs.spec, zip_until) if zip_until is not None else None
    batches = inputs.need("align_batches", "zip")
    corr = union_correlations(net, inputs.states, inputs.spec, batches, trunk)
    n = len(inputs.states)
    maps, diagnostics = {}, {}
    for g, c in corr.items():
        clusters = zip_clusters(c, n, alpha, beta)
        k = c.shape[0] // n
        same = [len({i // k for i in cl}) < len(cl) for cl in clusters]
        diagnostics[f"same_model/{g}"] = float(np.mean(same))
        maps[g] = merge_matrices(clusters, c.shape[0])
    full = set(maps) >= set(inputs.spec.sizes(inputs.states[0]))  # as zip_states decides
    return Merged(zip_states(inputs.states, inputs.spec, maps), None, diagnostics, 0 if full else n)


@MERGE_METHODS.register(
    "permute", needs=("net", "align_batches"), paper="ZipIt!'s permute baseline, Stoica et al. 2024"
)
def permute_merge(inputs: MergeInputs) -> Merged:
    """ZipIt!'s "Permute" baseline: every model's features matched to the reference model's by
    the correlation of their activations on the alignment subset (one assignment per group,
    :func:`~lmc.permutation.activation_matching` with ``similarity="correlation"``), then the
    permuted models averaged. Diagnostics: the mean matched correlation per group and model
    (``correlation/model{i}/{group}``)."""
    net = inputs.need("net", "permute")
    check_compatible([net.state_dict(), *inputs.states], ["the net", *_names(inputs)])
    batches = inputs.need("align_batches", "permute")
    ref = materialize(net, inputs.states[inputs.reference])
    device = next(iter(inputs.states[inputs.reference].values())).device
    perms, diagnostics = [], {}
    for i, state in enumerate(inputs.states):
        if i == inputs.reference:
            perms.append(identity_permutation(inputs.spec.sizes(state), device))
            continue
        res = activation_matching(
            ref, materialize(net, state), batches, inputs.spec, similarity="correlation"
        )
        perms.append(res.perm)
        diagnostics.update({f"correlation/model{i}/{g}": v for g, v in res.similarity.items()})
    return Merged.from_perms(inputs.states, inputs.spec, perms, diagnostics)


def _check_zip_options(options: dict[str, Any], spec: PermutationSpec | None, field: str) -> None:
    """``zip_until`` one of the network's groups or depths, when its spec is known; before any
    model is merged (``alpha`` and ``beta``, ZipIt!'s fractions, are kept in [0, 1] by
    :data:`lmc.merging.contract.OPTION_RANGES`)."""
    until = options.get("zip_until")
    if until is not None and spec is not None:
        try:
            trunk_groups(spec, until)
        except SpecError as err:
            raise ValueError(f"{field}.zip_until: {err}") from None


class _ChecksOptions(Protocol):
    """A merge method with its own check of its options (read by ``contract.check_options``)."""

    check_options: Callable[[dict[str, Any], PermutationSpec | None, str], None]


# the check as an attribute of zip_merge (the cast: a function object takes any attribute)
cast(_ChecksOptions, zip_merge).check_options = _check_zip_options
