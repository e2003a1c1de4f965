"""Known answers for interpolation, barriers, BatchNorm reset and REPAIR."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lmc.interpolation import (
    alpha_grid,
    barrier,
    channel_stats,
    check_compatible,
    evaluate,
    interpolate_stats,
    lerp_state,
    load_lerp_,
    loss_barrier,
    repair,
    repair_points,
    reset_bn,
    weighted_average,
)
from lmc.models import MLP, VGG


def _data(n=96, d=12, classes=3, bs=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return [(x[i : i + bs], y[i : i + bs]) for i in range(0, n, bs)]


def test_barrier_of_model_with_itself_is_zero():
    torch.manual_seed(0)
    model = MLP(12, 3, width=16, depth=2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    batches = _data()
    losses, accs = [], []
    for a in alpha_grid(25):
        load_lerp_(model, state, state, a)
        r = evaluate(model, batches)
        losses.append(r.loss)
        accs.append(r.acc)
    b = barrier(alpha_grid(25), losses, accs)
    assert b.loss == pytest.approx(0.0, abs=1e-6) and b.acc == pytest.approx(0.0, abs=1e-12)
    assert b.mean_loss == pytest.approx(losses[0], rel=1e-6)


def test_barrier_formula_on_a_known_bump():
    alphas = alpha_grid(21)
    # chord from 1 to 3 plus a bump of height 0.5 at alpha = 0.25
    losses = [1 + 2 * a + 0.5 * math.exp(-((a - 0.25) ** 2) / 0.001) for a in alphas]
    b = barrier(alphas, losses, accs=[0.9 - 0.2 * (a == 0.5) for a in alphas])
    assert b.loss == pytest.approx(0.5, abs=1e-9) and b.alpha_loss == 0.25
    assert b.loss_normalized == pytest.approx(0.5 / 2.0)
    assert b.acc == pytest.approx(0.2) and b.alpha_acc == 0.5


def test_barrier_of_a_convex_path_is_zero_never_negative():
    alphas = alpha_grid(5)
    value, _ = loss_barrier(alphas, [1.0, 0.2, 0.1, 0.2, 1.0])
    assert value == pytest.approx(0.0)  # the endpoints are on the chord
    value, where = loss_barrier([0.0, 0.5, 1.0], [1.0, 0.4, 1.0])
    assert value == pytest.approx(0.0) and where == 0.0
    with pytest.raises(ValueError, match="start at 0"):
        loss_barrier([0.1, 1.0], [1.0, 1.0])


def test_barrier_definitions_on_a_path_below_the_chord():
    """A path that dips below the chord (as at initialisation, 000 §4.1): ``chord`` reads 0,
    ``abs_chord`` (000 Def. 2.1) the largest dip; both are kept whichever is chosen."""
    alphas = alpha_grid(21)
    # chord from 2 to 4 minus a dip of depth 0.3 * 4 a (1 - a): 0.3 at alpha = 0.5
    losses = [2 + 2 * a - 1.2 * a * (1 - a) for a in alphas]
    accs = [0.5 + 0.1 * a * (1 - a) for a in alphas]  # above its chord by 0.025 at 0.5
    chord = barrier(alphas, losses, accs)
    absolute = barrier(alphas, losses, accs, "abs_chord")
    assert chord.loss == pytest.approx(0.0, abs=1e-12)
    assert absolute.loss == pytest.approx(0.3, abs=1e-12) and absolute.alpha_loss == 0.5
    assert absolute.loss_normalized == pytest.approx(0.3 / 3.0, abs=1e-12)
    assert chord.acc == pytest.approx(0.0) and absolute.acc == pytest.approx(0.025)
    for b in (chord, absolute):
        assert b.loss_chord == pytest.approx(0.0, abs=1e-12)
        assert b.loss_abs_chord == pytest.approx(0.3, abs=1e-12)
        assert b.loss_normalized_chord == pytest.approx(0.0, abs=1e-12)
        assert b.loss_normalized_abs_chord == pytest.approx(0.1, abs=1e-12)
    # above the chord the two agree: the bump's height
    bump = [1 + 2 * a + 0.5 * math.exp(-((a - 0.25) ** 2) / 0.001) for a in alphas]
    assert barrier(alphas, bump, definition="abs_chord").loss == pytest.approx(0.5, abs=1e-9)
    value, where = loss_barrier(alphas, losses, "abs_chord")
    assert (value, where) == (pytest.approx(0.3), 0.5)


def test_unknown_barrier_definition_names_both():
    with pytest.raises(ValueError, match="'chord'.*'abs_chord'"):
        barrier([0.0, 0.5, 1.0], [1.0, 2.0, 1.0], definition="max")
    with pytest.raises(ValueError, match="abs_chord"):
        loss_barrier([0.0, 0.5, 1.0], [1.0, 2.0, 1.0], "absolute")


def test_mean_loss_is_the_trapezoidal_integral_not_the_plain_mean():
    # L = [0, 0, 1] on [0, 0.5, 1]: trapezoid 0.25, plain mean 1/3
    assert barrier([0.0, 0.5, 1.0], [0.0, 0.0, 1.0]).mean_loss == pytest.approx(0.25, abs=1e-12)
    # L = alpha^2 on 5 points: trapezoid 11/32 (exact integral 1/3, plain mean 0.375)
    alphas = alpha_grid(5)
    b = barrier(alphas, [a * a for a in alphas])
    assert b.mean_loss == pytest.approx(11 / 32, abs=1e-12)


def test_normalized_barrier_is_undefined_for_near_zero_endpoint_loss():
    assert math.isnan(barrier([0.0, 0.5, 1.0], [1e-6, 0.14, 2e-6]).loss_normalized)
    just = barrier([0.0, 0.5, 1.0], [1e-3, 0.5e-3, 1e-3])
    assert just.loss_normalized == pytest.approx(0.0)  # at the threshold it is defined


def test_alpha_grid_needs_an_interior_point():
    assert alpha_grid(3) == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="at least 3 points.*num_alphas >= 3"):
        alpha_grid(2)


def test_lerp_endpoints_and_midpoint():
    a, b = MLP(4, 2, 3, 1).state_dict(), MLP(4, 2, 3, 1).state_dict()
    assert all(torch.equal(lerp_state(a, b, 0.0)[k], a[k]) for k in a)
    assert all(torch.equal(lerp_state(a, b, 1.0)[k], b[k]) for k in a)
    mid = lerp_state(a, b, 0.5)
    assert all(torch.allclose(mid[k], (a[k] + b[k]) / 2) for k in a)


def test_merging_n_copies_returns_the_model():
    net = VGG(11, width=0.125, norm="batch")
    state = net.state_dict()
    merged = weighted_average([state] * 5)
    for k, v in state.items():
        assert (
            torch.allclose(merged[k], v.to(merged[k].dtype))
            if v.is_floating_point()
            else torch.equal(merged[k], v)
        )


def test_incompatible_states_name_the_key():
    with pytest.raises(ValueError, match="layers.0.weight"):
        check_compatible(
            [MLP(4, 2, 3, 1).state_dict(), MLP(4, 2, 5, 1).state_dict()], ["a.ckpt", "b.ckpt"]
        )
    with pytest.raises(ValueError, match="different architectures"):
        check_compatible([MLP(4, 2, 3, 1).state_dict(), MLP(4, 2, 3, 2).state_dict()])


def test_reset_bn_gives_exact_statistics_of_the_subset_even_with_unequal_batches():
    torch.manual_seed(0)
    model = MLP(12, 3, width=8, depth=1, norm="batch")
    x = torch.randn(70, 12) * 3 + 1
    batches = [(x[:32], None), (x[32:64], None), (x[64:], None)]  # 32, 32, 6
    reset_bn(model, batches)
    pre = model.layers[0](x)
    bn = model.norms[0]
    torch.testing.assert_close(bn.running_mean, pre.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_var, pre.var(0, unbiased=True), rtol=1e-4, atol=1e-5)
    assert not model.training


def test_study_keeps_the_matched_merge_as_evaluated_with_bn_reset(device):
    """N > 2: the merge a study reports (and `save_matched` writes) carries the reset statistics.
    On ``device``: models and batches there, as `lmc validate` holds them on its accelerator."""
    from lmc.interpolation.study import interpolation_study

    torch.manual_seed(0)
    nets = [MLP(12, 3, width=8, depth=2, norm="batch").to(device) for _ in range(3)]
    batches = [(x.to(device), y.to(device)) for x, y in _data()]
    for net in nets:  # distinct running statistics per model
        reset_bn(net, [(x * (1 + i), y) for i, (x, y) in enumerate(batches)])
    states = [n.state_dict() for n in nets]
    result = interpolation_study(
        nets[0],
        states,
        {"test": batches},
        repair_mode="reset_bn",
        align_batches=batches,
        num_alphas=3,
    )
    merged = result.matched_merge
    assert merged is not None
    expected = MLP(12, 3, width=8, depth=2, norm="batch").to(device)
    expected.load_state_dict(weighted_average(result.matched_states))
    reset_bn(expected, batches)
    for k, v in expected.state_dict().items():
        assert merged[k].device == v.device  # the merge stays on the models' device
        torch.testing.assert_close(merged[k], v)
    plain = weighted_average(result.matched_states)
    assert not torch.allclose(merged["norms.0.running_var"], plain["norms.0.running_var"])
    net = MLP(12, 3, width=8, depth=2, norm="batch").to(device).eval()
    net.load_state_dict(merged)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    loss = nn.functional.cross_entropy(net(x), y).item()
    assert loss == pytest.approx(result.merges["matched"]["test/loss"], rel=1e-5)


def test_repair_matches_target_channel_statistics(device):
    torch.manual_seed(0)
    a, b = MLP(12, 3, width=16, depth=3).to(device), MLP(12, 3, width=16, depth=3).to(device)
    batches = [(x.to(device), y.to(device)) for x, y in _data(n=128)]
    points = repair_points(a)
    assert points == ["layers.0", "layers.1", "layers.2"]
    sa, sb = channel_stats(a, batches, points), channel_stats(b, batches, points)
    mid = MLP(12, 3, width=16, depth=3).to(device)
    load_lerp_(mid, a.state_dict(), b.state_dict(), 0.5)
    targets = interpolate_stats(sa, sb, 0.5)
    before = channel_stats(mid, batches, points)
    assert not torch.allclose(before["layers.2"][1], targets["layers.2"][1], rtol=0.05)
    repair(mid, targets, batches)
    after = channel_stats(mid, batches, points)
    for p in points:
        torch.testing.assert_close(after[p][0], targets[p][0].to(after[p][0]), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(after[p][1], targets[p][1].to(after[p][1]), rtol=1e-3, atol=1e-4)
    assert set(mid.state_dict()) == set(a.state_dict())  # still an ordinary MLP


def test_evaluate_counts_exactly():
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 1])
    r = evaluate(model, [(x[:2], y[:2]), (x[2:], y[2:])])
    assert r.acc == pytest.approx(2 / 3) and r.n == 3
    expected = nn.functional.cross_entropy(model(x), y).item()
    assert r.loss == pytest.approx(expected, rel=1e-6)
    assert np.isnan(evaluate(model, [(x, x)], loss="mse").acc)


def _path_nets(kind: str, device: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    if kind == "bn":  # BatchNorm in eval mode: the running statistics are interpolated too
        nets = [MLP(12, 3, width=16, depth=2, norm="batch") for _ in range(2)]
        batches = _data()
        for i, net in enumerate(nets):
            reset_bn(net, [(x * (1 + i), y) for x, y in batches])
    else:
        nets = [MLP(12, 3 if kind == "ce" else 2, width=16, depth=2) for _ in range(2)]
    return nets[0].to(device), nets[1].to(device)


@pytest.mark.parametrize("kind", ["ce", "bn", "half_mse"])
def test_a_vectorised_path_equals_its_points_one_by_one(kind, device, monkeypatch):
    """Issue 48: the path's points as one vectorised model per chunk give every point's loss and
    accuracy and the barriers of the point-by-point evaluation (to float round-off), for plain
    and BatchNorm nets and a regression loss, also when the points split into chunks."""
    from lmc.interpolation import study

    a, b = _path_nets(kind, device)
    loss = "half_mse" if kind == "half_mse" else "cross_entropy"
    data = _data()
    if loss == "half_mse":
        g = torch.Generator().manual_seed(1)
        data = [(x, torch.randn(x.shape[0], 2, generator=g)) for x, _ in data]
    splits = {"train": data[:2], "test": [(x.to(device), y.to(device)) for x, y in data]}
    alphas = alpha_grid(7)
    sa, sb = ({k: v.clone() for k, v in n.state_dict().items()} for n in (a, b))
    runs = {}
    for vectorize, chunk_bytes in ((False, None), (True, None), (True, 3)):
        if chunk_bytes:  # a budget under one state's size: one point per chunk
            monkeypatch.setattr(study, "VECTORIZE_BYTES", chunk_bytes)
        seen: list[int] = []
        runs[(vectorize, chunk_bytes)], _ = study.interpolate_path(
            a, sa, sb, splits, alphas, loss,
            on_point=lambda seen=seen: seen.append(1), vectorize=vectorize,
        )  # fmt: skip
        assert len(seen) == len(alphas)
    ref = runs[(False, None)]
    for key in [(True, None), (True, 3)]:
        got = runs[key]
        assert got.metrics.keys() == ref.metrics.keys()
        for name, values in ref.metrics.items():
            np.testing.assert_allclose(got.metrics[name], values, rtol=2e-5, atol=1e-6)
        for split, values in ref.barriers.items():
            for field, value in values.items():
                expected = pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True)
                assert got.barriers[split][field] == expected


def test_a_vectorised_path_with_a_repair_is_refused():
    from lmc.interpolation.study import interpolate_path

    a, b = _path_nets("bn", "cpu")
    with pytest.raises(ValueError, match="changes each one first"):
        interpolate_path(
            a, a.state_dict(), b.state_dict(), {"test": _data()}, alpha_grid(3),
            repair_mode="reset_bn", align_batches=_data(), vectorize=True,
        )  # fmt: skip
