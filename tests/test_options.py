"""The option groups shared by the tasks (lmc.options, lmc.tasks.options): defaults, the checks
each group makes when built (naming the option), and mappings read back."""

from __future__ import annotations

import pytest

from lmc.options import EvaluationOptions, as_options
from lmc.tasks.options import MergeEvaluationOptions, PathEvaluationOptions, moved_into


def test_evaluation_defaults_and_normalised_splits():
    assert EvaluationOptions() == EvaluationOptions(["train", "test"], None)
    assert EvaluationOptions(splits=[]).splits == ["train", "test"]  # an empty list: the default
    opts = as_options(MergeEvaluationOptions, {"splits": ["test"], "pairwise": False})
    assert opts.splits == ["test"] and not opts.pairwise and opts.sharpness_probes == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EvaluationOptions(splits=["test", "test"]), "distinct splits"),
        (lambda: EvaluationOptions(splits=["tset"]), "among train, val, test; got \\['tset'\\]"),
        (lambda: EvaluationOptions(max_batches=0), "evaluation.max_batches must be >= 1"),
        (lambda: PathEvaluationOptions(num_alphas=2), "num_alphas >= 3"),
        (lambda: PathEvaluationOptions(repair="reset"), "evaluation.repair must be none"),
        (lambda: MergeEvaluationOptions(sharpness_batches=0), "evaluation.sharpness_batches"),
    ],
)
def test_a_bad_option_is_refused_by_name(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_moved_into_maps_every_field_to_its_group():
    assert moved_into("evaluation", PathEvaluationOptions) == {
        "splits": "evaluation.splits",
        "max_batches": "evaluation.max_batches",
        "num_alphas": "evaluation.num_alphas",
        "repair": "evaluation.repair",
    }


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ([[0, 1, 2], [2, 3]], r"labels \[2\] are in more than one task"),
        ([[0, 1], []], "none of them empty"),
        ([[0, -1]], "class indices >= 0"),
    ],
)
def test_merge_evaluation_tasks_are_disjoint_label_sets(tasks, message):
    """Issue 46: overlapping tasks were accepted (each label scored in two tasks)."""
    from lmc.tasks.options import MergeEvaluationOptions

    with pytest.raises(ValueError, match=message):
        MergeEvaluationOptions(tasks=tasks)


def test_merge_evaluation_tasks_name_labels_the_data_lacks():
    """Issue 46: a label out of range failed after the merge; checked before it now."""
    from lmc.tasks.options import MergeEvaluationOptions

    options = MergeEvaluationOptions(tasks=[[0, 1, 2, 3, 4], [5, 6, 7, 8, 12]])
    with pytest.raises(ValueError, match=r"labels \[12\] are not classes of the data .*0 to 9"):
        options.check_labels(10)
    options.check_labels(None)  # not known: not checked
    MergeEvaluationOptions(tasks=[[0, 1], [2, 3]]).check_labels(10)
