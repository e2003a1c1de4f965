"""End-to-end CLI tests: every shipped config runs, runs are rerunnable, errors are clear."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lmc.data import write_fake_cifar10, write_fake_cifar100, write_fake_mnist
from lmc.io import load_checkpoint
from tests.helpers import (
    CONFIGS,
    checkpoints,
    load_yaml,
    read_wandb_summary,
    run_cli,
    run_dirs,
    wandb_run_dirs,
)

# every lmc config (logger and speed overlays and study files, which are not lmc runs, aside)
SHIPPED = sorted(
    p
    for p in CONFIGS.rglob("*.yaml")
    if not {"loggers", "speed"} & set(p.parts) and "model" in load_yaml(p)
)
TRAINING = [
    p
    for p in SHIPPED
    if load_yaml(p)["model"]["class_path"]
    in ("lmc.tasks.ClassificationTask", "lmc.tasks.RegressionTask")
]


@pytest.fixture(scope="session")
def fake_data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fake_data")
    write_fake_mnist(root, "MNIST", n_train=48, n_test=16)
    write_fake_mnist(root, "FashionMNIST", n_train=48, n_test=16)
    write_fake_cifar10(root, n_train=48, n_test=16, archive=True)
    write_fake_cifar100(root, n_train=48, n_test=16, archive=False)
    return root


def _tiny_overlay(config: Path, root: Path, data_dir: Path) -> list[str]:
    cfg = load_yaml(config)
    data = cfg["data"]["class_path"]
    # a ClassSubset's (FederatedClients') loader and split settings are those of the data module
    # it wraps
    wraps = data in ("lmc.data.ClassSubset", "lmc.data.FederatedClients")
    inner = "--data.init_args.data.init_args." if wraps else None
    args = [
        "--trainer.max_steps=1",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        f"--trainer.default_root_dir={root}",
        "--data.init_args.batch_size=4",
    ]
    if "Teacher" in data or "Polynomial" in data:
        args += [
            "--data.init_args.n_train=32",
            "--data.init_args.n_val=8",
            "--data.init_args.n_test=8",
        ]
    else:
        args += [
            f"--data.init_args.data_dir={data_dir}",
            "--data.init_args.val_size=8",
            "--data.init_args.alignment_size=8",
        ]
    if inner:
        args = [a.replace("--data.init_args.", inner) for a in args]
    if data == "lmc.data.FederatedClients":  # a few examples of each class: two clients
        args.append("--data.init_args.clients=2")
    net = cfg["model"]["init_args"].get("net", {}).get("init_args", {})
    if net.get("width", 1) > 2:  # x4/x16 recipes: same code path, CPU-sized
        args.append("--model.init_args.net.init_args.width=1")
    return args


@pytest.mark.parametrize("config", TRAINING, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_training_config_runs_one_step(config, tmp_path, fake_data_dir):
    run_cli("fit", "-c", str(config), *_tiny_overlay(config, tmp_path, fake_data_dir))
    [run] = run_dirs(tmp_path)
    [ckpt] = checkpoints(run)
    state = load_checkpoint(ckpt)["state_dict"]  # weights_only=True
    assert state and all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    saved = load_yaml(run / "config.yaml")
    assert saved["model"]["class_path"] == load_yaml(config)["model"]["class_path"]
    assert saved["seed_everything"] == 0
    # what it saved reruns (a new run, the same step) and resumes (one step more), issue 31
    run_cli("fit", "--config", str(run / "config.yaml"))
    [rerun] = [r for r in run_dirs(tmp_path) if r != run]
    [again] = checkpoints(rerun)
    again_state = load_checkpoint(again)
    assert again_state["global_step"] == 1
    assert all(torch.equal(v, again_state["state_dict"][k]) for k, v in state.items())
    run_cli(
        "fit",
        "--config",
        str(rerun / "config.yaml"),
        f"--ckpt_path={rerun}",
        "--trainer.max_steps=2",
        "--trainer.max_epochs=2",  # the one-step run's checkpoint may close its epoch
    )
    resumed = max(checkpoints(rerun), key=lambda p: p.stat().st_mtime)
    assert load_checkpoint(resumed)["global_step"] == 2


@pytest.mark.parametrize(
    "config",
    [p for p in SHIPPED if p not in TRAINING],
    ids=lambda p: str(p.relative_to(CONFIGS)),
)
def test_every_other_config_saves_a_config_that_parses_back(config, tmp_path):
    """Merge, curve and barrier configs need trained endpoints to run; what `lmc` would save of
    them (the parsed config, dumped as the run's config.yaml is) parses back to the same config."""
    from lmc.io import config_to_save, drop_unserializable
    from lmc.studies.spec.check import resolve_config

    first = resolve_config(["fit", "-c", str(config)])
    saved = tmp_path / "config.yaml"
    saved.write_text(config_to_save(yaml.safe_dump(first, sort_keys=False)))
    again = resolve_config(["fit", "--config", str(saved)])
    assert drop_unserializable(again) == drop_unserializable(first)


def _fit_quick(root: Path, *extra: str) -> Path:
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "synthetic" / "teacher_student.yaml"),
        "--trainer.max_epochs=3",
        f"--trainer.default_root_dir={root}",
        "--data.init_args.n_train=400",
        *extra,
    )
    return run_dirs(root)[-1]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    [ckpt] = checkpoints(run)
    return load_checkpoint(ckpt)["state_dict"]


