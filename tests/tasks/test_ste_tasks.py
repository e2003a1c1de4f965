"""`lmc fit` merges that train (STE-MM, STE, Sinkhorn) and `lmc validate` merges on tiny fake data
and tiny checkpoints."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from lmc.data import write_fake_cifar10, write_fake_mnist
from lmc.io import load_checkpoint, model_state_dict
from lmc.models import MLP, VGG, ResNet
from lmc.permutation import apply_permutation, random_permutation, spec_for
from tests.helpers import (
    CONFIGS,
    checkpoints,
    load_yaml,
    read_wandb_summary,
    run_cli,
    run_dirs,
    wandb_run_dirs,
)

# the merge-sweep configs (the fusion methods' configs run in tests/merging/test_otfusion.py;
# the disjoint-task merges in the zipit studies' tests, tests/studies/test_reproductions.py)
OWN_TESTS = {"otfusion", "fedma"}
MERGE = sorted(
    p
    for p in (CONFIGS / "merge").glob("*.yaml")
    if not OWN_TESTS & set(yaml.safe_load(p.read_text())["model"]["init_args"]["methods"])
    and not p.name.endswith("_disjoint.yaml")
)
WIDTH = 16
CSV = str(CONFIGS / "loggers" / "csv.yaml")


def _save_net(state: dict, path: Path) -> Path:
    torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Fake MNIST/Fashion-MNIST/CIFAR-10, three tiny MNIST MLPs trained by `lmc fit`, and
    random-init VGG/ResNet checkpoints for the CIFAR recipes (same code path, CPU-sized)."""
    root = tmp_path_factory.mktemp("merge")
    data = root / "data"
    write_fake_mnist(data, "MNIST", n_train=160, n_test=64)
    write_fake_mnist(data, "FashionMNIST", n_train=160, n_test=64)
    write_fake_cifar10(data, n_train=48, n_test=16, archive=True)
    mlps = []
    for seed in range(3):
        out = root / f"fit{seed}"
        run_cli(
            "fit",
            "-c",
            str(CONFIGS / "mnist" / "mlp.yaml"),
            "-c",
            CSV,
            f"--model.init_args.net.init_args.width={WIDTH}",
            f"--seed_everything={seed}",
            "--trainer.max_epochs=1",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={out}",
            f"--data.init_args.data_dir={data}",
            "--data.init_args.val_size=32",
            "--data.init_args.alignment_size=64",
            "--data.init_args.batch_size=32",
        )
        [run] = run_dirs(out)
        mlps += checkpoints(run)
    cifar = {}
    for name, make in (
        ("vgg", lambda s: VGG(11, width=0.125, norm="batch", init="he_normal")),
        ("resnet", lambda s: ResNet(20, width=0.125, norm="batch", init="he_normal")),
    ):
        cifar[name] = []
        for s in range(3):
            torch.manual_seed(s)
            cifar[name].append(_save_net(make(s).state_dict(), root / f"{name}{s}.ckpt"))
    return {"root": root, "data": data, "mlps": mlps, "cifar": cifar}


def _ckpt_arg(paths) -> str:
    return f"--model.init_args.checkpoints=[{', '.join(map(str, paths))}]"


def _two(cfg: dict) -> bool:
    """Whether a merge config's trained method merges two models (STE, Sinkhorn here)."""
    return bool({"ste", "sinkhorn"} & set(cfg["model"]["init_args"].get("methods") or []))


def _overlay(config: Path, world: dict, out: Path) -> list[str]:
    cfg = load_yaml(config)
    net = cfg["model"]["init_args"]["net"]["class_path"]
    two = _two(cfg)
    if net.endswith("MLP"):
        paths = world["mlps"][:2] if two else world["mlps"]
        width = [f"--model.init_args.net.init_args.width={WIDTH}"]
    else:
        paths = world["cifar"]["vgg" if net.endswith("VGG") else "resnet"]
        width = ["--model.init_args.net.init_args.width=0.125"]
    args = [
        _ckpt_arg(paths),
        *width,
        f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=1",
        f"--data.init_args.data_dir={world['data']}",
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=16",
        "--data.init_args.batch_size=8",
        "--data.init_args.eval_batch_size=16",
    ]
    if net.endswith("MLP"):
        args.append("--model.init_args.evaluation.sharpness_probes=2")
        if not two:
            args.append("--model.init_args.num_models=[2, 3]")
    else:  # BatchNorm nets: the same code paths, fewer evaluations on 2 CPU cores
        args += [
            "--model.init_args.evaluation.sharpness_probes=0",
            "--model.init_args.evaluation.pairwise=false",
            "--model.init_args.num_models=[3]",
            "--model.init_args.methods=[stemm, wm_ref]",  # MergeMany: covered on the MLPs
        ]
    if cfg["model"]["class_path"] != "lmc.tasks.MergeTask":
        args += ["--trainer.max_steps=1", "--trainer.num_sanity_val_steps=0"]
    return args


