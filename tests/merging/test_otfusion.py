"""Known-answer and bad-input tests of OTFusion (issue 17, item 1; 000 §5) on tiny models."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
import torch

from lmc.interpolation.states import weighted_average
from lmc.merging import MERGE_METHODS
from lmc.merging.fedma import local_train
from lmc.merging.otfusion import (
    Pruning,
    check_fusion_models,
    materialize,
    otfusion,
)
from lmc.models import MLP, VGG, ResNet
from lmc.permutation import apply_permutation, random_permutation, spec_for


def _mlp(seed: int, width: int = 16) -> MLP:
    torch.manual_seed(seed)
    return MLP(20, 5, width=width, depth=3)


def _permuted(net: torch.nn.Module, seed: int = 1):
    spec = spec_for(net)
    state = net.state_dict()
    return spec, state, apply_permutation(state, spec, random_permutation(spec.sizes(state), seed))


def _max_diff(a, b) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


@pytest.mark.parametrize("metric", ["weight", "activation"])
def test_permuted_copy_is_recovered(metric, device):
    net = _mlp(0).to(device)
    spec, state, perm = _permuted(net)
    x = torch.randn(256, 20).to(device)
    res = otfusion([state, perm], spec, net=net, metric=metric, batches=[(x, None)])
    assert all(t.device.type == device for t in res.state.values())
    assert _max_diff(res.state, state) < 1e-6
    assert "otfusion" in MERGE_METHODS


@pytest.mark.parametrize(
    "make", [lambda: ResNet(depth=8, width=0.25), lambda: VGG(11, width=0.0625)]
)
def test_permuted_copy_with_batchnorm_and_residual_streams(make):
    torch.manual_seed(0)
    net = make()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.normal_()
    spec, state, perm = _permuted(net, 3)
    res = otfusion([state, perm, perm], spec)
    assert _max_diff(res.state, state) < 1e-5


def test_without_pot_the_error_says_how_to_install_it_or_do_without(monkeypatch):
    """POT is the ``ot`` extra, not a core dependency: its absence is named with the fix, and a
    solver of one's own needs no POT."""
    monkeypatch.setitem(sys.modules, "ot", None)
    spec, state, perm = _permuted(_mlp(0), 3)
    with pytest.raises(ImportError, match=r"needs POT.*pip install 'lmc\[ot\]'.*solver="):
        otfusion([state, perm], spec)
    res = otfusion([state, perm], spec, solver=lambda mu, nu, cost: np.diag(mu))
    assert res.state.keys() == state.keys()


def test_identity_plan_is_the_plain_average():
    a, b, c = (_mlp(s).state_dict() for s in range(3))
    spec = spec_for(_mlp(0))
    res = otfusion([a, b, c], spec, solver=lambda mu, nu, cost: np.diag(mu))
    assert _max_diff(res.state, weighted_average([a, b, c])) < 1e-6


@pytest.mark.parametrize("marginals", ["explicit", "activation"])
def test_wider_target_keeps_the_function(marginals):
    net = _mlp(0)
    spec, state, perm = _permuted(net)
    x = torch.randn(512, 20)
    given = (
        {f"layers.{i}": [1 / 16] * 16 + [0.0] * 8 for i in range(3)}
        if marginals == "explicit"
        else "activation"
    )
    res = otfusion([state, perm], spec, net=net, batches=[x], target_width=24, marginals=given)
    assert res.widths == {f"layers.{i}": 24 for i in range(3)}
    wide = materialize(net, res.state)
    # the extra neurons are zero: the wide model computes the narrow one's function
    assert torch.allclose(wide(x), net(x), atol=1e-5)
    assert float(res.state["layers.0.weight"][16:].abs().max()) == 0.0


def test_unequal_widths_fuse_into_the_base_width():
    a, b = _mlp(0, 16).state_dict(), _mlp(1, 12).state_dict()
    spec = spec_for(_mlp(0, 16))
    res = otfusion([a, b], spec)
    assert res.state["layers.1.weight"].shape == (16, 16)
    assert [p.shape for p in res.plans["layers.0"]] == [(16, 16), (12, 16)]


def test_pruning_before_alignment_uses_the_pruning_strategies():
    net = _mlp(0)
    spec, state, perm = _permuted(net)
    res = otfusion([state, perm], spec, net=net, pruning=Pruning(0.5))
    # only_prune is deterministic and local, so the permuted copy still aligns exactly
    w = res.state["layers.1.weight"]
    assert float((w == 0).double().mean()) == pytest.approx(0.5, abs=0.01)
    x = torch.randn(64, 20)
    batches = [(x, torch.randint(0, 5, (64,)))]
    tune = functools.partial(local_train, batches=batches, epochs=1, lr=0.01)
    for strategy, rounds in (("finetune_once", 1), ("iterative", 2)):
        out = otfusion([state, perm], spec, net=net, pruning=Pruning(0.3, strategy, rounds, tune))
        assert all(torch.isfinite(t).all() for t in out.state.values())


