"""A torchvision model from YAML through `lmc fit` and the barrier and merge tasks (issue 19):
configs/torchvision/vit_cifar10.yaml (shrunk) trains on fake CIFAR-10, then its checkpoint and
a permuted copy have a zero weight-matched barrier and merge back into the model itself, the
spec (attention heads included) derived from the data module's images (``spec: auto``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torchvision.models import VisionTransformer

from lmc.data import write_fake_cifar10
from lmc.io import load_checkpoint, model_state_dict, save_net_checkpoint
from lmc.permutation import apply_permutation, random_permutation, resolve_spec
from tests.helpers import CONFIGS, checkpoints, run_cli, run_dirs

VIT = CONFIGS / "torchvision"
SMALL = {  # 2 heads of 8 dimensions, one block: seconds on the CPU
    "image_size": 32, "patch_size": 8, "num_layers": 1, "num_heads": 2, "hidden_dim": 16,
    "mlp_dim": 32, "num_classes": 10,
}  # fmt: skip
NET = [f"--model.init_args.net.init_args.{k}={v}" for k, v in SMALL.items()]
DATA = ["--data.init_args.val_size=16", "--data.init_args.alignment_size=32"]
QUIET = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("vit")
    write_fake_cifar10(root / "data", n_train=96, n_test=32)
    run_cli(
        "fit",
        "-c",
        str(VIT / "vit_cifar10.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        *NET,
        *DATA,
        *QUIET,
        f"--data.init_args.data_dir={root / 'data'}",
        "--data.init_args.batch_size=32",
        "--trainer.max_steps=4",
        "--test_after_fit=false",
        f"--trainer.default_root_dir={root / 'fit'}",
    )
    [run] = run_dirs(root / "fit")
    [ckpt] = checkpoints(run)
    state = model_state_dict(load_checkpoint(ckpt))
    spec = resolve_spec("auto", VisionTransformer(**SMALL), torch.zeros(2, 3, 32, 32))
    g = torch.Generator().manual_seed(0)
    state = {  # fresh LayerNorms and zero biases would leave the matching with ties
        k: torch.randn(v.shape, generator=g) if v.ndim == 1 else v for k, v in state.items()
    }
    assert {"encoder.layers.encoder_layer_0.self_attention:heads"} <= set(spec.groups)
    model, permuted = root / "model.ckpt", root / "permuted.ckpt"
    save_net_checkpoint(state, model)
    perm = random_permutation(spec.sizes(state), g)
    save_net_checkpoint(apply_permutation(state, spec, perm), permuted)
    return root / "data", model, permuted


def _validate(config: Path, data: Path, ckpts: list[Path], out: Path, *extra: str) -> dict:
    run_cli(
        "validate",
        "-c",
        str(config),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        *NET,
        *DATA,
        *QUIET,
        f"--data.init_args.data_dir={data}",
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        f"--trainer.default_root_dir={out}",
        *extra,
    )
    [run] = run_dirs(out)
    return json.loads((run / "summary.json").read_text())["summary"]


def test_vit_permuted_copy_has_zero_matched_barrier(trained, tmp_path):
    data, model, permuted = trained
    s = _validate(
        VIT / "vit_cifar10_barrier.yaml",
        data,
        [model, permuted],
        tmp_path,
        "--model.init_args.evaluation.num_alphas=5",
        "--model.init_args.evaluation.splits=[train]",
    )
    assert s["barrier_loss_naive"] > 1e-3  # the permutation breaks the straight line
    assert abs(s["barrier_loss_matched"]) < 1e-5  # weight matching undoes it exactly


def test_vit_merges_with_its_permuted_copy_into_itself(trained, tmp_path):
    data, model, permuted = trained
    cfg = yaml.safe_load((CONFIGS / "merge" / "mnist_mlp_baselines.yaml").read_text())
    barrier = yaml.safe_load((VIT / "vit_cifar10_barrier.yaml").read_text())
    cfg["model"]["init_args"].update(
        net=barrier["model"]["init_args"]["net"],
        num_models=[2],
        methods=["naive", "wm_ref"],
        evaluation={"splits": ["train"], "pairwise": False, "sharpness_probes": 0},
        spec="auto",
    )
    cfg["data"] = barrier["data"]
    path = tmp_path / "merge.yaml"
    path.write_text(yaml.safe_dump(cfg))
    s = _validate(path, data, [model, permuted], tmp_path / "out")
    assert s["wm_ref/n2/train/loss_gap"] == pytest.approx(0.0, abs=1e-5)
    assert s["wm_ref/n2/train/loss"] == pytest.approx(s["originals/model0/train/loss"], abs=1e-5)
    assert s["naive/n2/train/loss_gap"] > 1e-3


def test_the_saved_config_reruns_and_resumes(trained, tmp_path):
    """Issue 31 item 3: the saved config held ``norm_layer: Unable to serialize instance
    functools.partial(...)`` (torchvision's default), so a rerun or a resume exited with rc 2.
    Values jsonargparse cannot write are class defaults: left out, they apply again."""
    root = trained[0].parent
    [run] = run_dirs(root / "fit")
    saved = (run / "config.yaml").read_text()
    assert "Unable to serialize" not in saved
    assert "norm_layer" not in yaml.safe_load(saved)["model"]["init_args"]["net"]["init_args"]
    # a rerun from the saved config: one more step, the same network
    run_cli("fit", "-c", str(run / "config.yaml"), f"--trainer.default_root_dir={tmp_path}")
    [rerun] = run_dirs(tmp_path)
    first = model_state_dict(load_checkpoint(checkpoints(run)[0]))
    again = model_state_dict(load_checkpoint(checkpoints(rerun)[0]))
    assert all(torch.equal(first[k], again[k]) for k in first)  # same seed, data, steps
    # a resume with --ckpt_path last parses the checkpoint's hyperparameters back (it exited
    # with rc 2 on the partial) and finds the finished run: nothing more to train
    hparams = load_checkpoint(rerun / "checkpoints" / "last.ckpt")["hyper_parameters"]
    assert "Unable to serialize" not in json.dumps(hparams, default=str)
    run_cli(
        "fit",
        "-c",
        str(rerun / "config.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        "--ckpt_path=last",
    )
    assert run_dirs(tmp_path) == [rerun]
    assert load_checkpoint(rerun / "checkpoints" / "last.ckpt")["global_step"] == 4
