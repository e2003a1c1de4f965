"""Mode-connecting curves, neuron-aligned curves, PAM and robust curves (SPEC C6; 002).

Pure PyTorch/SciPy, no Lightning:

* :class:`Curve` (Bezier of any order, polygonal chain) over any network's state dict, evaluated
  with :func:`forward_at` (``torch.func.functional_call``); :func:`bezier_state`;
* :func:`evaluate_curve` (per-t metrics with BatchNorm re-estimated per t, min / mean /
  arc-length mean), :func:`curve_objective`, :func:`plane_grid` (002 Fig. 3);
* PAM pieces (002 App. E): :func:`project_doubly_stochastic`, :func:`round_to_permutation`,
  :func:`birkhoff_decomposition`, :func:`sample_permutations`, :func:`soft_permute`,
  :func:`round_pam`;
* robustness (002 §5): :class:`PGD`, :func:`pgd_attack`, :func:`adversarial_batches`;
* the tasks' option groups (:mod:`lmc.curves.options`): :class:`CurveOptions`,
  :class:`AlignmentOptions`, :class:`CurveEvaluationOptions`, :class:`BatchNormOptions`,
  :class:`PlaneOptions`, :class:`RobustOptions`, :class:`PAMOptions`.

The LightningModules are :class:`lmc.tasks.CurveTask` and :class:`lmc.tasks.PAMTask`.
"""

from lmc.curves.attack import PGD, adversarial_batches, as_pgd, data_normalization, pgd_attack
from lmc.curves.basis import CurveKind, basis, basis_derivative, interior_basis
from lmc.curves.birkhoff import (
    birkhoff_decomposition,
    permutation_matrix,
    project_doubly_stochastic,
    round_to_permutation,
    sample_permutations,
)
from lmc.curves.curve import Curve, bezier_state, forward_at
from lmc.curves.evaluate import (
    CurveEvaluation,
    arc_length_weights,
    curve_objective,
    evaluate_curve,
    prepare_point_,
    robust_evaluate,
    summarize,
    t_grid,
)
from lmc.curves.options import (
    AlignmentOptions,
    BatchNormOptions,
    CurveEvaluationOptions,
    CurveOptions,
    PAMOptions,
    PlaneOptions,
    RobustOptions,
)
from lmc.curves.pam import (
    PAMRounding,
    pam_candidates,
    permutation_matrices,
    proximal_penalty,
    round_pam,
    soft_permute,
)
from lmc.curves.plane import PlaneResult, plane_grid

__all__ = [
    "PGD",
    "AlignmentOptions",
    "BatchNormOptions",
    "Curve",
    "CurveEvaluation",
    "CurveEvaluationOptions",
    "CurveKind",
    "CurveOptions",
    "PAMOptions",
    "PAMRounding",
    "PlaneOptions",
    "PlaneResult",
    "RobustOptions",
    "adversarial_batches",
    "arc_length_weights",
    "as_pgd",
    "basis",
    "basis_derivative",
    "bezier_state",
    "birkhoff_decomposition",
    "curve_objective",
    "data_normalization",
    "evaluate_curve",
    "forward_at",
    "interior_basis",
    "pam_candidates",
    "permutation_matrices",
    "permutation_matrix",
    "pgd_attack",
    "plane_grid",
    "prepare_point_",
    "project_doubly_stochastic",
    "proximal_penalty",
    "robust_evaluate",
    "round_pam",
    "round_to_permutation",
    "sample_permutations",
    "soft_permute",
    "summarize",
    "t_grid",
]