@pytest.mark.parametrize("config", MERGE, ids=lambda p: p.name)
def test_every_merge_config_runs(config, world, tmp_path):
    """Every shipped merge config runs (one step for the fit tasks) and reports; the MNIST
    STE-MM recipe keeps its W&B logger (offline) and is read back from the W&B run."""
    task = load_yaml(config)["model"]["class_path"]
    command = "validate" if task == "lmc.tasks.MergeTask" else "fit"
    wandb = config.name == "mnist_mlp_stemm.yaml"
    logger = ["--trainer.logger.init_args.offline=true"] if wandb else ["-c", CSV]
    run_cli(command, "-c", str(config), *logger, *_overlay(config, world, tmp_path))
    [run] = run_dirs(tmp_path)
    payload = json.loads((run / "summary.json").read_text())
    methods = {(e["method"], e["n"]) for e in payload["evaluations"]}
    mlp = load_yaml(config)["model"]["init_args"]["net"]["class_path"].endswith("MLP")
    two = _two(load_yaml(config))
    n = [2] if two else ([2, 3] if mlp else [3])
    expected = load_yaml(config)["model"]["init_args"]["methods"]  # as configured
    expected = expected if mlp else ["stemm", "wm_ref"]
    assert methods == {(m, k) for m in expected for k in n}
    assert (run / "merge.png").stat().st_size > 10_000
    assert (run / "permutations.pt").is_file()
    for ev in payload["evaluations"]:
        for key in ("test/acc", "test/loss_gap", "distance_ratio_mean"):
            assert isinstance(ev["metrics"][key], float), key
        assert not mlp or isinstance(ev["metrics"]["sharpness"], float)
        if mlp and load_yaml(config)["model"]["init_args"]["evaluation"]["pairwise"]:
            assert isinstance(ev["metrics"]["test/pairwise_loss_gap"], float)
    if wandb:
        summary = payload["summary"]
        [wrun] = wandb_run_dirs(tmp_path)
        logged = read_wandb_summary(wrun)["summary"]
        for key in ("test/acc", "test/pairwise_loss_gap", "angle_mean", "sharpness"):
            assert logged[f"merge/stemm/n3/{key}"] == pytest.approx(summary[f"stemm/n3/{key}"])
        assert "merge/table" in json.dumps(logged) or "merge/figure" in json.dumps(logged)


def test_ste_task_recovers_a_permuted_copy(world, tmp_path):
    """Known answer through the CLI: STE on model A and a permuted copy of A returns B = A."""
    config = CONFIGS / "merge" / "mnist_mlp_ste.yaml"
    net = MLP(784, 10, width=WIDTH, depth=3)
    spec = spec_for(net)
    a = model_state_dict(load_checkpoint(world["mlps"][0]))
    b = apply_permutation(a, spec, random_permutation(spec.sizes(a), 7))
    copy = _save_net(b, tmp_path / "copy.ckpt")
    args = [x for x in _overlay(config, world, tmp_path / "out") if "checkpoints" not in x]
    run_cli(
        "fit",
        "-c",
        str(config),
        "-c",
        CSV,
        *args,
        _ckpt_arg([world["mlps"][0], copy]),
        "--trainer.max_steps=3",
    )
    [run] = run_dirs(tmp_path / "out")
    perm = torch.load(run / "permutations.pt", weights_only=True)["ste"][2][1]
    matched = apply_permutation(b, spec, perm)
    for k in a:
        assert torch.equal(matched[k], a[k]), k
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["ste/n2/test/loss_gap"] == pytest.approx(0.0, abs=1e-6)
    assert summary["ste/n2/distance_mean"] == 0.0
    assert summary["naive/n2/distance_mean"] > 0


def _fit_stemm(world, out, *extra):
    config = CONFIGS / "merge" / "mnist_mlp_stemm.yaml"
    args = [a for a in _overlay(config, world, out) if "num_models" not in a]
    run_cli("fit", "-c", str(config), "-c", CSV, *args, *extra)


