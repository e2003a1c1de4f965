"""Curve and PAM tasks through ``lmc fit`` / ``lmc validate`` on tiny fake data (SPEC C6)."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
import torch
import yaml
from jsonargparse import ArgumentParser

from lmc.cli import build_cli, moved_keys_error
from lmc.curves import CurveEvaluationOptions
from lmc.data import write_fake_cifar10, write_fake_mnist
from lmc.tasks import CurveTask, PAMTask
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
        "--model.init_args.evaluation.num_ts=3",
    ]
    init = load_yaml(config)["model"]["init_args"]
    args.append(f"--model.init_args.net.init_args.width={SMALL[init['net']['class_path']]}")
    if init["net"]["class_path"] == "lmc.models.ResNet":
        args.append("--model.init_args.net.init_args.depth=8")
    if _plane(init) != "none":
        args.append("--model.init_args.plane.size=2")
    if _attack(init):
        args.append("--model.init_args.robust.attack.steps=1")
    if "pam" in init:  # PAM: one permutation epoch, one curve epoch
        args += [
            "--model.init_args.pam.perm_epochs=1",
            "--model.init_args.pam.curve_epochs=1",
            "--trainer.max_epochs=2",
            "--model.init_args.pam.bvn_samples=4",
            "--model.init_args.pam.select_batches=1",
        ]
    else:
        args.append("--trainer.max_epochs=1")
    return args


def _plane(init: dict) -> str:
    return (init.get("plane") or {}).get("kind", "none")


def _attack(init: dict) -> dict | None:
    return (init.get("robust") or {}).get("attack")


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
    if _attack(cfg["model"]["init_args"]):
        assert isinstance(summary["test/robust_acc_min"], float)
    if _plane(cfg["model"]["init_args"]) != "none":
        assert (run / "plane.png").exists()
    if "pam" in cfg["model"]["init_args"]:
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
        "--model.init_args.pam.curve_epochs=3",
        "--trainer.max_epochs=4",
        "--trainer.limit_train_batches=4",
        "--model.init_args.pam.perm_lr=0.05",
        "--model.init_args.alignment.method=none",
    )
    summary = _summary(run_dirs(tmp_path)[0])
    [rounding] = summary["pam_rounds"]
    assert rounding["objective_chosen"] <= rounding["objective_previous"]
    assert summary["pam_units_moved"] == rounding["units_moved"] >= 0
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
        "--model.init_args.plane.kind=none",
    )
    summary = _summary(run_dirs(tmp_path)[0])
    assert summary["align_corr_after"] > summary["align_corr_before"]
    assert summary["test/acc_min"] <= min(summary["test/acc_start"], summary["test/acc_end"])


# grouped options (issue #12) ------------------------------------------------------------------
def _moved_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_old_flat_key_in_a_yaml_file_names_its_new_key(tmp_path, capsys):
    old = load_yaml(FMNIST)
    init = old["model"]["init_args"]
    init["bn_mode"] = init.pop("batchnorm")["mode"]
    init["plane"] = init["plane"]["kind"]  # a group's name given a plain value, as before
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    err = _moved_error(capsys, "fit", "-c", str(path))
    assert "model.init_args.bn_mode moved to model.init_args.batchnorm.mode" in err
    assert "model.init_args.plane moved to model.init_args.plane.kind" in err
    assert str(path) in err


def test_old_flat_key_on_the_command_line_names_its_new_key(capsys):
    err = _moved_error(capsys, "fit", "-c", str(FMNIST), "--model.init_args.num_ts=3")
    assert "model.init_args.num_ts moved to model.init_args.evaluation.num_ts" in err
    err = _moved_error(capsys, "fit", "-c", str(FMNIST_PAM), "--model.init_args.start", "unaligned")
    assert "model.init_args.start moved to model.init_args.alignment.method" in err


def test_moved_keys_check_reads_only_the_model_class_and_its_keys():
    new = ["fit", "-c", str(FMNIST), "--model.init_args.plane.size=3"]
    assert moved_keys_error(new) is None
    assert moved_keys_error([*new, "--model.init_args.plane=null"]) is None
    # InterpolationTask has its own table: CurveTask's num_ts means nothing to it
    assert moved_keys_error(["--model=lmc.tasks.InterpolationTask", "--model.num_ts=3"]) is None
    err = moved_keys_error(["--model=lmc.tasks.InterpolationTask", "--model.splits=[test]"])
    assert "model.init_args.splits moved to model.init_args.evaluation.splits" in err
    err = moved_keys_error(
        {"fit": {"model": {"class_path": "PAMTask", "init_args": {"perm_epochs": 2}}}}
    )
    assert "model.init_args.perm_epochs moved to model.init_args.pam.perm_epochs" in err


def _config_keys(task: type) -> set[str]:
    """The init arguments LightningCLI reads for ``task`` (``**kwargs`` resolved)."""
    parser = ArgumentParser()
    parser.add_class_arguments(task, "model", fail_untyped=False)
    return set(parser.get_defaults().model.as_dict())


def test_constructors_take_at_most_twelve_arguments():
    for task in (CurveTask, PAMTask):
        params = list(inspect.signature(task.__init__).parameters)[1:]
        assert len(params) <= 12, (task.__name__, params)
        assert len(_config_keys(task)) <= 12


def test_pam_reuses_the_curve_groups_and_sizes_a_derived_spec_in_setup(
    tmp_path, fake_data, endpoints
):
    # PAM passes CurveTask's groups through (**kwargs) and adds only its own group
    assert _config_keys(PAMTask) == _config_keys(CurveTask) - {"scheduler_interval"} | {"pam"}
    # built from YAML: the evaluation group sets PAM's t grid; spec: derive needs the data
    overlay = [
        a
        for a in _overlay(FMNIST_PAM, tmp_path, fake_data, endpoints(FMNIST_PAM))
        if "num_ts" not in a
    ]
    evaluation = tmp_path / "evaluation.yaml"
    evaluation.write_text(yaml.safe_dump({"model": {"init_args": {"evaluation": {"num_ts": 4}}}}))
    cli = build_cli(
        [
            "fit",
            "-c",
            str(FMNIST_PAM),
            "-c",
            CSV,
            "-c",
            str(evaluation),
            *overlay,
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--model.init_args.spec=derive",
        ]
    )
    task = cli.model
    assert isinstance(task.eval_opts, CurveEvaluationOptions) and len(task.result.ts) == 4
    assert task.groups and len(task.mats) == len(task.groups)
    # a checkpoint of a derived-spec PAM loads without a data module
    [ckpt] = checkpoints(run_dirs(tmp_path)[0])
    loaded = PAMTask.load_from_checkpoint(ckpt)
    assert loaded.groups == task.groups
    for g, p in task.current_perm().items():
        assert torch.equal(loaded.current_perm()[g], p)


def test_spec_source_and_hand_built_groups(endpoints):
    net, ckpts = _net(FMNIST), [str(p) for p in endpoints(FMNIST)]
    with pytest.raises(ValueError, match="model.init_args.spec"):
        CurveTask(net, ckpts, spec="no-such-source")
    task = CurveTask(net, ckpts, evaluation=CurveEvaluationOptions(num_ts=5), spec="builtin")
    assert task.eval_opts.num_ts == 5 and task.hparams["evaluation"]["num_ts"] == 5
    assert task.bn_opts.mode == "recompute" and task.align_opts.method == "none"
    pam = PAMTask(net, ckpts, evaluation={"num_ts": 7})  # a group passed through as a mapping
    assert pam.align_opts.method == "correlation"  # "PAM Aligned" by default
    assert pam.eval_opts.num_ts == 7 and pam.hparams["evaluation"]["num_ts"] == 7
