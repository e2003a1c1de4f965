"""A user's own network, trained and barrier-evaluated through `lmc fit` / `lmc validate` alone:
the permutation spec is derived from the data module's inputs (`spec: auto`) or comes from a
user function (`spec: package.module:function`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lmc.data import write_fake_mnist
from lmc.io import load_checkpoint, model_state_dict, save_net_checkpoint
from lmc.permutation import apply_permutation, random_permutation, resolve_spec
from tests.helpers import CONFIGS, checkpoints, run_cli, run_dirs
from tests.tasks.custom_net import ResidualMLP

NET = {"class_path": "tests.tasks.custom_net.ResidualMLP", "init_args": {"width": 16}}
DATA = ["--data.init_args.val_size=32", "--data.init_args.alignment_size=64"]


def _config(name: str, tmp: Path, **init_args) -> Path:
    cfg = yaml.safe_load((CONFIGS / "mnist" / name).read_text())
    cfg["model"]["init_args"]["net"] = NET
    cfg["model"]["init_args"].update(init_args)
    path = tmp / f"custom_{name}"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The data folder, a checkpoint trained by `lmc fit` and a permuted copy of it."""
    root = tmp_path_factory.mktemp("custom")
    write_fake_mnist(root / "data", "MNIST", n_train=160, n_test=64)
    run_cli(
        "fit",
        "-c",
        str(_config("mlp.yaml", root)),
        "--trainer.max_epochs=2",
        "--test_after_fit=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root / 'fit'}",
        f"--data.init_args.data_dir={root / 'data'}",
        "--data.init_args.batch_size=32",
        "--trainer.logger.init_args.offline=true",
        *DATA,
    )
    [run] = run_dirs(root / "fit")
    [ckpt] = checkpoints(run)
    state = model_state_dict(load_checkpoint(ckpt))
    net = ResidualMLP(width=16)
    spec = resolve_spec("auto", net, torch.zeros(2, 1, 28, 28))
    perm = random_permutation(spec.sizes(state), torch.Generator().manual_seed(0))
    permuted = root / "permuted.ckpt"
    save_net_checkpoint(apply_permutation(state, spec, perm), permuted)
    return root / "data", ckpt, permuted


def _barriers(data: Path, ckpts: list[Path], out: Path, spec: str) -> dict:
    run_cli(
        "validate",
        "-c",
        str(_config("mlp_barrier.yaml", out.parent, spec=spec)),
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        f"--trainer.default_root_dir={out}",
        f"--data.init_args.data_dir={data}",
        "--model.init_args.evaluation.num_alphas=5",
        "--trainer.logger.init_args.offline=true",
        *DATA,
    )
    [run] = run_dirs(out)
    return json.loads((run / "summary.json").read_text())["summary"]


@pytest.mark.parametrize("spec", ["auto", "tests.tasks.custom_net:residual_mlp_spec"])
def test_custom_network_permuted_copy_has_zero_matched_barrier(trained, tmp_path, spec):
    data, ckpt, permuted = trained
    s = _barriers(data, [ckpt, permuted], tmp_path / "val", spec)
    assert s["barrier_loss_naive"] > 1e-3  # the permutation does break the straight line
    assert abs(s["barrier_loss_matched"]) < 1e-5  # weight matching undoes it exactly


def test_builtin_spec_of_a_custom_network_is_refused_before_work(trained, tmp_path):
    data, ckpt, permuted = trained
    # LightningCLI wraps the task's TypeError into a ValueError with the same message
    with pytest.raises((TypeError, ValueError), match="no built-in permutation spec for Residual"):
        _barriers(data, [ckpt, permuted], tmp_path / "val", "builtin")
    assert not list(tmp_path.rglob("summary.json"))


def test_trained_merge_task_names_the_fix_for_a_spec_derived_from_data(trained):
    from lmc.tasks import TrainedMergeTask

    _, ckpt, permuted = trained
    with pytest.raises(ValueError, match="package.module:function"):
        TrainedMergeTask(ResidualMLP(width=16), [str(ckpt), str(permuted)], methods=["ste"])


def test_malformed_spec_source_is_refused(trained):
    from lmc.tasks import InterpolationTask

    _, ckpt, permuted = trained
    with pytest.raises(ValueError, match="is not a spec source"):
        InterpolationTask(ResidualMLP(width=16), [str(ckpt), str(permuted)], spec="no-colon")
