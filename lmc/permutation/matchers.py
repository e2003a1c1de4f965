"""The matcher registry: how models are aligned before they are interpolated or merged.

Every matcher has one signature, of which it declares the keywords it uses::

    matcher(net, states, spec, *, batches=None, seed=0) -> Matching

``states`` are N >= 2 full state dicts of ``net``'s architecture; the result holds one
permutation per state (``apply_permutation(states[i], spec, perms[i])`` aligns model ``i``)
and scalar diagnostics. Registered here: ``none`` (identities), ``weight`` (accelerated weight
matching of model 1 to model 0, 004 Alg. 3; MergeMany for N > 2), ``activation``
(cross-covariance of activations) and ``correlation`` (002 Alg. 1), the two data-driven ones
aligning every model to model 0 on ``batches``. A new matcher is one function decorated with
``@MATCHERS.register("name")`` in a module imported by :mod:`lmc.permutation`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from lmc.io import load_state
from lmc.permutation.activation_matching import Similarity, activation_matching
from lmc.permutation.apply import apply_permutation
from lmc.permutation.merge_many import merge_many
from lmc.permutation.spec import Permutation, PermutationSpec, identity_permutation
from lmc.permutation.weight_matching import weight_matching
from lmc.registry import Registry, declared

StateDict = Mapping[str, Tensor]


@dataclass
class Matching:
    """One permutation per model (identity for the model matched to) and diagnostics."""

    perms: list[Permutation]
    info: dict[str, float] = field(default_factory=dict)

    def apply(self, states: Sequence[StateDict], spec: PermutationSpec) -> list[dict[str, Tensor]]:
        """``[pi_i(states[i])]``: every model aligned."""
        return [apply_permutation(s, spec, p) for s, p in zip(states, self.perms)]


MATCHERS: Registry = Registry(
    "matcher", "matcher(net, states, spec, *, batches=None, seed=0) -> Matching"
)


def match(
    name: str,
    net: nn.Module,
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    batches: Sequence[Any] | None = None,
    seed: int = 0,
) -> Matching:
    """Run the matcher registered as ``name`` (its errors list the registered names)."""
    if len(states) < 2:
        raise ValueError(f"matching needs at least 2 models, got {len(states)}")
    fn = MATCHERS.get(name)
    return fn(net, states, spec, **declared(fn, batches=batches, seed=seed))


@MATCHERS.register("none")
def no_matching(net: nn.Module, states: Sequence[StateDict], spec: PermutationSpec) -> Matching:
    """Identity permutations: the naive comparison."""
    sizes = spec.sizes(states[0])
    device = next(iter(states[0].values())).device  # the models' device
    return Matching([identity_permutation(sizes, device) for _ in states])


@MATCHERS.register("weight")
def weight_matcher(
    net: nn.Module, states: Sequence[StateDict], spec: PermutationSpec, *, seed: int = 0
) -> Matching:
    """Accelerated weight matching of model 1 to model 0 (004 Alg. 3); for N > 2 MergeMany
    (Ainsworth et al. 2023, App. A.10), every model matched to the mean of the others."""
    if len(states) > 2:
        result = merge_many(list(states), spec, seed=seed)
        return Matching(list(result.perms), {"rounds": float(result.rounds)})
    res = weight_matching(states[0], states[1], spec, method="accelerated", seed=seed)
    ident = identity_permutation(spec.sizes(states[0]), next(iter(states[0].values())).device)
    return Matching(
        [ident, res.perm], {"sweeps": float(res.sweeps), "converged": float(res.converged)}
    )


def _activation(
    net: nn.Module,
    states: Sequence[StateDict],
    spec: PermutationSpec,
    batches: Sequence[Any] | None,
    similarity: Similarity,
    name: str,
) -> Matching:
    if batches is None:
        raise ValueError(f"matcher {name!r} needs data (the alignment subset)")
    model_a, model_b = copy.deepcopy(net), copy.deepcopy(net)
    load_state(model_a, states[0])
    p = next(model_a.parameters(), None)  # where activation_matching runs and answers
    perms = [identity_permutation(spec.sizes(states[0]), p.device if p is not None else None)]
    before, after = [], []
    for state in states[1:]:
        load_state(model_b, state)
        result = activation_matching(model_a, model_b, batches, spec, similarity=similarity)
        perms.append(result.perm)
        n = max(len(result.similarity), 1)
        before.append(sum(result.similarity_before.values()) / n)
        after.append(sum(result.similarity.values()) / n)
    info = {
        "similarity_before": sum(before) / len(before),
        "similarity_after": sum(after) / len(after),
    }
    return Matching(perms, info)


def _data_matcher(similarity: Similarity, name: str, doc: str) -> Callable[..., Matching]:
    def matcher(
        net: nn.Module,
        states: Sequence[StateDict],
        spec: PermutationSpec,
        *,
        batches: Sequence[Any] | None = None,
    ) -> Matching:
        return _activation(net, states, spec, batches, similarity, name)

    matcher.__name__ = matcher.__qualname__ = f"{name}_matcher"
    matcher.__doc__ = doc
    return MATCHERS.register(name)(matcher)


activation_matcher = _data_matcher(
    "covariance",
    "activation",
    "Every model aligned to model 0 by the cross-covariance of activations on ``batches``.",
)
"""Matcher ``activation``: every model aligned to model 0 by the cross-covariance of
activations on ``batches``."""
correlation_matcher = _data_matcher(
    "correlation",
    "correlation",
    "Tatro et al.'s neuron alignment (002 Alg. 1, App. D): every model aligned to model 0 by "
    "the Pearson correlation of post-activations; ``info`` has the mean matched correlation "
    "before and after (``similarity_before``, ``similarity_after``).",
)
"""Matcher ``correlation``: Tatro et al.'s neuron alignment (002 Alg. 1, App. D), every model
aligned to model 0 by the Pearson correlation of post-activations on ``batches``."""
