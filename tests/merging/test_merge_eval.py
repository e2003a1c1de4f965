"""Baselines (weight matching to a reference, MergeMany), geometry and merge evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from lmc.interpolation import evaluate
from lmc.merging import (
    Merged,
    MergeInputs,
    align_states,
    describe,
    distance_ratios,
    evaluate_merge,
    evaluate_originals,
    evaluate_sweep,
    merge_many_perms,
    merge_sweep,
    pairwise_distances,
    parameter_keys,
    triplet_angles,
    wm_to_reference,
)
from lmc.models import MLP
from lmc.permutation import apply_permutation, random_permutation, spec_for


def _perms(states, spec, name, num_models, **settings):
    """Each n's permutations of method ``name`` (``settings``: the MergeInputs' own)."""
    sweep = merge_sweep(MergeInputs(states, spec, **settings), name, num_models)
    return {n: merged.perms for n, merged in sweep.items()}


def _copies(net, n):
    spec = spec_for(net)
    base = net.state_dict()
    sizes = spec.sizes(base)
    return (
        spec,
        base,
        [base] + [apply_permutation(base, spec, random_permutation(sizes, i)) for i in range(1, n)],
    )


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("baseline", ["wm_ref", "mergemany"])
def test_baselines_recover_permuted_copies(baseline):
    torch.manual_seed(0)
    net = MLP(12, 4, width=10, depth=3)
    spec, base, models = _copies(net, 4)
    sweep = _perms(models, spec, baseline, [2, 4], keys=parameter_keys(net))
    assert sorted(sweep) == [2, 4] and len(sweep[2]) == 2 and len(sweep[4]) == 4
    for n, perms in sweep.items():
        aligned = align_states(models[:n], spec, perms)
        assert float(pairwise_distances(aligned).max()) == 0.0
    # MergeMany aligns the copies to each other (to a common permutation of base)
    if baseline == "wm_ref":
        assert all(_equal(a, base) for a in align_states(models, spec, sweep[4]))


def test_merge_many_perms_and_wm_to_reference_agree_on_copies():
    net = MLP(12, 4, width=8, depth=2)
    spec, base, models = _copies(net, 3)
    mm = align_states(models, spec, merge_many_perms(models, spec))
    ref = align_states(models, spec, wm_to_reference(models, spec, reference=1))
    assert float(pairwise_distances(mm).max()) == 0.0
    assert all(_equal(r, models[1]) for r in ref)
    naive = _perms(models, spec, "naive", [3])[3]
    assert all(_equal(a, m) for a, m in zip(align_states(models, spec, naive), models))
    with pytest.raises(ValueError, match="unknown merge method"):
        _perms(models, spec, "no_such_method", [3])
    with pytest.raises(ValueError, match="reference=5"):
        wm_to_reference(models, spec, reference=5)


def test_regular_simplex_geometry():
    # the standard basis vectors of R^4 are a regular 3-simplex: equal distances, 60 degrees
    states = [{"w": torch.eye(4)[i]} for i in range(4)]
    d = pairwise_distances(states)
    assert torch.allclose(
        d + torch.eye(4, dtype=d.dtype) * math.sqrt(2), torch.full_like(d, 2**0.5)
    )
    assert distance_ratios(d) == pytest.approx([1.0] * 6)
    angles = triplet_angles(d)
    assert len(angles) == 4 * 3 and angles == pytest.approx([60.0] * 12)


def test_right_triangle_angles_and_ratios():
    pts = [torch.tensor([0.0, 0.0]), torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])]
    d = pairwise_distances([{"p": p} for p in pts])
    assert d[1, 2] == pytest.approx(5.0)
    a = triplet_angles(d)
    assert a[0] == pytest.approx(90.0)
    assert sum(a) == pytest.approx(180.0)
    assert distance_ratios(d) == pytest.approx([3 / 4, 4 / 4, 5 / 4])
    assert describe([1.0, float("nan"), 3.0]) == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    assert distance_ratios(pairwise_distances([{"p": pts[0]}])) == []


def _data(n=3, size=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 12, generator=g), torch.randint(0, 4, (size,), generator=g))
        for _ in range(n)
    ]


def test_merge_of_aligned_copies_has_no_gap():
    torch.manual_seed(0)
    net = MLP(12, 4, width=8, depth=2)
    spec, base, models = _copies(net, 3)
    splits = {"train": _data(seed=1), "test": _data(seed=2)}
    originals = evaluate_originals(
        net, models, splits, sharpness_batches=splits["train"][:1], sharpness_probes=3
    )
    assert len(originals.metrics) == 3 and len(originals.sharpness) == 3
    aligned = align_states(models, spec, wm_to_reference(models, spec))
    ev = evaluate_merge(
        net,
        aligned,
        splits,
        originals,
        method="wm_ref",
        sharpness_batches=splits["train"][:1],
        sharpness_probes=3,
    )
    m = ev.metrics
    assert m["test/loss_gap"] == pytest.approx(0.0, abs=1e-6)
    assert m["test/acc_gap"] == pytest.approx(0.0, abs=1e-9)
    assert m["test/pairwise_loss_gap"] == pytest.approx(0.0, abs=1e-6)
    assert "train/pairwise_loss" not in m  # pairwise on the last split only
    # the merge is model 0 itself, measured with the same probes (the originals' mean is an
    # average over differently permuted copies: equal only in expectation)
    assert m["sharpness"] == pytest.approx(originals.sharpness[0], rel=1e-4)
    assert m["originals_sharpness"] == pytest.approx(sum(originals.sharpness) / 3)
    assert m["distance_mean"] == 0.0 and len(ev.angles) == 3
    net.load_state_dict(base)
    assert m["test/loss"] == pytest.approx(evaluate(net, splits["test"]).loss, rel=1e-5)


def test_naive_merge_of_permuted_copies_is_worse_and_sweep_summary():
    torch.manual_seed(0)
    net = MLP(12, 4, width=8, depth=2)
    spec, _, models = _copies(net, 3)
    models = [{k: v * 3 for k, v in m.items()} for m in models]  # sharper functions
    splits = {"test": _data(seed=2)}
    merges = {m: merge_sweep(MergeInputs(models, spec), m, [2, 3]) for m in ("naive", "wm_ref")}
    # a method that does not permute is evaluated on its merged state alone
    merges["given"] = {3: Merged(merges["wm_ref"][3].state)}
    sweep = evaluate_sweep(net, models, spec, merges, splits, pairwise=False)
    assert [(e.method, e.n) for e in sweep.evaluations] == [
        ("naive", 2),
        ("naive", 3),
        ("wm_ref", 2),
        ("wm_ref", 3),
        ("given", 3),
    ]
    s = sweep.summary()
    assert s["naive/n3/distance_mean"] > 0 and s["wm_ref/n3/distance_mean"] == 0
    assert s["wm_ref/n3/test/loss_gap"] == pytest.approx(0.0, abs=1e-6)
    assert s["naive/n3/test/loss_gap"] != pytest.approx(0.0, abs=1e-3)
    assert "originals/model2/test/acc" in s
    assert s["given/n3/test/loss"] == s["wm_ref/n3/test/loss"]
    assert "given/n3/distance_mean" not in s and "given/n3/angle_mean" not in s
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate_sweep(net, models, spec, {}, splits)


def test_the_ensemble_averages_the_originals_outputs():
    """The output ensemble: of permuted copies it scores as the model; of two models it is
    the accuracy and loss of their averaged outputs, computed by hand; it is reported beside
    every method's merge at that n."""
    torch.manual_seed(0)
    net = MLP(12, 4, width=10, depth=2)
    spec, base, copies = _copies(net, 3)
    splits = {"test": _data(seed=3)}
    stats = evaluate_originals(net, copies, splits)
    ens = stats.ensemble(splits, "cross_entropy")
    assert ens["test/ensemble_acc"] == stats.metrics[0]["test/acc"]
    assert ens["test/ensemble_loss"] == pytest.approx(stats.metrics[0]["test/loss"], abs=1e-6)
    other = MLP(12, 4, width=10, depth=2).state_dict()
    two = evaluate_originals(net, [base, other], splits).ensemble(splits, "cross_entropy")
    x = torch.cat([b[0] for b in splits["test"]])
    y = torch.cat([b[1] for b in splits["test"]])
    probe = MLP(12, 4, width=10, depth=2)  # net's own tensors are the states' (state_dict)
    outs = []
    for state in (base, other):
        probe.load_state_dict(state)
        with torch.no_grad():
            outs.append(probe(x))
    mean = (outs[0] + outs[1]) / 2
    assert two["test/ensemble_acc"] == pytest.approx(float((mean.argmax(1) == y).float().mean()))
    expected = float(torch.nn.functional.cross_entropy(mean, y))
    assert two["test/ensemble_loss"] == pytest.approx(expected, rel=1e-5)
    merges = {"naive": merge_sweep(MergeInputs([base, other], spec), "naive", [2])}
    sweep = evaluate_sweep(net, [base, other], spec, merges, splits, pairwise=False)
    assert sweep.summary()["naive/n2/test/ensemble_acc"] == two["test/ensemble_acc"]


def test_per_task_accuracy_predicts_among_the_tasks_labels():
    """A model whose output always ranks 5 > 6 > ... > 9 > 4 > ... > 0: overall it predicts 5;
    within task 0-4 its head predicts 4, within 5-9 it predicts 5."""
    net = torch.nn.Linear(2, 10)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.tensor([0.0, 1, 2, 3, 4, 9, 8, 7, 6, 5]))
    y = torch.tensor([4, 4, 0, 5, 5, 9])
    splits = {"test": [(torch.zeros(6, 2), y)]}
    tasks = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    stats = evaluate_originals(net, [net.state_dict()], splits, tasks=tasks)
    assert stats.metrics[0]["test/acc"] == pytest.approx(2 / 6)
    assert stats.metrics[0]["test/task0_acc"] == pytest.approx(2 / 3)
    assert stats.metrics[0]["test/task1_acc"] == pytest.approx(2 / 3)
    assert stats.ensemble(splits, "cross_entropy")["test/ensemble_task1_acc"] == pytest.approx(
        2 / 3
    )
