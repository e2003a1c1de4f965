"""Sinkhorn re-basin (Peña et al. 2023): the relaxation, the schedule, known answers, errors."""

from __future__ import annotations

import pytest
import torch

from lmc.curves.birkhoff import permutation_matrix, round_to_permutation
from lmc.merging import SinkhornRebasin, sinkhorn, sinkhorn_rebasin, temperature
from lmc.models import MLP
from lmc.permutation import (
    apply_permutation,
    invert_permutation,
    permutation_equal,
    random_permutation,
    spec_for,
)


def test_sinkhorn_is_doubly_stochastic_and_tends_to_the_assignment():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 7, generator=g, dtype=torch.float64)
    s = sinkhorn(logits, tau=1.0, iters=50)
    torch.testing.assert_close(s.sum(0), torch.ones(7, dtype=torch.float64))
    torch.testing.assert_close(s.sum(1), torch.ones(7, dtype=torch.float64), atol=1e-6, rtol=0)
    hard = permutation_matrix(round_to_permutation(logits), torch.float64)
    cold = sinkhorn(logits, tau=0.02, iters=500)
    assert torch.equal(round_to_permutation(cold), round_to_permutation(logits))
    assert float((cold * hard).sum()) > 0.9 * 7  # almost all mass on the assignment
    with pytest.raises(ValueError, match="positive"):
        sinkhorn(logits, tau=0.0)
    with pytest.raises(ValueError, match="square"):
        sinkhorn(torch.zeros(2, 3))


def test_temperature_anneals_geometrically():
    assert temperature(0, 11, 1.0, 0.01) == pytest.approx(1.0)
    assert temperature(10, 11, 1.0, 0.01) == pytest.approx(0.01)
    assert temperature(5, 11, 1.0, 0.01) == pytest.approx(0.1)
    assert temperature(0, 1, 1.0, 0.01) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="positive"):
        temperature(0, 3, 1.0, -1.0)


def _teacher_batches(net, n=4, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(size, 10, generator=g) for _ in range(n)]
    with torch.no_grad():
        return [(x, net(x)) for x in xs]


def test_permuted_copy_is_recovered_at_low_temperature():
    """Known answer: B = pi(A); the midpoint loss (MSE to A's outputs) is 0 exactly at
    pi^-1, and the learned permutation, annealed from a smooth relaxation (tau = 1, far from
    the start) to tau = 0.01 and rounded, returns A."""
    torch.manual_seed(0)
    net = MLP(10, 3, width=6, depth=2)
    spec = spec_for(net)
    a = {k: v.clone() for k, v in net.state_dict().items()}
    pi = random_permutation(spec.sizes(a), 3)
    b = apply_permutation(a, spec, pi)
    perm, aligned, result = sinkhorn_rebasin(
        net,
        a,
        b,
        _teacher_batches(net),
        epochs=15,
        init="weight_matching",
        init_scale=1.0,
        tau_start=1.0,
        tau_end=0.01,
        lr=0.3,
        loss="mse",
    )
    assert permutation_equal(perm, invert_permutation(pi))
    for k in a:
        assert torch.equal(aligned[k], a[k]), k
    assert len(result.losses) == 60 and result.taus[-1] == pytest.approx(0.01)
    assert result.losses[-1] < result.losses[0]


def test_gradients_reach_every_group_and_bad_inputs_fail():
    net = MLP(10, 3, width=6, depth=3)
    a = net.state_dict()
    search = SinkhornRebasin(net, a, a)
    x, y = torch.randn(8, 10), torch.randint(0, 3, (8,))
    search.loss(x, y, tau=0.5).backward()
    assert len(search.logits) == 3
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in search.logits)
    wider = MLP(10, 3, width=8, depth=3).state_dict()
    with pytest.raises(ValueError, match="layers.0.weight"):
        SinkhornRebasin(net, a, wider)
    with pytest.raises(ValueError, match="init must be"):
        SinkhornRebasin(net, a, a, init="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixing must be"):
        SinkhornRebasin(net, a, a, mixing="gauss")  # type: ignore[arg-type]


def test_shipped_config_runs_under_lmc_fit(tmp_path):
    """configs/merge/mnist_mlp_sinkhorn.yaml: one step of `lmc fit` on fake MNIST and tiny
    random checkpoints writes the merge record with sinkhorn and its baselines."""
    import json

    from lmc.data import write_fake_mnist
    from tests.helpers import CONFIGS, run_cli, run_dirs

    write_fake_mnist(tmp_path / "data", "MNIST", n_train=48, n_test=16)
    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        state = MLP(784, 10, width=8, depth=3).state_dict()
        paths.append(tmp_path / f"m{seed}.ckpt")
        torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, paths[-1])
    out = tmp_path / "out"
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "merge" / "mnist_mlp_sinkhorn.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        f"--model.init_args.checkpoints=[{paths[0]}, {paths[1]}]",
        "--model.init_args.net.init_args.width=8",
        f"--trainer.default_root_dir={out}",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--data.init_args.data_dir={tmp_path / 'data'}",
        "--data.init_args.val_size=8",
        "--data.init_args.alignment_size=8",
        "--data.init_args.batch_size=8",
        "--data.init_args.eval_batch_size=16",
    )
    [run] = run_dirs(out)
    payload = json.loads((run / "summary.json").read_text())
    assert {(e["method"], e["n"]) for e in payload["evaluations"]} == {
        ("sinkhorn", 2),
        ("naive", 2),
        ("wm_ref", 2),
    }
    table = torch.load(run / "permutations.pt", weights_only=True)
    assert set(table["sinkhorn"]) == {2} and len(table["sinkhorn"][2]) == 2
