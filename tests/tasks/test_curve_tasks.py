"""Curve and PAM tasks through ``lmc fit`` / ``lmc validate`` on tiny fake data (SPEC C6)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from lmc.data import write_fake_cifar10, write_fake_mnist
from tests.helpers import (
    CONFIGS,
    checkpoints,
    load_yaml,
    read_wandb_summary,
    run_cli,
    run_dirs,
    wandb_run_dirs,
)

FMNIST = CONFIGS / "curves" / "fmnist_vgg11.yaml"
FMNIST_PAM = CONFIGS / "curves" / "fmnist_vgg11_pam.yaml"
# every curve config runs below; these two in their own, more thorough tests
CURVE_CONFIGS = sorted(
    p
    for p in (CONFIGS / "curves").glob("*.yaml")
    if load_yaml(p)["model"]["class_path"] in ("lmc.tasks.CurveTask", "lmc.tasks.PAMTask")
    and p not in (FMNIST, FMNIST_PAM)
)
ROBUST_ENDPOINTS = sorted(
    p
    for p in (CONFIGS / "curves").glob("*.yaml")
    if load_yaml(p)["model"]["class_path"] == "lmc.tasks.AdversarialClassificationTask"
)
CSV = str(CONFIGS / "loggers" / "csv.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (see tests/conftest.py)


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("curve_data")
    write_fake_mnist(root, "MNIST", n_train=64, n_test=24)
    write_fake_mnist(root, "FashionMNIST", n_train=64, n_test=24)
    write_fake_cifar10(root, n_train=64, n_test=24, archive=False)
    return root


# CPU-sized widths: the same code paths as the recipes, a fraction of the compute
SMALL = {
    "lmc.models.ResNet": 0.25,
    "lmc.models.TinyTen": 0.25,
    "lmc.models.VGG": 0.0625,
    "lmc.models.MLP": 32,
}


def _net(config: Path) -> torch.nn.Module:
    spec = load_yaml(config)["model"]["init_args"]["net"]
    module, name = spec["class_path"].rsplit(".", 1)
    init = dict(spec.get("init_args", {}), width=SMALL[spec["class_path"]])
    if "depth" in init and spec["class_path"] == "lmc.models.ResNet":
        init["depth"] = 8
    return getattr(importlib.import_module(module), name)(**init)


def _input_shape(config: Path) -> tuple[int, ...]:
    return (3, 32, 32) if "CIFAR" in load_yaml(config)["data"]["class_path"] else (1, 28, 28)


def _save(state: dict, path: Path) -> Path:
    torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, path)
    return path


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    """Two briefly trained endpoint checkpoints per architecture (cached per config's net)."""
    root = tmp_path_factory.mktemp("endpoints")
    cache: dict[str, list[Path]] = {}

    def make(config: Path) -> list[Path]:
        key = json.dumps(load_yaml(config)["model"]["init_args"]["net"], sort_keys=True)
        if key not in cache:
            shape, paths = _input_shape(config), []
            for seed in (0, 1):
                torch.manual_seed(seed)
                net = _net(config).train()
                opt = torch.optim.SGD(net.parameters(), lr=0.05)
                for _ in range(3):
                    x, y = torch.randn(16, *shape), torch.randint(0, 10, (16,))
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(net(x), y).backward()
                    opt.step()
                paths.append(_save(net.state_dict(), root / f"{len(cache)}_{seed}.ckpt"))
            cache[key] = paths
        return cache[key]

    return make


def _overlay(config: Path, out: Path, data: Path, ckpts: list[Path]) -> list[str]:
    args = [
        f"--model.init_args.checkpoints=[{', '.join(map(str, ckpts))}]",
        f"--trainer.default_root_dir={out}",
        f"--data.init_args.data_dir={data}",
        "--data.init_args.val_size=8",
        "--data.init_args.alignment_size=16",
        "--data.init_args.batch_size=8",
        "--data.init_args.eval_batch_size=16",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        "--trainer.callbacks=[]",
        "--model.init_args.num_ts=3",
    ]
    init = load_yaml(config)["model"]["init_args"]
    args.append(f"--model.init_args.net.init_args.width={SMALL[init['net']['class_path']]}")
    if init["net"]["class_path"] == "lmc.models.ResNet":
        args.append("--model.init_args.net.init_args.depth=8")
    if init.get("plane", "none") != "none":
        args.append("--model.init_args.plane_size=2")
    if init.get("attack"):
        args.append("--model.init_args.attack.steps=1")
    if "perm_epochs" in init:  # PAM: one permutation epoch, one curve epoch
        args += [
            "--model.init_args.perm_epochs=1",
            "--model.init_args.curve_epochs=1",
            "--trainer.max_epochs=2",
            "--model.init_args.bvn_samples=4",
            "--model.init_args.select_batches=1",
        ]
    else:
        args.append("--trainer.max_epochs=1")
    return args


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["summary"]


@pytest.mark.parametrize("config", CURVE_CONFIGS, ids=lambda p: p.stem)
def test_every_curve_config_fits_and_evaluates(config, tmp_path, fake_data, endpoints):
    cfg = load_yaml(config)
    assert cfg["seed_everything"] == 0 and cfg["model"]["init_args"]["net"][
        "class_path"
    ].startswith("lmc.")
    run_cli(
        "fit",
        "-c",
        str(config),
        "-c",
        CSV,
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        *_overlay(config, tmp_path, fake_data, endpoints(config)),
    )
    [run] = run_dirs(tmp_path)
    summary = _summary(run)
    for key in ("test/acc_min", "test/acc_mean", "test/acc_arc_mean", "train/loss_max"):
        assert isinstance(summary[key], float)
    assert (run / "curve.png").exists() and checkpoints(run)
    if cfg["model"]["init_args"].get("attack"):
        assert isinstance(summary["test/robust_acc_min"], float)
    if cfg["model"]["init_args"].get("plane", "none") != "none":
        assert (run / "plane.png").exists()
    if "perm_epochs" in cfg["model"]["init_args"]:
        assert len(summary["pam_rounds"]) == 1
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss_epoch", "curve/test/acc", "curve/test/acc_min"} <= set(header)


@pytest.mark.parametrize("config", ROBUST_ENDPOINTS, ids=lambda p: p.stem)
def test_robust_endpoint_configs_train(config, tmp_path, fake_data):
    run_cli(
        "fit",
        "-c",
        str(config),
        "-c",
        CSV,
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--trainer.default_root_dir={tmp_path}",
        f"--data.init_args.data_dir={fake_data}",
        "--data.init_args.val_size=8",
        "--data.init_args.alignment_size=8",
        "--data.init_args.batch_size=8",
        "--trainer.limit_train_batches=2",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks=[]",
        "--model.init_args.attack.steps=1",
        f"--model.init_args.net.init_args.width={SMALL[load_yaml(config)['model']['init_args']['net']['class_path']]}",
    )
    [run] = run_dirs(tmp_path)
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val/acc", "val/robust_acc", "test/robust_acc", "train/loss"} <= set(header)


def test_wandb_report_and_validate_from_the_saved_checkpoint(tmp_path, fake_data, endpoints):
    overlay = _overlay(FMNIST, tmp_path / "fit", fake_data, endpoints(FMNIST))
    run_cli("fit", "-c", str(FMNIST), *overlay, "--trainer.logger.init_args.offline=true")
    [run] = run_dirs(tmp_path / "fit")
    fitted = _summary(run)
    for key in ("test/acc_min", "test/acc_mean", "test/acc_arc_mean", "train/loss_max"):
        assert isinstance(fitted[key], float)
    assert (run / "curve.png").exists() and (run / "plane.png").exists()
    assert fitted["align_corr_after"] > fitted["align_corr_before"]
    [wrun] = wandb_run_dirs(tmp_path / "fit")
    logged = read_wandb_summary(wrun)["summary"]
    assert logged["curve/test/acc_min"] == pytest.approx(fitted["test/acc_min"])
    assert "curve/table" in logged and "curve/figure" in logged and "curve/plane" in logged
    # lmc validate from the run's config and checkpoint evaluates the same curve
    [ckpt] = checkpoints(run)
    run_cli(
        "validate",
        "--config",
        str(run / "config.yaml"),
        f"--ckpt_path={ckpt}",
        f"--trainer.default_root_dir={tmp_path / 'val'}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'val'}",
    )
    [again] = run_dirs(tmp_path / "val")
    validated = _summary(again)
    for key in ("test/loss_max", "test/acc_min", "train/loss_arc_mean"):
        assert validated[key] == pytest.approx(fitted[key], rel=1e-5)


def test_pam_final_objective_is_no_worse_than_the_start(tmp_path, fake_data, endpoints):
    config = FMNIST_PAM
    run_cli(
        "fit",
        "-c",
        str(config),
        "-c",
        CSV,
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        *_overlay(config, tmp_path, fake_data, endpoints(config)),
        "--model.init_args.curve_epochs=3",
        "--trainer.max_epochs=4",
        "--trainer.limit_train_batches=4",
        "--model.init_args.perm_lr=0.05",
        "--model.init_args.start=unaligned",
    )
    summary = _summary(run_dirs(tmp_path)[0])
    [rounding] = summary["pam_rounds"]
    assert rounding["objective_chosen"] <= rounding["objective_previous"]
    assert summary["pam_objective_end"] <= summary["pam_objective_start"]


def test_wrong_number_of_checkpoints_is_a_clear_error(tmp_path, fake_data, endpoints):
    ckpts = endpoints(FMNIST)
    with pytest.raises(ValueError, match="exactly 2 checkpoints"):
        run_cli("fit", "-c", str(FMNIST), *_overlay(FMNIST, tmp_path, fake_data, ckpts[:1]))


def test_validate_without_checkpoint_evaluates_the_aligned_line(tmp_path, fake_data, endpoints):
    run_cli(
        "validate",
        "-c",
        str(FMNIST),
        "-c",
        CSV,
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        *_overlay(FMNIST, tmp_path, fake_data, endpoints(FMNIST)),
        "--model.init_args.plane=none",
    )
    summary = _summary(run_dirs(tmp_path)[0])
    assert summary["align_corr_after"] > summary["align_corr_before"]
    assert summary["test/acc_min"] <= min(summary["test/acc_start"], summary["test/acc_end"])
