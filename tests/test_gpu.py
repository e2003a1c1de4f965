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
        "--trainer.accelerator=gpu",
        "--trainer.max_epochs=8",
        f"--trainer.default_root_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_matched"] < 0.2 * summary["barrier_loss_naive"]


def test_weight_matching_on_gpu_tensors_equals_cpu():
    from lmc.models import ResNet
    from lmc.permutation import apply_permutation, random_permutation, spec_for, weight_matching

    net = ResNet(20, width=1)
    spec = spec_for(net)
    state = net.state_dict()
    perm = random_permutation(spec.sizes(state), 0)
    permuted = {k: v.cuda() for k, v in apply_permutation(state, spec, perm).items()}
    result = weight_matching(
        {k: v.cuda() for k, v in state.items()}, permuted, spec, method="accelerated"
    )
    aligned = apply_permutation(permuted, spec, result.perm)
    assert all(torch.equal(aligned[k].cpu(), state[k]) for k in state)


def test_weight_matching_benchmark_runs_on_gpu(capsys):
    from benchmarks.weight_matching import main

    main(["--quick", "--device", "cuda", "--repeats", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    values = dict(pair.split("=") for pair in last.split())
    assert set(values) == {
        "wm_repeat_speedup_resnet20x16",
        "wm_repeat_speedup_vgg11x4",
        "wm_mlp_plain_vs_reference",
        "wm_mlp_accel_vs_reference",
    }
    assert all(float(v) > 0 for v in values.values())
