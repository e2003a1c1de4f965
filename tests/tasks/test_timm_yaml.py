"""A timm model from YAML (issue 35): configs/timm/convnext_cifar10.yaml (shrunk) trains on fake
CIFAR-10; its checkpoint and a permuted copy have a zero weight-matched barrier, the spec derived
from the data module's images (``spec: auto``) through timm's LayerNorm2d and layer scale."""

from __future__ import annotations

import json

import torch
from timm.models.convnext import ConvNeXt

from lmc.data import write_fake_cifar10
from lmc.io import load_checkpoint, model_state_dict, save_net_checkpoint
from lmc.permutation import apply_permutation, random_permutation, resolve_spec
from tests.helpers import CONFIGS, checkpoints, run_cli, run_dirs

TIMM = CONFIGS / "timm"
SMALL = {"depths": [1, 1, 1, 1], "dims": [8, 16, 24, 32], "conv_mlp": True, "num_classes": 10}
NET = [
    "--model.init_args.net.init_args.depths=[1, 1, 1, 1]",
    "--model.init_args.net.init_args.dims=[8, 16, 24, 32]",
]
COMMON = [
    "-c",
    str(CONFIGS / "loggers" / "csv.yaml"),
    *NET,
    "--data.init_args.val_size=16",
    "--data.init_args.alignment_size=32",
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def test_a_convnext_from_yaml_and_its_permuted_copy_have_zero_matched_barrier(tmp_path):
    data = tmp_path / "data"
    write_fake_cifar10(data, n_train=96, n_test=32)
    run_cli(
        "fit",
        "-c",
        str(TIMM / "convnext_cifar10.yaml"),
        *COMMON,
        f"--data.init_args.data_dir={data}",
        "--data.init_args.batch_size=32",
        "--trainer.max_steps=4",
        "--test_after_fit=false",
        f"--trainer.default_root_dir={tmp_path / 'fit'}",
    )
    [run] = run_dirs(tmp_path / "fit")
    state = model_state_dict(load_checkpoint(checkpoints(run)[0]))
    spec = resolve_spec("auto", ConvNeXt(**SMALL), torch.zeros(2, 3, 32, 32))
    g = torch.Generator().manual_seed(0)
    state = {  # fresh norms and layer scales would leave the matching with ties
        k: torch.randn(v.shape, generator=g) if v.ndim == 1 else v for k, v in state.items()
    }
    model, permuted = tmp_path / "model.ckpt", tmp_path / "permuted.ckpt"
    save_net_checkpoint(state, model)
    save_net_checkpoint(
        apply_permutation(state, spec, random_permutation(spec.sizes(state), g)), permuted
    )
    run_cli(
        "validate",
        "-c",
        str(TIMM / "convnext_cifar10_barrier.yaml"),
        *COMMON,
        f"--data.init_args.data_dir={data}",
        f"--model.init_args.checkpoints=[{model}, {permuted}]",
        "--model.init_args.evaluation.num_alphas=5",
        "--model.init_args.evaluation.splits=[train]",
        f"--trainer.default_root_dir={tmp_path / 'barrier'}",
    )
    [out] = run_dirs(tmp_path / "barrier")
    s = json.loads((out / "summary.json").read_text())["summary"]
    assert s["barrier_loss_naive"] > 1e-3  # the permutation breaks the straight line
    assert abs(s["barrier_loss_matched"]) < 1e-5  # weight matching undoes it exactly
