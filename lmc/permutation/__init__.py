"""Permutation symmetry and neuron matching (SPEC C2, C3); pure PyTorch/NumPy/SciPy.

* specs: :class:`PermutationSpec`, :func:`spec_for` (built-ins), :func:`derive_spec` (torch.fx);
* :func:`apply_permutation`, :func:`invert_permutation`, :func:`check_spec`;
* :func:`weight_matching` (plain 004 Alg. 2 / accelerated Alg. 3), :func:`align_weights`;
* :func:`activation_matching`, :func:`correlation_alignment` (002 Alg. 1, App. D);
* :func:`merge_many`; pluggable LAP solvers in :mod:`lmc.permutation.lap`;
* the matcher registry :data:`MATCHERS` (:func:`match`) and the config's spec sources
  (:func:`resolve_spec`: ``auto``, ``builtin``, ``derive``, ``package.module:function``).
"""

from lmc.permutation.activation_matching import (
    ActivationMatchingResult,
    CrossStatistics,
    activation_matching,
    correlation_alignment,
)
from lmc.permutation.apply import (
    apply_permutation,
    compose_permutations,
    invert_permutation,
    permutation_equal,
    permute_model_,
)
from lmc.permutation.builtin import (
    has_builtin_spec,
    mlp_spec,
    resnet_spec,
    spec_for,
    tinyten_spec,
    two_layer_spec,
    vgg_spec,
)
from lmc.permutation.check import SpecCheckError, SpecCheckReport, check_spec
from lmc.permutation.derive import SpecDerivationError, derive_spec
from lmc.permutation.lap import LapSolution, available_solvers, register_solver
from lmc.permutation.matchers import MATCHERS, Matching, match
from lmc.permutation.merge_many import MergeManyResult, merge_many
from lmc.permutation.source import SPEC_SOURCES, check_spec_source, resolve_spec
from lmc.permutation.spec import (
    Permutation,
    PermutationSpec,
    SpecError,
    identity_permutation,
    random_permutation,
)
from lmc.permutation.weight_matching import (
    MatchingState,
    WeightMatchingResult,
    align_weights,
    weight_matching,
)

__all__ = [
    "MATCHERS",
    "Matching",
    "SPEC_SOURCES",
    "check_spec_source",
    "has_builtin_spec",
    "match",
    "resolve_spec",
    "ActivationMatchingResult",
    "CrossStatistics",
    "LapSolution",
    "MatchingState",
    "MergeManyResult",
    "Permutation",
    "PermutationSpec",
    "SpecCheckError",
    "SpecCheckReport",
    "SpecDerivationError",
    "SpecError",
    "WeightMatchingResult",
    "activation_matching",
    "align_weights",
    "apply_permutation",
    "available_solvers",
    "check_spec",
    "compose_permutations",
    "correlation_alignment",
    "derive_spec",
    "identity_permutation",
    "invert_permutation",
    "merge_many",
    "mlp_spec",
    "permutation_equal",
    "permute_model_",
    "random_permutation",
    "register_solver",
    "resnet_spec",
    "spec_for",
    "tinyten_spec",
    "two_layer_spec",
    "vgg_spec",
    "weight_matching",
]
