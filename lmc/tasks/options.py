"""Option groups shared by the tasks, read from YAML as nested mappings (as
:mod:`lmc.curves.options` does for the curve tasks), e.g.::

    model:
      class_path: lmc.tasks.MergeTask
      init_args:
        evaluation: {splits: [train, test], pairwise: true, sharpness_probes: 10}

    model:
      class_path: lmc.tasks.OTFusionTask
      init_args:
        otfusion: {metric: activation, prune_rate: 0.5, prune_strategy: finetune_once}

A group left out takes its defaults; a study's grid sets one field by its dotted key
(``model.init_args.otfusion.prune_rate``). The groups of a registered merge method
(:class:`OTFusionOptions`, :class:`FedMAOptions`) are its keyword options, field for field
(a test holds them equal), so a task passes them on as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from lmc.interpolation.barrier import alpha_grid
from lmc.interpolation.study import Repair
from lmc.merging.otfusion import Metric, PruneStrategy
from lmc.options import EvaluationOptions


def moved_into(group: str, cls: type, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """``{field: group.field}`` for every field of the option group ``cls``: a task's
    ``moved_keys`` for keys that were its own before they were grouped (an old config then
    gets an error naming the new key; :mod:`lmc.engine.moved`)."""
    return {f.name: f"{group}.{f.name}" for f in fields(cls) if f.name not in exclude}


@dataclass(frozen=True)
class PathEvaluationOptions(EvaluationOptions):
    """How a linear path between models is evaluated: as :class:`EvaluationOptions`, plus

    Args:
        num_alphas: points of the alpha grid (including both endpoints).
        repair: the interpolated models' statistics: ``none``, ``reset_bn`` (BatchNorm
            statistics re-estimated on the alignment subset) or ``repair`` (REPAIR, Jordan et
            al. 2023, for networks without BatchNorm).
    """

    num_alphas: int = 25
    repair: Repair = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        alpha_grid(self.num_alphas)  # a grid without interior points is refused before work
        if self.repair not in ("none", "reset_bn", "repair"):
            raise ValueError(
                f"evaluation.repair must be none, reset_bn or repair, got {self.repair!r}"
            )


@dataclass(frozen=True)
class MergeEvaluationOptions(EvaluationOptions):
    """How a merge is evaluated (004 §5, §6): as :class:`EvaluationOptions`, plus

    Args:
        pairwise: also evaluate the midpoint of every pair of permuted models (004 Fig. 4).
        sharpness_probes: Hutchinson probes of tr(H ⊙ θθᵀ) (004 §6.2); 0 turns it off.
        sharpness_batches: alignment batches defining the sharpness loss.
        tasks: the label sets of a disjoint-task split (e.g. ``[[0, 1, 2, 3, 4], [5, 6, 7, 8,
            9]]``): every model is also scored per task, ``{split}/task{j}_acc``, on the task's
            examples with the prediction among its labels (ZipIt!'s per-task accuracy).
    """

    pairwise: bool = True
    sharpness_probes: int = 0
    sharpness_batches: int = 1
    tasks: list[list[int]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sharpness_probes < 0 or self.sharpness_batches < 1:
            raise ValueError(
                "need evaluation.sharpness_probes >= 0 and evaluation.sharpness_batches >= 1, "
                f"got {self.sharpness_probes} and {self.sharpness_batches}"
            )
        if self.tasks is not None:
            labels = [label for task in self.tasks for label in task]
            if not self.tasks or any(not task for task in self.tasks):
                raise ValueError(
                    f"evaluation.tasks must list label sets, none of them empty; got {self.tasks}"
                )
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in labels):
                raise ValueError(
                    f"evaluation.tasks: labels are class indices >= 0; got {self.tasks}"
                )
            twice = sorted({v for v in labels if labels.count(v) > 1})
            if twice:
                raise ValueError(
                    f"evaluation.tasks: labels {twice} are in more than one task (a disjoint "
                    f"split gives each label one task); got {self.tasks}"
                )

    def check_labels(self, num_classes: int | None) -> None:
        """The ``tasks`` labels are classes of the data (``num_classes``; not known: not
        checked): called before any model is merged.

        Raises:
            ValueError: a label outside ``[0, num_classes)``, naming it.
        """
        if self.tasks is None or num_classes is None:
            return
        out = sorted({v for task in self.tasks for v in task if v >= num_classes})
        if out:
            raise ValueError(
                f"evaluation.tasks: labels {out} are not classes of the data (it has "
                f"{num_classes}: 0 to {num_classes - 1}); got {self.tasks}"
            )


@dataclass(frozen=True)
class OTFusionOptions:
    """The options of the registered ``otfusion`` merge method
    (:func:`lmc.merging.fusion.otfusion_merge`; 000 §5, Table 2).

    Args:
        base: index of the base (target) model (default the first).
        metric: ``weight`` or ``activation`` (on the alignment subset).
        marginals: ``uniform`` or ``activation``.
        target_width: fused width of every group (default the base's).
        allow_shrink: allow a target narrower than the base.
        prune_rate: magnitude-pruning rate before alignment (0: none).
        prune_strategy: ``only_prune``, ``finetune_once`` or ``iterative`` (000 §5). At rate 0,
            ``only_prune`` fuses the dense models as they are and a fine-tuning strategy
            fine-tunes the dense models for its ``prune_rounds`` x ``finetune_epochs`` epochs
            (the fine-tune-only control).
        prune_rounds: rounds of ``iterative``.
        finetune_epochs, finetune_lr: fine-tuning after each pruning (SGD, momentum 0.9, on the
            training split).
    """

    base: int | None = None
    metric: Metric = "weight"
    marginals: str = "uniform"
    target_width: int | None = None
    allow_shrink: bool = False
    prune_rate: float = 0.0
    prune_strategy: PruneStrategy = "only_prune"
    prune_rounds: int = 1
    finetune_epochs: int = 1
    finetune_lr: float = 1e-3


@dataclass(frozen=True)
class FedMAOptions:
    """The options of the registered ``fedma`` merge method
    (:func:`lmc.merging.fusion.fedma_merge`; 000 §5, Tables 4-5).

    Args:
        rounds: communication rounds (000 Table 4: 9).
        epochs: local epochs after each layer's matching and per later round (000 Table 4: 20).
        lr, momentum, weight_decay: the clients' SGD (000 Table 4: lr 0.1).
        sigma, sigma0, gamma: BBP-MAP matching settings.
        max_width: cap on a global layer's width, a multiple of the client width.
        prune_rate: magnitude-pruning rate before each matching (0: none; 000 Table 5: 0.1-0.5).
    """

    rounds: int = 1
    epochs: int = 1
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    sigma: float = 1.0
    sigma0: float = 1.0
    gamma: float = 1.0
    max_width: float = 1.5
    prune_rate: float = 0.0


@dataclass(frozen=True)
class ClientOptions:
    """FedMA's clients (000 §5): a Dirichlet non-IID split of the training data.

    Args:
        clients: number of clients J.
        alpha: Dirichlet concentration of the label split.
        local_epochs: epochs each client trains before the first matching.
        batch_size: the clients' batch size (000 Table 4: 20).
    """

    clients: int = 5
    alpha: float = 0.5
    local_epochs: int = 1
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.clients < 2:
            raise ValueError(f"federated.clients must be >= 2, got {self.clients}")
        if not self.alpha > 0:
            raise ValueError(f"federated.alpha must be > 0, got {self.alpha}")
