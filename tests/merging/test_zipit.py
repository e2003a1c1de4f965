"""ZipIt!: the greedy zip on known correlations, a model zipped with a permuted copy of itself
gives the model back (MLP, VGG with BatchNorm, ResNet's residual streams), zip without
same-model or repeated merges equals correlation activation matching + averaging, and networks
zip cannot place are refused by name before any work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmc.interpolation.states import weighted_average
from lmc.merging import MERGE_METHODS, MergeInputs, materialize, zip_clusters
from lmc.merging.zipit import check_zippable, merge_matrices
from lmc.models import MLP, VGG, ResNet
from lmc.permutation import (
    SpecError,
    activation_matching,
    apply_permutation,
    random_permutation,
    spec_for,
)
from tests.permutation.helpers import build

ZIP = MERGE_METHODS.get("zip")
CASES = [
    ("mlp", lambda: MLP(20, 5, width=12, depth=2), (20,)),
    ("vgg11-bn", lambda: VGG(11, width=1 / 16, norm="batch", init="he_normal"), (3, 8, 8)),
    ("resnet20-ln", lambda: ResNet(20, width=0.25, norm="layer", init="he_normal"), (3, 8, 8)),
]


def _inputs(states, net, data, **kwargs) -> MergeInputs:
    return MergeInputs(states, spec_for(net), net=net, align_batches=[(x,) for x in data], **kwargs)


def test_greedy_zip_merges_the_most_correlated_pairs_and_keeps_its_budget():
    # 2 models x 2 features: a0 ~ a1 within model 0 most correlated, then a0 ~ b0, a1 ~ b1
    corr = torch.tensor(
        [
            [1.0, 0.95, 0.9, 0.1],
            [0.95, 1.0, 0.2, 0.8],
            [0.9, 0.2, 1.0, 0.3],
            [0.1, 0.8, 0.3, 1.0],
        ],
        dtype=torch.float64,
    )
    # a budget of one same-model merge (beta 1: its share is 1): a0 + a1 first, then b0 + b1
    assert zip_clusters(corr, 2, alpha=0.5, beta=1.0) == [[0, 1], [2, 3]]
    # no same-model merges: the cross pairs a0 ~ b0 and a1 ~ b1
    assert zip_clusters(corr, 2, alpha=0.5, beta=0.0) == [[0, 2], [1, 3]]
    merge, unmerge = merge_matrices([[0, 2], [1, 3]], 4)
    assert torch.equal(merge, torch.tensor([[0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5]]).double())
    assert torch.equal(unmerge, (merge > 0).double().T)


def test_a_zipped_feature_merges_again_only_with_models_it_lacks_when_alpha_is_zero():
    """Three models x 2 features, features 0 of all three alike and features 1 alike: the
    models' features pool into two merged features of three members each, for alpha 0 too (a
    merged feature may still take a third model's feature)."""
    corr = torch.eye(6, dtype=torch.float64)
    for i in range(0, 6, 2):
        for j in range(0, 6, 2):
            corr[i, j] = corr[i + 1, j + 1] = 0.9 if i != j else 1.0
    for alpha in (0.5, 0.0):
        assert zip_clusters(corr, 3, alpha=alpha, beta=0.0) == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="every remaining pair is forbidden"):
        zip_clusters(torch.full((4, 4), -torch.inf), 2, alpha=0.5, beta=1.0)


@pytest.mark.parametrize(("name", "factory", "shape"), CASES, ids=[c[0] for c in CASES])
def test_zipping_a_model_with_its_permuted_copy_gives_the_model(name, factory, shape):
    net, data = build(factory, shape)
    spec = spec_for(net)
    state = net.state_dict()
    copy = apply_permutation(state, spec, random_permutation(spec.sizes(state), 3))
    merged = ZIP(_inputs([state, copy], net, data))
    assert merged.perms is None and all(v == 0.0 for v in merged.diagnostics.values())
    x = torch.cat(data)
    with torch.no_grad():
        torch.testing.assert_close(materialize(net, merged.state)(x), net(x), atol=1e-4, rtol=1e-4)


def test_zip_without_same_model_or_repeated_merges_is_activation_matching_then_averaging():
    net_a, data = build(lambda: MLP(20, 5, width=12, depth=2), (20,), seed=0)
    net_b, _ = build(lambda: MLP(20, 5, width=12, depth=2), (20,), seed=1)
    spec = spec_for(net_a)
    a, b = net_a.state_dict(), net_b.state_dict()
    zipped = ZIP(_inputs([a, b], net_a, data), alpha=0.0, beta=0.0).state
    matched = activation_matching(net_a, net_b, data, spec, similarity="correlation")
    expected = weighted_average([a, apply_permutation(b, spec, matched.perm)])
    permuted = MERGE_METHODS.get("permute")(_inputs([a, b], net_a, data)).state  # the baseline
    for k in a:
        torch.testing.assert_close(zipped[k], expected[k], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(permuted[k], expected[k], atol=1e-6, rtol=1e-6)
    # with same-model merges allowed the result differs: zip is not permutation merging
    default = ZIP(_inputs([a, b], net_a, data)).state
    assert any(not torch.allclose(default[k], expected[k]) for k in a)


class _PosEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.pos = nn.Parameter(torch.zeros(1, 3, 6))
        self.act = nn.ReLU()
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.fc(x) + self.pos).mean(1))