def test_bad_inputs_fail_before_work(world, tmp_path):
    wide = _save_net(MLP(784, 10, width=WIDTH + 4, depth=3).state_dict(), tmp_path / "wide.ckpt")
    with pytest.raises(ValueError, match="wide.ckpt"):
        _fit_stemm(world, tmp_path, _ckpt_arg([*world["mlps"][:2], wide]))
    with pytest.raises(ValueError, match="at least 2 checkpoints"):
        _fit_stemm(world, tmp_path, _ckpt_arg(world["mlps"][:1]))
    with pytest.raises(ValueError, match=r"num_models \[4\] must lie in \[2, 3\]"):
        _fit_stemm(world, tmp_path, "--model.init_args.num_models=[2, 4]")
    with pytest.raises(ValueError, match="reference=2"):
        _fit_stemm(
            world, tmp_path, "--model.init_args.num_models=[2, 3]", "--model.init_args.reference=2"
        )
    deeper = _save_net(MLP(784, 10, width=WIDTH, depth=4).state_dict(), tmp_path / "deep.ckpt")
    with pytest.raises(ValueError, match="deep.ckpt"):
        _fit_stemm(world, tmp_path, _ckpt_arg([deeper, deeper]))
    assert not list(tmp_path.rglob("summary.json"))


def _baselines_run(world: dict, out: Path, *args: str) -> Path:
    """``lmc validate`` of the MNIST merge config on the world's MLPs with ``args``; its run."""
    config = CONFIGS / "merge" / "mnist_mlp_baselines.yaml"
    run_cli("validate", "-c", str(config), "-c", CSV, *_overlay(config, world, out), *args)
    [run] = run_dirs(out)
    return run


def test_merge_task_runs_any_registered_method_by_name(world, tmp_path):
    """One merge task reads the registry by name: permuting methods (wm_ref, ZipIt!) and one
    that does not permute (OTFusion) in one sweep, each method's options from the config, its
    scalar diagnostics logged beside its metrics, and permutations saved for the methods that
    have them."""
    run = _baselines_run(
        world,
        tmp_path,
        "--model.init_args.methods=[wm_ref, otfusion, zip]",
        "--model.init_args.method_options={otfusion: {metric: activation}}",
        "--model.init_args.evaluation.pairwise=false",
    )
    payload = json.loads((run / "summary.json").read_text())
    by = {(e["method"], e["n"]): e["metrics"] for e in payload["evaluations"]}
    assert set(by) == {(m, n) for m in ("wm_ref", "otfusion", "zip") for n in (2, 3)}
    for n in (2, 3):
        assert "distance_ratio_mean" in by[("wm_ref", n)]
        assert "distance_ratio_mean" not in by[("otfusion", n)]  # no permutations: no geometry
        assert isinstance(by[("otfusion", n)]["test/acc"], float)
        assert payload["summary"][f"otfusion/n{n}/seconds"] > 0
        assert 0 <= payload["summary"][f"zip/n{n}/same_model/layers.0"] <= 1
    assert payload["diagnostics"]["otfusion"]["n3"]["widths"]  # non-scalar: kept as details
    table = torch.load(run / "permutations.pt", weights_only=True)
    assert set(table["wm_ref"]) == {2, 3} and not table["otfusion"]


@pytest.mark.parametrize("method", ["stemm", "ste", "sinkhorn"])
def test_a_trained_method_asked_of_validate_names_lmc_fit(world, tmp_path, method):
    """lmc validate does not train: a method that trains is refused before any work, the
    error naming lmc fit, the task and a config to start from."""
    with pytest.raises(ValueError, match=f"'{method}' trains.*lmc fit.*TrainedMergeTask.*stemm"):
        _baselines_run(world, tmp_path, f"--model.init_args.methods=[wm_ref, {method}]")
    assert not list(tmp_path.rglob("summary.json"))


