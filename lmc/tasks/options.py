"""Option groups shared by the tasks, read from YAML as nested mappings (as
:mod:`lmc.curves.options` does for the curve tasks), e.g.::

    model:
      class_path: lmc.tasks.MergeTask
      init_args:
        evaluation: {splits: [train, test], pairwise: true, sharpness_probes: 10}

A group left out takes its defaults; a study's grid sets one field by its dotted key
(``model.init_args.evaluation.pairwise``). A merge method's options are not a group: they
live in its function's signature (``method_options``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from lmc.interpolation.barrier import alpha_grid
from lmc.interpolation.study import Repair
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
