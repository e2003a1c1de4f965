"""The curve tasks' option groups: defaults, mappings from checkpoints, clear errors."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from lmc.curves import (
    PGD,
    AlignmentOptions,
    BatchNormOptions,
    CurveEvaluationOptions,
    CurveOptions,
    PAMOptions,
    PlaneOptions,
    RobustOptions,
)
from lmc.options import as_options


def test_defaults_are_the_former_flat_defaults():
    assert asdict(CurveOptions()) == {"kind": "bezier", "order": 2, "weight_decay": 0.0}
    assert asdict(CurveEvaluationOptions()) == {
        "num_ts": 61,
        "splits": ["train", "test"],
        "max_batches": None,
        "at_fit_end": True,
        "robust_splits": ["test"],
    }
    assert asdict(BatchNormOptions()) == {"mode": "recompute", "batches": None, "data": "clean"}
    assert asdict(PlaneOptions()) == {"kind": "none", "size": 11, "margin": 0.2}
    assert RobustOptions() == RobustOptions(None, True, True)
    pam = PAMOptions()
    assert (pam.outer_iterations, pam.perm_epochs, pam.curve_epochs, pam.perm_lr) == (
        1,
        20,
        250,
        0.01,
    )
    assert (pam.bvn_terms, pam.bvn_samples, pam.select_batches, pam.select_ts) == (10, 32, 4, 5)


def test_alignment_takes_any_registered_matcher(monkeypatch):
    """The endpoints are aligned by a name of the matcher registry, a user's included."""
    from lmc.permutation import MATCHERS

    for name in MATCHERS.names():
        assert AlignmentOptions(name).method == name
    monkeypatch.setitem(MATCHERS._entries, "mine", lambda *a, **k: None)
    assert AlignmentOptions("mine").method == "mine"


def test_as_options_reads_none_mappings_and_class_path_form():
    assert as_options(PlaneOptions, None) == PlaneOptions()
    assert as_options(AlignmentOptions, None, AlignmentOptions("none")).method == "none"
    stored = {"kind": "alignment", "size": 21, "margin": 0.2}
    assert as_options(PlaneOptions, stored) == PlaneOptions("alignment", 21)
    wrapped = {"class_path": "lmc.curves.PlaneOptions", "init_args": stored}
    assert as_options(PlaneOptions, wrapped) == PlaneOptions("alignment", 21)
    robust = as_options(RobustOptions, {"attack": {"eps": 0.1, "steps": 2}})
    assert robust.attack == PGD(eps=0.1, steps=2)
    with pytest.raises(TypeError, match="PlaneOptions"):
        as_options(PlaneOptions, "alignment")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AlignmentOptions("weights"), "alignment.method: unknown matcher 'weights'"),
        (lambda: BatchNormOptions(mode="reset"), "batchnorm.mode"),
        (lambda: PlaneOptions(kind="grid"), "plane.kind"),
        (lambda: CurveEvaluationOptions(num_ts=1), "evaluation.num_ts"),
        (lambda: PAMOptions(outer_iterations=0), "pam.outer_iterations"),
        (lambda: CurveOptions(order=0), "curve.order"),
    ],
)
def test_bad_values_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()
