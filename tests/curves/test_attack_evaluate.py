"""PGD, curve evaluation (summaries, arc length) and the plane, on tiny models."""

from __future__ import annotations

import copy

import pytest
import torch

from lmc.curves import (
    PGD,
    Curve,
    arc_length_weights,
    curve_objective,
    evaluate_curve,
    pgd_attack,
    plane_grid,
    summarize,
    t_grid,
)
from lmc.interpolation import evaluate, interpolate_path
from lmc.models import MLP
from lmc.permutation import apply_permutation, correlation_alignment, random_permutation, spec_for
from tests.curves.helpers import assert_close

MEAN, STD = (0.2860,), (0.3530,)


def _data(n: int = 64, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.rand(n, 1, 4, 4, generator=g)
    y = (pixels.mean((1, 2, 3)) > 0.5).long() + 2 * (pixels[:, 0, 0, 0] > 0.5).long()
    x = (pixels - MEAN[0]) / STD[0]
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, n, 16)]


def _trained(seed: int) -> MLP:
    torch.manual_seed(seed)
    net = MLP(16, 4, width=12, depth=2)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(10):
        for x, y in _data():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def pair() -> tuple[MLP, MLP]:
    return _trained(0), _trained(1)


def test_pgd_stays_in_the_pixel_ball_and_raises_the_loss(pair):
    net = pair[0]
    net.zero_grad(set_to_none=True)
    x, y = _data()[0]
    attack = PGD(eps=0.1, step_size=0.03, steps=5)
    adv = pgd_attack(net, x, y, attack, MEAN, STD)
    pixels, adv_pixels = x * STD[0] + MEAN[0], adv * STD[0] + MEAN[0]
    assert (adv_pixels - pixels).abs().max() <= 0.1 + 1e-6
    assert adv_pixels.min() >= -1e-6 and adv_pixels.max() <= 1 + 1e-6
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert ce(net(adv), y) > ce(net(x), y)
    # input space: eps is in normalised units, no clipping
    adv_in = pgd_attack(net, x, y, attack)
    assert (adv_in - x).abs().max() <= 0.1 + 1e-6
    assert torch.equal(pgd_attack(net, x, y, PGD(steps=0, random_start=False), MEAN, STD), x)
    assert not any(p.grad is not None for p in net.parameters())
    with pytest.raises(ValueError):
        PGD(eps=-1.0)


def test_summaries_and_arc_length_weights():
    ts = [0.0, 0.5, 1.0]
    assert arc_length_weights([1.0, 1.0]) == pytest.approx([0.25, 0.5, 0.25])
    assert arc_length_weights([3.0, 1.0]) == pytest.approx([3 / 8, 4 / 8, 1 / 8])
    assert arc_length_weights([0.0, 0.0]) == pytest.approx([1 / 3] * 3)
    s = summarize(ts, {"test/acc": [0.9, 0.5, 0.8]}, arc_length_weights([3.0, 1.0]))
    assert s["test/acc_min"] == 0.5 and s["test/acc_max"] == 0.9
    assert s["test/acc_mean"] == pytest.approx((0.9 + 2 * 0.5 + 0.8) / 4)
    assert s["test/acc_arc_mean"] == pytest.approx((3 * 0.9 + 4 * 0.5 + 0.8) / 8)
    assert s["test/acc_start"] == 0.9 and s["test/acc_end"] == 0.8
    assert len(t_grid()) == 61 and t_grid(3) == [0.0, 0.5, 1.0]


def test_the_linear_curve_evaluates_like_the_interpolation_path(pair):
    a, b = pair
    curve = Curve.from_module(a, a.state_dict(), b.state_dict())
    data = _data()
    ev = evaluate_curve(copy.deepcopy(a), curve, t_grid(5), {"test": data})
    path, _ = interpolate_path(
        copy.deepcopy(a), a.state_dict(), b.state_dict(), {"test": data}, ev.ts
    )
    assert ev.metrics["test/loss"] == pytest.approx(path.metrics["test/loss"], rel=1e-5)
    assert ev.metrics["test/acc"] == pytest.approx(path.metrics["test/acc"])
    assert ev.weights == pytest.approx([0.125, 0.25, 0.25, 0.25, 0.125], rel=1e-4)
    assert ev.summary["test/loss_start"] == pytest.approx(evaluate(a, data).loss, rel=1e-6)
    robust = evaluate_curve(
        copy.deepcopy(a),
        curve,
        [0.0, 1.0],
        {"test": data},
        attack=PGD(0.1, 0.03, 3),
        mean=MEAN,
        std=STD,
    )
    assert all(
        r <= c for r, c in zip(robust.metrics["test/robust_acc"], robust.metrics["test/acc"])
    )
    objective = curve_objective(a, curve, data, [0.0])
    assert objective == pytest.approx(evaluate(a, data).loss, rel=1e-5)


def test_plane_grid_corners_are_the_models(pair):
    a, b = pair
    c = _trained(2)
    data = {"test": _data()}
    res = plane_grid(
        copy.deepcopy(a), a.state_dict(), b.state_dict(), c.state_dict(), data, grid=3, margin=0.0
    )
    assert res.points["theta_1"] == (0.0, 0.0)
    x_b, y_b = res.points["theta_2"]
    assert y_b == pytest.approx(0.0, abs=1e-9) and x_b > 0
    assert res.xs[0] == pytest.approx(min(0.0, res.points["P theta_2"][0]))
    if res.xs[0] == 0.0:  # theta_1 is the lattice's corner [0][0]
        assert res.metrics["test/loss"][0][0] == pytest.approx(
            evaluate(a, data["test"]).loss, rel=1e-4
        )
    assert len(res.metrics["test/acc"]) == 3 and len(res.metrics["test/acc"][0]) == 3
    with pytest.raises(ValueError, match="collinear"):
        mid = {k: (v + b.state_dict()[k]) / 2 for k, v in a.state_dict().items()}
        plane_grid(copy.deepcopy(a), a.state_dict(), b.state_dict(), mid, data, grid=2)
    assert_close(torch.tensor(res.xs[-1]), torch.tensor(max(x_b, res.points["P theta_2"][0])))


def test_aligned_line_to_a_permuted_copy_is_flat(pair):
    a = pair[0]
    spec = spec_for(a)
    state = a.state_dict()
    permuted = apply_permutation(state, spec, random_permutation(spec.sizes(state), 1))
    b = copy.deepcopy(a)
    b.load_state_dict(permuted)
    data = {"test": _data()}
    perm = correlation_alignment(a, b, data["test"], spec).perm
    naive = Curve.from_module(a, state, permuted)
    aligned = Curve.from_module(a, state, permuted)
    aligned.set_end_(apply_permutation(permuted, spec, perm))
    flat = evaluate_curve(copy.deepcopy(a), aligned, t_grid(5), data).metrics["test/loss"]
    bumpy = evaluate_curve(copy.deepcopy(a), naive, t_grid(5), data).metrics["test/loss"]
    assert flat == pytest.approx([flat[0]] * 5, rel=1e-5)
    assert max(bumpy) > bumpy[0] + 0.05