@pytest.mark.parametrize("strategy, rounds", [("finetune_once", 1), ("iterative", 2)])
def test_rate_zero_fine_tunes_the_dense_models(strategy, rounds):
    """The fine-tune-only control (000 Table 2): a fine-tuning strategy at rate 0 prunes nothing
    but fine-tunes every model for the same rounds, so it equals fine-tuning the dense models
    ``rounds`` times without any mask, then fusing them (to float rounding)."""
    net = _mlp(0)
    spec, state, perm = _permuted(net)
    torch.manual_seed(5)
    batches = [(torch.randn(32, 20), torch.randint(0, 5, (32,))) for _ in range(2)]
    tune = functools.partial(local_train, batches=batches, epochs=1, lr=0.05, seed=3)
    control = otfusion([state, perm], spec, net=net, pruning=Pruning(0.0, strategy, rounds, tune))
    tuned = []
    for s in (state, perm):
        model = materialize(net, s)
        for _ in range(rounds):
            tune(model)
        tuned.append(model.state_dict())
    by_hand = otfusion(tuned, spec, net=net)
    assert _max_diff(control.state, by_hand.state) < 1e-6
    assert _max_diff(control.state, otfusion([state, perm], spec, net=net).state) > 1e-3


def test_bad_input():
    net = _mlp(0)
    spec, state, perm = _permuted(net)
    with pytest.raises(ValueError, match="at least 2 models"):
        otfusion([state], spec)
    deeper = MLP(20, 5, width=16, depth=4).state_dict()
    with pytest.raises(ValueError, match="layers"):
        check_fusion_models([state, deeper], spec)
    with pytest.raises(ValueError, match="summing to one"):
        otfusion([state, perm], spec, marginals={"layers.0": [0.5] * 16})
    with pytest.raises(ValueError, match="smaller than the base"):
        otfusion([state, perm], spec, target_width=8)
    res = otfusion([state, perm], spec, target_width=8, allow_shrink=True)
    assert res.state["layers.0.weight"].shape == (8, 20)
    with pytest.raises(ValueError, match="finetune"):
        Pruning(0.2, "finetune_once")


FUSION_CONFIGS = [
    "mnist_mlp_otfusion",
    "mnist_mlp_fedma",
    # the GPU recipes: same code path on tiny fake CIFAR-10, kept out of the default suite
    *(
        pytest.param(n, marks=pytest.mark.slow)
        for n in ("cifar10_vgg11_otfusion", "cifar10_resnet20_otfusion", "cifar10_vgg11_fedma")
    ),
]


def _tiny_net(name: str) -> torch.nn.Module:
    if "mlp" in name:
        return MLP(784, 10, width=8, depth=3)
    if "resnet" in name:
        return ResNet(depth=8, width=0.25)
    return VGG(11, width=0.0625)


@pytest.mark.parametrize("name", FUSION_CONFIGS)
def test_fusion_configs_run_and_write_the_record(name, tmp_path):
    """Every shipped fusion config runs on tiny fake data through the merge front door
    (MergeTask, lmc validate) and writes the merge record: OTFusion of two checkpoints, FedMA of
    two clients with their own batches from lmc.data.FederatedClients (one retraining epoch)."""
    import json

    from lmc.data import write_fake_cifar10, write_fake_mnist
    from lmc.io import save_net_checkpoint
    from tests.helpers import CONFIGS, run_cli

    fedma = "fedma" in name
    data = "--data.init_args.data.init_args." if fedma else "--data.init_args."
    if "mnist" in name:
        write_fake_mnist(tmp_path / "data", "MNIST", n_train=64, n_test=16)
        width = ["--model.init_args.net.init_args.width=8"]
    else:
        write_fake_cifar10(tmp_path / "data", n_train=64, n_test=16, archive=True)
        width = [f"--model.init_args.net.init_args.width={0.25 if 'resnet' in name else 0.0625}"]
        width += ["--model.init_args.net.init_args.depth=8"] if "resnet" in name else []
    files = []
    for s in range(2):
        torch.manual_seed(s)
        files.append(tmp_path / f"s{s}.ckpt")
        save_net_checkpoint(_tiny_net(name).state_dict(), files[-1])
    method = "fedma" if fedma else "otfusion"
    args = [
        "validate",
        "-c",
        str(CONFIGS / "merge" / f"{name}.yaml"),
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.accelerator=cpu",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        f"{data}data_dir={tmp_path / 'data'}",
        f"{data}val_size=8",
        f"{data}alignment_size=16",
        f"{data}batch_size=16",
        f"--model.init_args.checkpoints=[{files[0]}, {files[1]}]",
        *width,
    ]
    if fedma:
        args += [
            "--data.init_args.clients=2",
            "--model.init_args.method_options.fedma.epochs=1",
            "--model.init_args.method_options.fedma.rounds=1",
        ]
    else:
        args += ["--model.init_args.method_options.otfusion.finetune_epochs=1"]
    run_cli(*args)
    [summary] = (tmp_path / "run").rglob("summary.json")
    record = json.loads(summary.read_text())
    assert record["kind"] == "merge"
    assert 0.0 <= record["summary"][f"{method}/n2/test/acc"] <= 1.0
    assert 0.0 <= record["summary"]["naive/n2/test/acc"] <= 1.0
    # the prefix its summary was logged under, which a study's W&B Report reads (issue 32)
    assert record["logged_as"] == "merge"