def test_an_entry_zip_cannot_place_is_refused_by_name():
    from lmc.permutation import derive_spec

    net = _PosEmbedding()
    spec = derive_spec(net, torch.randn(2, 3, 4))
    with pytest.raises(SpecError, match="zip cannot place 'pos'"):
        check_zippable(net, spec)
    with pytest.raises(SpecError, match="zip cannot place 'pos'"):
        ZIP(MergeInputs([net.state_dict()] * 2, spec, net=net, align_batches=[]))


def test_zip_needs_the_alignment_subset():
    net, data = build(CASES[0][1], CASES[0][2])
    with pytest.raises(ValueError, match="merge method 'zip' needs align_batches"):
        ZIP(MergeInputs([net.state_dict()] * 2, spec_for(net), net=net))


def _mlp_pair():
    net_a, data = build(lambda: MLP(20, 5, width=12, depth=3), (20,), seed=0)
    net_b, _ = build(lambda: MLP(20, 5, width=12, depth=3), (20,), seed=1)
    return net_a, net_b, data


def test_partial_zipping_gives_a_multihead_that_shares_the_trunk():
    """zip_until=2 of three groups: a MultiHead of the two models whose members hold equal
    (zipped) entries up to the cut and their own heads after it; the MultiHead's output is the
    average of its members'."""
    from lmc.models import MultiHead

    net_a, net_b, data = _mlp_pair()
    a, b = net_a.state_dict(), net_b.state_dict()
    merged = ZIP(_inputs([a, b], net_a, data), zip_until=2)
    assert merged.heads == 2
    state = merged.state
    for key in ("layers.0.weight", "layers.1.weight", "layers.1.bias"):  # the trunk
        assert torch.equal(state[f"members.0.{key}"], state[f"members.1.{key}"])
    for key in ("layers.2.weight", "head.weight"):  # the heads
        assert not torch.equal(state[f"members.0.{key}"], state[f"members.1.{key}"])
    assert torch.equal(state["members.1.head.weight"], b["head.weight"])  # after the cut: its own
    model = merged.model(net_a)
    assert isinstance(model, MultiHead)
    x = torch.cat(data)
    with torch.no_grad():
        mean = torch.stack([m(x) for m in model.members]).mean(0)
        torch.testing.assert_close(model(x), mean)


def test_zipping_until_the_last_group_is_the_full_zip():
    """The layer after the last group is linear, so per-model heads averaged equal the zipped
    output layer: zip_until at the last group is the full zip (one net, no heads)."""
    net_a, net_b, data = _mlp_pair()
    a, b = net_a.state_dict(), net_b.state_dict()
    full = ZIP(_inputs([a, b], net_a, data))
    last = ZIP(_inputs([a, b], net_a, data), zip_until="layers.2")
    assert last.heads == 0 and full.heads == 0
    for k in a:
        torch.testing.assert_close(last.state[k], full.state[k])


@pytest.mark.parametrize("until", [1, 2, "layers.1"])
def test_partial_zipping_a_model_with_its_permuted_copy_gives_the_model(until):
    net, data = build(lambda: MLP(20, 5, width=12, depth=3), (20,))
    spec = spec_for(net)
    state = net.state_dict()
    copy = apply_permutation(state, spec, random_permutation(spec.sizes(state), 5))
    merged = ZIP(_inputs([state, copy], net, data), zip_until=until)
    x = torch.cat(data)
    with torch.no_grad():
        torch.testing.assert_close(merged.model(net)(x), net(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("until", "message"),
    [
        (0, "zip_until=0 is past the network's 3 groups"),
        (4, "zip_until=4 is past the network's 3 groups .*layers.0, layers.1, layers.2"),
        ("layer.1", "zip_until='layer.1' names no group; groups in order: layers.0"),
    ],
)
def test_a_cut_past_the_network_or_naming_no_layer_is_refused(until, message):
    net, data = build(lambda: MLP(20, 5, width=12, depth=3), (20,))
    with pytest.raises(SpecError, match=message):
        ZIP(_inputs([net.state_dict()] * 2, net, data), zip_until=until)


def test_a_residual_network_is_zipped_whole():
    net, data = build(CASES[2][1], CASES[2][2])
    with pytest.raises(SpecError, match="residual streams spanning the network: zip it whole"):
        ZIP(_inputs([net.state_dict()] * 2, net, data), zip_until=1)


@pytest.mark.parametrize("method", ["zip", "permute"])
def test_models_of_different_architectures_are_refused_before_any_work(method):
    net, data = build(lambda: MLP(20, 5, width=12, depth=2), (20,))
    wider = MLP(20, 5, width=16, depth=2).state_dict()
    with pytest.raises(ValueError, match="model 1 and the net differ at 'layers.0.weight'"):
        MERGE_METHODS.get(method)(_inputs([net.state_dict(), wider], net, data))
