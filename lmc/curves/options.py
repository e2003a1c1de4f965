"""Option groups of the curve tasks, read from YAML as nested mappings (SPEC C6; 002).

Plain frozen dataclasses, no Lightning: :class:`~lmc.tasks.CurveTask` takes one of each group
as an init argument and :class:`~lmc.tasks.PAMTask` takes the same groups plus
:class:`PAMOptions`, e.g.::

    model:
      class_path: lmc.tasks.CurveTask
      init_args:
        curve: {kind: bezier, order: 2, weight_decay: 0.0005}
        alignment: {method: correlation}
        evaluation: {num_ts: 61, splits: [train, test]}
        batchnorm: {mode: recompute}
        plane: {kind: alignment, size: 21}
        robust: {attack: {eps: 0.0314, steps: 5}}

A group left out takes its defaults; :func:`as_options` turns a mapping of a group's fields
(as a checkpoint's hyper-parameters store it) back into the dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lmc.curves.attack import PGD, as_pgd
from lmc.curves.basis import CurveKind
from lmc.curves.birkhoff import Projection
from lmc.curves.evaluate import BNData, BNMode
from lmc.options import EvaluationOptions, Split, check_choice, set_field

EvalSplit = Split
#: a name of the matcher registry (lmc.permutation.MATCHERS): ``none``, ``correlation``, ...
AlignmentMethod = str
PlaneKind = Literal["none", "alignment", "curve"]


@dataclass(frozen=True)
class CurveOptions:
    """The curve between the endpoints and the L2 penalty of its training (002 eq. 7, Alg. 2).

    Args:
        kind: ``bezier`` (Bernstein basis) or ``polychain`` (Garipov et al.'s polygonal chain).
        order: curve order (2: quadratic Bezier / one-bend chain; 1: the straight line).
        weight_decay: coefficient of the penalty ``weight_decay / 2 * |w(t)|^2`` on the sampled
            point (Garipov et al.'s recipe; keep the optimizer's own weight decay at 0).
    """

    kind: CurveKind = "bezier"
    order: int = 2
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_choice("curve.kind", self.kind, ("bezier", "polychain"))
        if self.order < 1 or self.weight_decay < 0:
            raise ValueError(
                f"need curve.order >= 1 and curve.weight_decay >= 0, got order={self.order}, "
                f"weight_decay={self.weight_decay}"
            )


@dataclass(frozen=True)
class AlignmentOptions:
    """How the second endpoint is aligned to the first before the curve starts (002 Alg. 1).

    Args:
        method: a registered matcher (:data:`lmc.permutation.MATCHERS`) run on the alignment
            subset: ``correlation`` (002 App. D), ``none``, or any other (``weight``,
            ``activation``, one registered by a user). Required whenever the group is given,
            so that a partial group never silently changes a task's default.
        batches: batches of the alignment subset used for matching (``None``: all).
    """

    method: AlignmentMethod
    batches: int | None = None

    def __post_init__(self) -> None:
        from lmc.permutation.matchers import MATCHERS

        MATCHERS.check(self.method, "alignment.method")


@dataclass(frozen=True)
class CurveEvaluationOptions(EvaluationOptions):
    """Where and on what the curve is evaluated (002 §4: 61 values of t): the ``splits`` and
    ``max_batches`` of :class:`lmc.options.EvaluationOptions`, plus

    Args:
        num_ts: points of the uniform t grid, endpoints included.
        at_fit_end: evaluate the curve when ``fit`` ends.
        robust_splits: splits also evaluated under attack when ``robust.attack`` is set.
    """

    num_ts: int = 61
    at_fit_end: bool = True
    robust_splits: list[EvalSplit] = field(default_factory=lambda: ["test"])

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_ts < 2:
            raise ValueError(f"evaluation.num_ts must be at least 2, got {self.num_ts}")
        set_field(self, "robust_splits", list(self.robust_splits or ()) or ["test"])


@dataclass(frozen=True)
class BatchNormOptions:
    """BatchNorm statistics of a point on the curve (002 App. B).

    Args:
        mode: ``recompute`` the statistics at every t on the alignment subset, or
            ``interpolate`` the endpoints' statistics.
        batches: batches of the alignment subset used for recomputing (``None``: all).
        data: with ``robust.attack``, recompute on ``clean`` or ``adversarial`` batches.
    """

    mode: BNMode = "recompute"
    batches: int | None = None
    data: BNData = "clean"

    def __post_init__(self) -> None:
        check_choice("batchnorm.mode", self.mode, ("recompute", "interpolate"))
        check_choice("batchnorm.data", self.data, ("clean", "adversarial"))


@dataclass(frozen=True)
class PlaneOptions:
    """The loss/accuracy plane evaluated after the curve (002 Fig. 3).

    Args:
        kind: ``none``; ``alignment``: the plane through ``theta_1, theta_2, P theta_2``;
            ``curve``: through ``theta_1, theta_2`` and the middle control point.
        size: grid points per plane axis.
        margin: relative padding around the models on the plane.
    """

    kind: PlaneKind = "none"
    size: int = 11
    margin: float = 0.2

    def __post_init__(self) -> None:
        check_choice("plane.kind", self.kind, ("none", "alignment", "curve"))
        if self.size < 2:
            raise ValueError(f"plane.size must be at least 2, got {self.size}")


@dataclass(frozen=True)
class RobustOptions:
    """Robust curves (002 §5): PGD during training and evaluation.

    Args:
        attack: the PGD settings; ``None`` trains and evaluates clean.
        adversarial_training: with ``attack``, train the curve on PGD examples at each ``w(t)``.
        pixel_space: attack in [0, 1] pixel space using the data module's mean/std.
    """

    attack: PGD | None = None
    adversarial_training: bool = True
    pixel_space: bool = True

    def __post_init__(self) -> None:
        set_field(self, "attack", as_pgd(self.attack))


@dataclass(frozen=True)
class PAMOptions:
    """Proximal Alternating Minimization of curve and permutation (002 App. E).

    Args:
        outer_iterations: cycles of a permutation phase followed by a curve phase.
        perm_epochs: epochs of the permutation subproblem per cycle.
        curve_epochs: epochs of the curve subproblem per cycle.
        perm_lr: learning rate of projected SGD on the doubly-stochastic matrices (E.2).
        projection_iters: iterations of the projection onto the Birkhoff polytope per step.
        projection: ``alternating`` projections or ``sinkhorn`` normalisation.
        bvn_terms: terms of the truncated greedy Birkhoff-von Neumann decompositions (E.4).
        bvn_samples: permutations sampled from them at each rounding.
        prox_perm: proximal weight ``|D - P^k|^2`` of the permutation subproblem.
        prox_curve: proximal weight ``|offset - offset^k|^2`` of the curve subproblem.
        select_batches: batches of the alignment subset that score the rounding candidates.
        select_ts: interior values of t at which the candidates are scored.
        seed: seed of the BvN sampling.
    """

    outer_iterations: int = 1
    perm_epochs: int = 20
    curve_epochs: int = 250
    perm_lr: float = 0.01
    projection_iters: int = 20
    projection: Projection = "alternating"
    bvn_terms: int = 10
    bvn_samples: int = 32
    prox_perm: float = 0.0
    prox_curve: float = 0.0
    select_batches: int = 4
    select_ts: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.outer_iterations < 1 or self.perm_epochs < 0 or self.curve_epochs < 0:
            raise ValueError(
                "need pam.outer_iterations >= 1, pam.perm_epochs >= 0 and pam.curve_epochs >= 0, "
                f"got {self.outer_iterations}, {self.perm_epochs}, {self.curve_epochs}"
            )
        check_choice("pam.projection", self.projection, ("alternating", "sinkhorn"))
