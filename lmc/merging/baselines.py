"""Input checks and the multi-model matching baselines of 004 §3 and §5 (pure, no Lightning).

* :func:`check_models`: the models to merge are at least two, of ``net``'s architecture, and fit
  the permutation spec; raises before any work.
* :func:`wm_to_reference`: every model weight-matched to one reference model independently
  (the two-model method applied n - 1 times; 004 §3.1, Fig. 1).
* :func:`merge_many_perms`: MergeMany (Ainsworth et al. 2023, App. A.10; 004 §5), each model
  matched to the mean of the others until the total distance stops falling.
* the ``naive``, ``wm_ref`` and ``mergemany`` entries of :data:`~lmc.merging.MERGE_METHODS`
  (:mod:`lmc.merging.contract`): each a function ``(states, spec, *, keys, reference, method,
  seed) -> perms`` registered through :func:`~lmc.merging.contract.by_permutation`.

Permutations are lists with one entry per model; ``apply_permutation(states[i], spec, perms[i])``
gives ``pi_i(theta_i)``. The reference model's permutation is the identity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor, nn

from lmc.interpolation.states import check_compatible
from lmc.merging.contract import MERGE_METHODS, by_permutation
from lmc.permutation import (
    Permutation,
    PermutationSpec,
    SpecError,
    apply_permutation,
    has_builtin_spec,
    identity_permutation,
    merge_many,
    spec_for,
    weight_matching,
)
from lmc.permutation.weight_matching import Method

StateDict = Mapping[str, Tensor]


def check_models(
    net: nn.Module,
    states: Sequence[StateDict],
    spec: PermutationSpec | None = None,
    names: Sequence[str] | None = None,
) -> PermutationSpec | None:
    """Check the models to merge and return the permutation spec they share.

    Args:
        net: the architecture (its state dict is the reference for keys and shapes).
        states: the n models' full state dicts (parameters and buffers).
        spec: the permutation spec; ``spec_for(net)`` (built-in architectures) if omitted and
            ``net`` is built in; for another network without a spec only the keys and shapes
            are checked (and ``None`` is returned).
        names: how to call the models in messages (e.g. checkpoint paths).

    Raises:
        ValueError: fewer than two models, or a model whose keys or shapes differ from ``net``
            (the message names the model and the first differing entry).
        SpecError: the spec does not fit the models (different options or a hand-written spec
            for another network).
    """
    n = len(states)
    if n < 2:
        raise ValueError(
            f"merging needs at least 2 models, got {n}; give two or more checkpoints of one "
            "architecture"
        )
    names = list(names) if names is not None else [f"model {i}" for i in range(n)]
    if len(names) != n:
        raise ValueError(f"got {n} models but {len(names)} names")
    check_compatible([net.state_dict(), *states], ["the configured net", *names])
    if spec is None:
        if not has_builtin_spec(net):
            return None
        spec = spec_for(net)
    for name, state in zip(names, states):
        try:
            spec.sizes(state)
        except SpecError as err:
            raise SpecError(f"{name} does not fit the permutation spec: {err}") from None
    return spec


def parameter_keys(net: nn.Module) -> list[str]:
    """The state-dict keys of ``net``'s parameters (what matching and distances use; the
    BatchNorm running statistics follow the permutation but do not enter the objective)."""
    return [k for k, _ in net.named_parameters()]


def wm_to_reference(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    reference: int = 0,
    keys: Sequence[str] | None = None,
    method: Method = "accelerated",
    seed: int = 0,
) -> list[Permutation]:
    """Weight-match every model to ``states[reference]`` independently (004 §3.1).

    Args:
        states: the models' state dicts.
        spec: their permutation spec.
        reference: index of the model the others are matched to (identity permutation).
        keys: entries entering the matching objective (default: every floating-point entry;
            pass :func:`parameter_keys` to leave BatchNorm statistics out).
        method: ``plain`` or ``accelerated`` weight matching (same optimum up to ties).
        seed: seed of the random group order.

    Returns:
        One permutation per model.
    """
    if not -len(states) <= reference < len(states):
        raise ValueError(f"reference={reference} is not an index into {len(states)} models")
    reference %= len(states)
    sizes = spec.sizes(states[reference])
    keys = list(keys) if keys is not None else None
    sub = spec.restrict(keys) if keys is not None else spec
    ref = _select(states[reference], keys)
    perms: list[Permutation] = []
    for i, state in enumerate(states):
        if i == reference:
            device = next(iter(states[reference].values())).device  # the models' device
            perms.append(identity_permutation(sizes, device))
            continue
        res = weight_matching(ref, _select(state, keys), sub, method=method, seed=seed + i)
        perms.append(res.perm)
    return perms


def naive_perms(states: Sequence[StateDict], spec: PermutationSpec) -> list[Permutation]:
    """Identity permutations: the plain average of the models (no alignment)."""
    sizes = spec.sizes(states[0])
    device = next(iter(states[0].values())).device  # the models' device
    return [identity_permutation(sizes, device) for _ in states]


def merge_many_perms(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    keys: Sequence[str] | None = None,
    method: Method = "accelerated",
    seed: int = 0,
    max_rounds: int = 100,
) -> list[Permutation]:
    """MergeMany's permutations (Ainsworth et al. 2023, App. A.10), one per model.

    A thin wrapper of :func:`lmc.permutation.merge_many` matching only ``keys`` (default every
    floating-point entry); MergeMany treats all models alike (no reference).
    """
    keys = list(keys) if keys is not None else None
    sub = spec.restrict(keys) if keys is not None else spec
    res = merge_many(
        [_select(s, keys) for s in states], sub, method=method, seed=seed, max_rounds=max_rounds
    )
    return res.perms


def align_states(
    states: Sequence[StateDict], spec: PermutationSpec, perms: Sequence[Permutation]
) -> list[dict[str, Tensor]]:
    """``[pi_i(theta_i)]``: every model's full state permuted by its permutation."""
    if len(perms) != len(states):
        raise ValueError(f"got {len(states)} models but {len(perms)} permutations")
    return [apply_permutation(s, spec, p) for s, p in zip(states, perms)]


def _select(state: StateDict, keys: Sequence[str] | None) -> StateDict:
    return state if keys is None else {k: state[k] for k in keys}


MERGE_METHODS.register("naive", paper="the baseline: the plain average, no alignment")(
    by_permutation(naive_perms)
)
# each model of wm_ref is matched on its own: the perms of the first n models are the first n of
# one run over all models, so one call serves every n of a sweep
MERGE_METHODS.register("wm_ref", paper="weight matching, Ainsworth et al. 2023; 004 §3.1")(
    by_permutation(wm_to_reference, nested=True)
)
MERGE_METHODS.register("mergemany", paper="Ainsworth et al. 2023 App. A.10")(
    by_permutation(merge_many_perms)
)
