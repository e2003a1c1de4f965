"""GPU checks (marker ``gpu``; skipped without CUDA): the same runs on an accelerator."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import CONFIGS, run_cli, run_dirs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_quickstart_on_gpu(tmp_path):
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "quickstart.yaml"),
        "-c",  # the GPU machine has no wandb (../shared/gpu/README.md)
        str(CONFIGS / "loggers" / "csv.yaml"),
        "--trainer.accelerator=gpu",
        "--trainer.max_epochs=8",
        f"--trainer.default_root_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_matched"] < 0.2 * summary["barrier_loss_naive"]


def _double(state, device):
    """float64 copies on ``device``: in float32 the GPU's summation order could flip a near-tie
    of a LAP and make a correct GPU result differ from the CPU one."""
    return {k: (v.double() if v.is_floating_point() else v).to(device) for k, v in state.items()}


@pytest.mark.parametrize("method", ["plain", "accelerated"])
def test_weight_matching_on_gpu_tensors_equals_cpu(method):
    from lmc.models import ResNet
    from lmc.permutation import (
        apply_permutation,
        invert_permutation,
        permutation_equal,
        random_permutation,
        spec_for,
        weight_matching,
    )

    torch.manual_seed(0)
    net, other = ResNet(20, width=1), ResNet(20, width=1)
    spec = spec_for(net)
    state = net.state_dict()
    pi = random_permutation(spec.sizes(state), 0)
    permuted = apply_permutation(state, spec, pi)
    for source in (permuted, other.state_dict()):  # a known answer, then a non-trivial matching
        # the CPU result, computed here from the same inputs ...
        cpu = weight_matching(_double(state, "cpu"), _double(source, "cpu"), spec, method=method)
        gpu = weight_matching(_double(state, "cuda"), _double(source, "cuda"), spec, method=method)
        # ... and the GPU run reproduces it: same permutation, same path, same objective
        assert all(p.device.type == "cuda" for p in gpu.perm.values())
        assert permutation_equal(gpu.perm, cpu.perm)
        assert (gpu.sweeps, gpu.solves, gpu.converged) == (cpu.sweeps, cpu.solves, cpu.converged)
        assert gpu.history == pytest.approx(cpu.history, rel=1e-9, abs=1e-9)
        if source is permuted:  # both recover pi^-1 and align the copy exactly
            assert permutation_equal(cpu.perm, invert_permutation(pi))
            aligned = apply_permutation(_double(source, "cuda"), spec, gpu.perm)
            assert all(torch.equal(aligned[k].cpu(), _double(state, "cpu")[k]) for k in state)


def test_weight_matching_benchmark_runs_on_gpu(capsys):
    from benchmarks.weight_matching import main

    # a smoke test of the GPU path: random-init MLPs (no MNIST), so their figures are marked
    main(["--quick", "--device", "cuda", "--repeats", "1", "--untrained"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    values = {k: float(v) for k, v in (pair.split("=") for pair in last.split())}
    assert set(values) == {
        "wm_repeat_speedup_resnet20x2",
        "wm_repeat_speedup_resnet20x2_trained",
        "wm_repeat_speedup_vgg11x0.5_trained",
        "wm_vgg11x0.5_trained_cold_s",
        "wm_mlp_accel_vs_reference_untrained",
        "lap_warm_vs_cold_256",
    }
    assert all(v > 0 for v in values.values())


@pytest.mark.parametrize("recipe", ["channels_last", "bf16", "compile"])
def test_speed_recipes_on_gpu(recipe, tmp_path):
    """configs/speed/ on CUDA: channels-last and compile give the default run, bf16-mixed runs in
    bfloat16 close to float32 (the CPU versions: tests/tasks/test_speed_recipes.py)."""
    from tests.tasks import test_speed_recipes as recipes

    getattr(recipes, f"check_{recipe}")(tmp_path, device="gpu")