def test_a_trained_merge_names_exactly_one_method_that_trains(world, tmp_path):
    for methods in ("[wm_ref, mergemany]", "[stemm, sinkhorn]"):
        with pytest.raises(ValueError, match="exactly one merge method that trains"):
            _fit_stemm(world, tmp_path, f"--model.init_args.methods={methods}")
    with pytest.raises(ValueError, match="merge method 'stemm' takes mixing, keep_best"):
        _fit_stemm(world, tmp_path, "--model.init_args.method_options={stemm: {epochs: 2}}")
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize(
    ("config", "old", "new"),
    [
        ("mnist_mlp_baselines.yaml", "pairwise", "evaluation.pairwise"),
        ("mnist_mlp_stemm.yaml", "pairwise", "evaluation.pairwise"),
        ("mnist_mlp_otfusion.yaml", "splits", "evaluation.splits"),
    ],
)
def test_a_merge_tasks_old_flat_key_names_its_group(config, old, new):
    """A saved config of an earlier version (flat keys) gets the error naming the new key."""
    from lmc.engine.moved import moved_keys_error

    err = moved_keys_error(["-c", str(CONFIGS / "merge" / config), f"--model.init_args.{old}=1"])
    assert f"model.init_args.{old} moved to model.init_args.{new}" in err


@pytest.mark.parametrize(
    ("old", "method", "example"),
    [
        ("lmc.tasks.STEMMTask", "stemm", "mnist_mlp_stemm.yaml"),
        ("STETask", "ste", "mnist_mlp_ste.yaml"),
        ("lmc.tasks.SinkhornTask", "sinkhorn", "mnist_mlp_sinkhorn.yaml"),
        ("lmc.tasks.OTFusionTask", "otfusion", "mnist_mlp_otfusion.yaml"),
        ("FedMATask", "fedma", "mnist_mlp_fedma.yaml"),
    ],
)
def test_an_old_merge_task_names_the_front_door(old, method, example, world, tmp_path):
    """A config of a merge task that the front door replaced gets, before any work, the new
    task, where the method and its options go, and a shipped config in the new form."""
    config = CONFIGS / "merge" / example
    command = "fit" if method in ("stemm", "ste", "sinkhorn") else "validate"
    with pytest.raises(SystemExit):
        run_cli(command, "-c", str(config), "-c", CSV, f"--model.class_path={old}")
    from lmc.engine.moved import moved_keys_error

    err = moved_keys_error(["-c", str(config), f"--model.class_path={old}"])
    door = "TrainedMergeTask" if command == "fit" else "MergeTask"
    assert f"lmc.tasks.{door}" in err and f"[{method}" in err
    assert f"method_options.{method}" in err and example in err


def test_a_partial_zip_checkpoint_reloads_and_evaluates_as_reported(world, tmp_path):
    """MergeTask with zip_until: the merged model is saved as a MultiHead checkpoint that loads
    (weights_only) into MultiHead(net, 2) and scores on the test split what the run reported."""
    from lmc.evaluation import evaluate
    from lmc.models import MultiHead

    run = _baselines_run(
        world,
        tmp_path,
        "--model.init_args.methods=[zip]",
        "--model.init_args.method_options={zip: {zip_until: 2}}",
        "--model.init_args.num_models=[2]",
        "--model.init_args.evaluation.pairwise=false",
        "--model.init_args.evaluation.sharpness_probes=0",
        "--model.init_args.save_merged=true",
    )
    reported = json.loads((run / "summary.json").read_text())["summary"]["zip/n2/test/acc"]
    model = MultiHead(MLP(784, 10, width=WIDTH, depth=3), 2)
    model.load_state_dict(model_state_dict(load_checkpoint(run / "merged_zip_n2.ckpt")))
    from lmc.data import MNISTDataModule

    dm = MNISTDataModule(str(world["data"]), val_size=16, alignment_size=16, eval_batch_size=16)
    dm.setup("test")
    assert evaluate(model, dm.test_dataloader()).acc == pytest.approx(reported)
    # `lmc test` of a classification task whose net is the MultiHead evaluates the checkpoint
    out = tmp_path / "test"
    run_cli(
        "test",
        "-c",
        str(CONFIGS / "mnist" / "mlp.yaml"),
        "-c",
        CSV,
        "--model.init_args.net=lmc.models.MultiHead",
        "--model.init_args.net.init_args.net=lmc.models.MLP",
        f"--model.init_args.net.init_args.net.init_args.width={WIDTH}",
        "--model.init_args.net.init_args.heads=2",
        f"--ckpt_path={run / 'merged_zip_n2.ckpt'}",
        f"--data.init_args.data_dir={world['data']}",
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=16",
        "--data.init_args.eval_batch_size=16",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
    )
    [log] = out.rglob("metrics.csv")
    rows = list(csv.DictReader(log.open()))
    assert float(next(r["test/acc"] for r in rows if r.get("test/acc"))) == pytest.approx(reported)