def test_rerun_from_saved_config_reproduces_metrics(tmp_path):
    first = _fit_quick(tmp_path / "a")
    saved = first / "config.yaml"
    # the logger's save_dir is not pinned: it follows trainer.default_root_dir (issue 13), which is
    cfg = load_yaml(saved)["trainer"]
    assert cfg["logger"]["init_args"]["save_dir"] is None
    assert cfg["default_root_dir"] == str(tmp_path / "a")

    run_cli("fit", "--config", str(saved))
    second = [r for r in run_dirs(tmp_path / "a") if r != first]
    assert len(second) == 1, "the rerun must get its own run directory"
    w1, w2 = _weights(first), _weights(second[0])
    assert w1.keys() == w2.keys()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)

    s1, s2 = (read_wandb_summary(r) for r in wandb_run_dirs(tmp_path / "a"))
    for key in ("test/loss", "test/mse", "val/loss", "train/loss"):
        assert s1["summary"][key] == s2["summary"][key]


def test_different_seed_changes_the_run(tmp_path):
    a = _weights(_fit_quick(tmp_path / "a"))
    b = _weights(_fit_quick(tmp_path / "b", "--seed_everything=1"))
    assert not torch.equal(a["net.hidden.weight"], b["net.hidden.weight"])


def test_wandb_offline_run_holds_logged_metrics_and_config(tmp_path):
    _fit_quick(tmp_path)
    [wrun] = wandb_run_dirs(tmp_path)
    summary = read_wandb_summary(wrun)
    assert summary["state"] == "finished"
    assert {"train/loss", "val/loss", "val/mse", "test/loss", "test/mse", "epoch"} <= set(
        summary["summary"]
    )
    assert summary["summary"]["test/loss"] < 1.0
    assert summary["config"]["data"]["class_path"] == "lmc.data.TeacherStudentDataModule"
    assert summary["tags"] == ["synthetic", "teacher-student"]
    # every option once: under model.init_args, not again under the task's bare names
    assert "width" in summary["config"]["model"]["init_args"]["net"]["init_args"]
    assert not {"net", "optimizer", "lr_scheduler", "_instantiator"} & set(summary["config"])


def test_test_subcommand_from_saved_config_and_checkpoint(tmp_path):
    run = _fit_quick(tmp_path / "fit")
    [ckpt] = checkpoints(run)
    run_cli("test", "--config", str(run / "config.yaml"), f"--ckpt_path={ckpt}")
    fit_summary, test_summary = (read_wandb_summary(r) for r in wandb_run_dirs(tmp_path / "fit"))
    assert test_summary["summary"]["test/loss"] == pytest.approx(
        fit_summary["summary"]["test/loss"], rel=1e-6
    )


def test_csv_logger_overlay(tmp_path):
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "synthetic" / "teacher_student.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        "--trainer.max_epochs=1",
        "--data.init_args.n_train=200",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val/loss", "val/mse", "train/loss", "test/loss"} <= set(header)
    assert checkpoints(run)


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "mnist" / "mlp.yaml"),
            f"--data.init_args.data_dir={tmp_path / 'empty'}",
            f"--trainer.default_root_dir={tmp_path}",
        )
    msg = str(err.value)
    assert (
        str(tmp_path / "empty") in msg
        and "train-images-idx3-ubyte" in msg
        and "LMC_DATA_DIR" in msg
    )


def test_malformed_config_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONFIGS / "quickstart.yaml").read_text().replace("width: 16", "widht: 16"))
    assert "widht" in bad.read_text()
    with pytest.raises(SystemExit) as err:
        run_cli("fit", "-c", str(bad))
    assert err.value.code != 0
    assert "widht" in capsys.readouterr().err


