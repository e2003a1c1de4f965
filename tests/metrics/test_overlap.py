"""003 §3: neuron types, the overlap proportion of two teacher-student minima, and uniform
minima on the manifold, against answers known in closed form."""

from __future__ import annotations

import pytest
import torch

from lmc.data import TeacherStudentDataModule
from lmc.metrics.overlap import (
    expected_overlap,
    neuron_types,
    overlap_proportion,
    simulate_overlap,
    solutions_overlap,
    type_vector,
)
from lmc.models import TwoLayerReLU
from lmc.models.init import sample_minimum, sample_types


def test_overlap_of_hand_made_type_vectors():
    assert overlap_proportion(torch.tensor([2, 1, 1]), torch.tensor([1, 2, 1])) == 0.75
    assert overlap_proportion(torch.tensor([3, 1]), torch.tensor([3, 1])) == 1.0
    assert overlap_proportion(torch.tensor([4, 1]), torch.tensor([1, 4])) == 0.4


def test_types_follow_the_teacher_and_are_permutation_invariant():
    w = torch.tensor([[0.0, 0.7, 0.0], [0.2, 0.0, 0.0], [0.0, 0.3, 0.0], [0.8, 0.0, 0.0]])
    assert neuron_types(w).tolist() == [1, 0, 1, 0]
    assert type_vector(neuron_types(w), 3).tolist() == [2, 2, 0]
    # a rotated teacher types the rotated neurons the same way
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))
    assert neuron_types(w @ q.T, torch.eye(3) @ q.T).tolist() == [1, 0, 1, 0]
    perm = torch.tensor([2, 0, 3, 1])
    assert solutions_overlap(w, w[perm]) == 1.0


def test_uniform_minimum_is_a_global_minimum_with_every_type():
    g = torch.Generator().manual_seed(3)
    w = sample_minimum(9, 4, 10, generator=g, dtype=torch.float64)
    types = neuron_types(w, torch.eye(10)[:4])
    z = type_vector(types, 4)
    assert (z >= 1).all() and int(z.sum()) == 9
    # one non-zero coordinate per neuron, the coefficients of a type sum to 1
    assert ((w != 0).sum(1) == 1).all()
    assert torch.allclose(w.sum(0)[:4], torch.ones(4, dtype=torch.float64))
    dm = TeacherStudentDataModule(input_dim=10, teacher_width=4)
    x = torch.randn(256, 10, dtype=torch.float64)
    student = torch.relu(x @ w.T).sum(1, keepdim=True)
    assert torch.allclose(student, dm.teacher(x.float()).double(), atol=1e-6)


def test_expected_overlap_exact_sum_and_simulation_agree():
    # m = 2, n = 4: z_1 = 1 + Bin(2, 1/2) takes 1, 2, 3 with probabilities 1/4, 1/2, 1/4, z_2 =
    # 4 - z_1, so the overlap is 4 - |z_1 - z_1'| and E|z_1 - z_1'| = 2 (1/4 1/2 + 1/2 1/4 +
    # 1/4 1/4 2) = 3/4
    assert expected_overlap(4, 2) == pytest.approx((4 - 0.75) / 4, abs=1e-12)
    assert expected_overlap(4, 4) == 1.0
    for n in (5, 8, 12):
        mean, se = simulate_overlap(n, 4, trials=20_000, seed=1)
        assert mean == pytest.approx(expected_overlap(n, 4), abs=5 * se)
    # 003 Fig. 1: the overlap falls from 1 at n = m, then rises back towards 1 with n
    curve = [simulate_overlap(n, 4, trials=4000)[0] for n in (4, 8, 64, 1024)]
    assert curve[0] == 1.0 and curve[1] < curve[0] and curve[1] < curve[2] < curve[3] < 1


def test_sampled_types_and_model_init():
    g = torch.Generator().manual_seed(0)
    types = sample_types(6, 4, g)
    assert sorted(set(types.tolist())) == [0, 1, 2, 3] and types.numel() == 6
    torch.manual_seed(5)
    net = TwoLayerReLU(in_features=10, width=7, init="manifold", teacher_width=4)
    w = net.hidden.weight.detach()
    assert type_vector(neuron_types(w), 10)[:4].min() >= 1
    assert torch.allclose(w.sum(0)[:4], torch.ones(4), atol=1e-6)
    torch.manual_seed(5)
    again = TwoLayerReLU(in_features=10, width=7, init="manifold", teacher_width=4)
    assert torch.equal(again.hidden.weight, net.hidden.weight)  # seeded by the global RNG


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"width": 3, "teacher_width": 4}, "width >= teacher_width"),
        ({"width": 8}, "teacher_width"),
        ({"width": 8, "teacher_width": 4, "bias": True}, "bias=false"),
        ({"width": 8, "teacher_width": 4, "train_output": True}, "train_output=false"),
    ],
)
def test_manifold_init_refuses_what_has_no_minimum(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TwoLayerReLU(in_features=10, init="manifold", **kwargs)


def test_bad_overlap_inputs():
    with pytest.raises(ValueError, match="one width"):
        overlap_proportion(torch.tensor([2, 1]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="2 and 3 types"):
        overlap_proportion(torch.tensor([2, 1]), torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="teacher neurons must be"):
        neuron_types(torch.zeros(4, 3), torch.zeros(2, 5))