def test_corrupt_checkpoint_fails_before_work(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"garbage")
    from lmc.io import CheckpointError

    with pytest.raises(CheckpointError, match="bad.ckpt"):
        run_cli(
            "test",
            "-c",
            str(CONFIGS / "quickstart.yaml"),
            f"--ckpt_path={bad}",
            f"--trainer.default_root_dir={tmp_path}",
        )


def test_help_and_module_entry_point():
    with pytest.raises(SystemExit) as err:
        run_cli("--help")
    assert err.value.code == 0
    with pytest.raises(SystemExit) as err:
        run_cli("fit", "--help")  # a command's own help is LightningCLI's
    assert err.value.code == 0


def test_help_lists_every_command_without_importing_lightning():
    code = (
        "import sys\nfrom lmc.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit as e:\n    print('exit', e.code)\n"
        "print('lightning loaded:', any(m.startswith('lightning') for m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    for command in ("fit", "validate", "test", "predict", "study", "configs", "completion"):
        assert re.search(rf"^  {command} +\S", out, re.M), command
    assert "exit 0" in out and "lightning loaded: False" in out


@pytest.mark.parametrize(
    "typed, near", [("fitt", "'fit'"), ("studdy", "'study'"), ("valdate", "'validate'")]
)
def test_a_mistyped_command_names_the_nearest(typed, near, capsys):
    with pytest.raises(SystemExit) as err:
        run_cli(typed, "--config", "x.yaml")
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert f"unknown command {typed!r}; did you mean {near}" in message
    assert "commands: fit, validate, test, predict, study, configs, completion" in message


def _complete(shell_words: str, tmp_path: Path) -> list[str]:
    """What bash offers for ``shell_words`` (the last word is being completed) with the
    script of ``lmc completion bash``."""
    script = tmp_path / "lmc.bash"
    with pytest.raises(SystemExit):
        with open(script, "w") as f, contextlib.redirect_stdout(f):
            run_cli("completion", "bash")
    words = shell_words.split(" ")
    probe = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _lmc; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    out = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    return sorted(out.split())


def test_bash_completion_offers_commands_study_steps_and_options(tmp_path):
    assert _complete("lmc st", tmp_path) == ["study"]
    assert _complete("lmc study r", tmp_path) == ["report", "run"]
    assert _complete("lmc fit --tr", tmp_path) == ["--trainer."]
    assert _complete("lmc completion z", tmp_path) == ["zsh"]
    (tmp_path / "run.yaml").write_text("")
    assert "run.yaml" in _complete("lmc fit --config ru", tmp_path)


def test_zsh_completion_loads_the_bash_script_and_a_bad_shell_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        run_cli("completion", "zsh")
    assert err.value.code == 0
    out = capsys.readouterr().out
    assert "bashcompinit" in out and "complete -o filenames" in out
    with pytest.raises(SystemExit) as err:
        run_cli("completion", "fish")
    assert err.value.code == 2
    assert "usage: lmc completion bash|zsh" in capsys.readouterr().err


def test_quickstart_trains_two_models_and_matching_removes_the_barrier(tmp_path):
    import json

    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "quickstart.yaml"),
        "--trainer.max_epochs=8",
        "--model.init_args.evaluation.num_alphas=9",
        f"--trainer.default_root_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_naive"] > 0.02
    assert summary["barrier_loss_matched"] < 0.2 * summary["barrier_loss_naive"]
    assert (run / "interpolation.png").exists() and (run / "config.yaml").exists()
    [wrun] = wandb_run_dirs(tmp_path)
    logged = read_wandb_summary(wrun)["summary"]
    assert logged["interp/barrier_loss_matched"] == pytest.approx(summary["barrier_loss_matched"])


def test_abbreviated_options_are_refused_with_one_readable_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "quickstart.yaml"),
            "--trainer.max_epoch=2",  # not max_epochs: no prefix matching
            f"--trainer.default_root_dir={tmp_path}",
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "lmc fit: error: unrecognized arguments: --trainer.max_epoch=2"
    assert len(err) == 2 and not list(tmp_path.rglob("*.ckpt"))


def test_a_misspelt_task_option_names_the_closest_accepted_one(tmp_path, capsys, monkeypatch):
    args = ["fit", "-c", str(CONFIGS / "quickstart.yaml"), "--model.init_args.num_modles=3"]
    monkeypatch.setattr("sys.argv", ["lmc", *args])
    with pytest.raises(SystemExit):
        run_cli(*args)
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert re.match(
        r"lmc( fit)?: error: lmc.tasks.TrainAndInterpolateTask: option 'num_modles'", first
    )
    assert "did you mean 'num_models'?" in first


@pytest.mark.parametrize(
    ("option", "owner", "closest"),
    [
        ("--data.init_args.batchsize=64", "lmc.data.MNISTDataModule", "batch_size"),
        ("--model.init_args.net.init_args.widht=64", "lmc.models.MLP", "width"),
        ("--model.init_args.num_clases=10", "lmc.tasks.ClassificationTask", "num_classes"),
        ("in a config file", "lmc.data.MNISTDataModule", "batch_size"),
    ],
)
def test_an_unknown_option_is_pinned_on_the_class_that_rejected_it(
    option, owner, closest, tmp_path, capsys, monkeypatch
):
    """Not on the task whatever the option (issue 31): the data module, the network or the task,
    from the command line or a config file, with the closest accepted name."""
    if option == "in a config file":
        overlay = tmp_path / "typo.yaml"
        overlay.write_text("data:\n  init_args:\n    batchsize: 64\n")
        extra = ["-c", str(overlay)]
    else:
        extra = [option]
    args = ["fit", "-c", str(CONFIGS / "mnist" / "mlp.yaml"), *extra]
    monkeypatch.setattr("sys.argv", ["lmc", *args])
    with pytest.raises(SystemExit):
        run_cli(*args)
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert first.startswith(f"lmc fit: error: {owner}: option '"), first
    assert f"did you mean '{closest}'?" in first


def test_console_errors_are_one_line_without_a_traceback(tmp_path, capsys, monkeypatch):
    from lmc.cli import main

    monkeypatch.delenv("LMC_DEBUG", raising=False)
    monkeypatch.setattr(
        "sys.argv",
        [
            "lmc",
            "fit",
            "-c",
            str(CONFIGS / "quickstart.yaml"),
            "--model.init_args.matcher=wieght",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    with pytest.raises(SystemExit) as exit_:
        main()  # as the console script: no args
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "lmc: error: model.init_args.matcher: unknown matcher 'wieght'; choose one of" in err
    assert "Traceback" not in err and "Given value" not in err


def test_a_checkpoint_written_before_options_moved_names_the_new_keys(tmp_path):
    old = tmp_path / "old_curve.ckpt"
    hparams = {"_class_path": "lmc.tasks.CurveTask", "num_ts": 61, "bn_mode": "recompute"}
    torch.save({"state_dict": {}, "hyper_parameters": hparams}, old)
    with pytest.raises(ValueError, match=r"written before some options.*num_ts moved to "):
        run_cli(
            "validate",
            "-c",
            str(CONFIGS / "curves" / "mnist_mlp.yaml"),
            f"--ckpt_path={old}",
            f"--trainer.default_root_dir={tmp_path}",
        )


def test_product_tips_are_silenced_and_run_information_is_kept(caplog, monkeypatch):
    import logging

    from lightning.pytorch.utilities import rank_zero_info

    from lmc.engine.errors import quiet_third_party

    monkeypatch.delenv("WANDB_SILENT", raising=False)
    quiet_third_party()
    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging, try installing something")
        rank_zero_info("GPU available: False, used: False")
    messages = [r.getMessage() for r in caplog.records]
    assert "GPU available: False, used: False" in messages
    assert not any("Tip" in m for m in messages)
    assert os.environ["WANDB_SILENT"] == "true"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-c", "{bad}"],
            r"lmc fit: error: the config file .*bad\.yaml is not valid YAML \(line 3, column 1\)",
        ),
        (
            ["--trainer.default_root_dir={afile}"],
            r"default_root_dir .*afile is a file: give a folder",
        ),
        (["--model.init_args.net.init_args.width=0"], r"TwoLayerReLU needs width >= 1"),
        (
            ["--trainer.max_epochs=2", "--spawn_points=[0, 1, 5]"],
            r"--spawn_points \[5\]: past the end of training \(trainer.max_epochs=2\)",
        ),
    ],
    ids=["yaml-names-its-file", "root-is-a-file", "width-0", "spawn-point-past-the-end"],
)
def test_run_mistakes_found_by_the_bad_input_check_are_one_line(
    tmp_path, capsys, monkeypatch, args, message
):
    """Issue 46's new bad-input check: each refused before any training, in one line."""
    from lmc.cli import main

    (tmp_path / "bad.yaml").write_text("trainer:\n  max_epochs: [1\n")
    (tmp_path / "afile").write_text("")
    args = [a.format(bad=tmp_path / "bad.yaml", afile=tmp_path / "afile") for a in args]
    monkeypatch.delenv("LMC_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["lmc", "fit", "-c", str(CONFIGS / "quickstart.yaml"), *args]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code in (1, 2) and "Traceback" not in err
    assert re.search(message, err), err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_spawn_from_the_last_epoch_is_refused(tmp_path):
    """Issue 46's new bad-input check: the child of a point at max_epochs trained nothing and
    left a run folder without checkpoints, exit 0."""
    parent = _fit_quick(tmp_path / "parent", "--trainer.max_epochs=1", "--spawn_points=[1]")
    point = parent / "checkpoints" / "spawn" / "epoch=1.ckpt"
    with pytest.raises(ValueError, match=r"trained 1 epoch\(s\) and trainer.max_epochs is 1"):
        _fit_quick(tmp_path / "child", "--trainer.max_epochs=1", f"--spawn_from={point}")


def test_a_dotted_key_into_method_options_sets_one_entry(tmp_path):
    """A study's grid sets a merge method's options one key at a time
    (``--model.init_args.method_options.otfusion.prune_rate=0.5``); jsonargparse replaced the
    whole mapping with that one entry, silently dropping the config's other options. They are
    merged on top of the config files and earlier arguments, in order."""
    from lmc.engine.moved import merge_mapping_args
    from lmc.engine.parse import resolve_config

    config = str(CONFIGS / "merge" / "mnist_mlp_otfusion.yaml")
    args = [
        "validate",
        "-c",
        config,
        "--model.init_args.method_options.otfusion.prune_strategy=iterative",
        "--model.init_args.method_options.otfusion.prune_rate",
        "0.5",
        "--model.init_args.method_options.naive={}",
    ]
    opts = resolve_config(args)["model"]["init_args"]["method_options"]
    assert opts["otfusion"]["prune_rate"] == 0.5
    assert opts["otfusion"]["prune_strategy"] == "iterative"
    assert opts["otfusion"]["finetune_lr"] == 0.001  # the config's, kept
    assert opts["naive"] == {}
    # a whole mapping given after the dotted keys replaces them, as jsonargparse would
    later = merge_mapping_args([*args[:4], "--model.init_args.method_options={zip: {}}"])
    assert later[-1] == "--model.init_args.method_options={zip: {}}"
    untouched = ["fit", "-c", config, "--trainer.max_epochs", "2"]
    assert merge_mapping_args(untouched) == untouched


def test_a_shipped_config_is_named_lmc_name_from_anywhere(tmp_path, monkeypatch, capsys):
    """Issue 50: the configs travel in the package (a wheel has no clone's configs/):
    `--config lmc:NAME` reads a shipped one, `lmc configs list` names them all, `lmc configs
    copy` writes one out (never over a file), and a name that is not shipped gets the list."""
    from lmc.cli import main
    from lmc.engine.parse import resolve_config
    from lmc.shipped import ROOT, copy_shipped, resolve_shipped, shipped_configs

    monkeypatch.chdir(tmp_path)  # outside the clone
    names = shipped_configs()
    assert "quickstart" in names and "studies/004_merge_n" in names
    assert CONFIGS.resolve() == ROOT  # a clone's configs/ is the package's
    assert resolve_shipped(["fit", "-c", "lmc:mnist/mlp"])[2] == str(ROOT / "mnist" / "mlp.yaml")
    resolved = resolve_config(["fit", "--config=lmc:quickstart"])
    assert resolved["model"]["class_path"] == "lmc.tasks.TrainAndInterpolateTask"
    with pytest.raises(SystemExit):
        main(["configs", "list"])
    assert "lmc:quickstart" in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit):
        main(["configs", "copy", "mnist/mlp"])
    assert (tmp_path / "mlp.yaml").read_text() == (ROOT / "mnist" / "mlp.yaml").read_text()
    with pytest.raises(FileExistsError, match="mlp.yaml exists"):
        copy_shipped("lmc:mnist/mlp")
    with pytest.raises(SystemExit):
        main(["fit", "--config", "lmc:quikstart"])
    err = capsys.readouterr().err
    assert "no shipped config lmc:quikstart; did you mean lmc:quickstart?" in err
    assert "mnist/mlp" in err  # the shipped configs listed
