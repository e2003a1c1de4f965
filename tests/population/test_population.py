"""``lmc fit --population``: member k equals the sequential run with seed s_k (initial weights,
data order, optimizer and LR schedule), members are ordinary runs for ``lmc validate``, and bad
inputs stop before training with a clear message."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lmc.data import write_fake_mnist
from lmc.data.base import EpochShuffle
from lmc.engine.app import build_cli
from lmc.io import load_checkpoint, model_state_dict, spawn_point
from lmc.population.fit import member_orders
from tests.helpers import (
    CONFIGS,
    read_wandb_records,
    read_wandb_summary,
    run_cli,
    run_dirs,
    wandb_run_dirs,
)

SEEDS = (3, 7)
QUIET = [
    "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.accelerator=cpu",
]
TEACHER = [
    str(CONFIGS / "synthetic" / "teacher_student.yaml"),
    "--model.init_args.net.init_args.width=8",
    "--data.init_args.n_train=40",  # batches of 16, 16, 8: the order and the last batch matter
    "--data.init_args.n_val=16",
    "--data.init_args.n_test=16",
    "--data.init_args.batch_size=16",
]
POLYNOMIAL = [
    str(CONFIGS / "synthetic" / "polynomial.yaml"),
    "--model.init_args.net.init_args.width=8",
    *TEACHER[2:],
]
STEP_LR = {
    "class_path": "torch.optim.lr_scheduler.StepLR",
    "init_args": {"step_size": 1, "gamma": 0.5},
}
SGD = {
    "class_path": "torch.optim.SGD",
    "init_args": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
}
ADAM = {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}}


def _overlay(folder: Path, optimizer: dict) -> str:
    path = folder / f"opt_{optimizer['class_path'].rsplit('.', 1)[-1]}.yaml"
    model = {"init_args": {"optimizer": optimizer, "lr_scheduler": STEP_LR}}
    path.write_text(yaml.safe_dump({"model": model}))
    return str(path)


def _mnist(folder: Path) -> list[str]:
    data = folder / "data"
    if not (data / "MNIST").is_dir():
        write_fake_mnist(data, "MNIST", n_train=96, n_test=32)
    return [
        str(CONFIGS / "mnist" / "mlp.yaml"),
        "--model.init_args.net.init_args.width=16",
        "--model.init_args.net.init_args.depth=1",
        f"--data.init_args.data_dir={data}",
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=16",
        "--data.init_args.batch_size=32",  # 80 training images: batches of 32, 32, 16
        "--test_after_fit=false",
    ]


def _args(config: list[str], overlay: str | None, root: Path, *extra: str) -> list[str]:
    first, *rest = config
    cfg = ["-c", first, "-c", str(CONFIGS / "loggers" / "csv.yaml")]
    cfg += ["-c", overlay] if overlay else []
    return ["fit", *cfg, *rest, *QUIET, f"--trainer.default_root_dir={root}", *extra]


def _train(
    config: list[str], overlay: str | None, root: Path, accelerator: str = "cpu"
) -> tuple[Path, dict[int, Path]]:
    """A population of SEEDS and the sequential run of every seed, all on ``accelerator``;
    (population run, seq runs)."""
    on = f"--trainer.accelerator={accelerator}"
    seq = {}
    for seed in SEEDS:
        out = root / f"seq{seed}"
        run_cli(*_args(config, overlay, out, f"--seed_everything={seed}", "--spawn_points=[0]", on))
        [seq[seed]] = run_dirs(out)
    run_cli(*_args(config, overlay, root / "pop", f"--population=[{SEEDS[0]}, {SEEDS[1]}]", on))
    return (root / "pop" / "lmc" / "version_0"), seq


@pytest.fixture(scope="module")
def teacher_sgd(tmp_path_factory) -> tuple[Path, dict[int, Path]]:
    root = tmp_path_factory.mktemp("teacher_sgd")
    return _train(TEACHER, _overlay(root, SGD), root)


def _assert_close(ours: torch.Tensor, twin: torch.Tensor, gpu: bool) -> None:
    if not gpu:
        torch.testing.assert_close(ours, twin, atol=1e-5, rtol=1e-5)
        return
    # CUDA: the vmap'd (batched) and the per-model kernels may sum in another order, so allow
    # float32 noise on the tensor's scale (never stricter than on the CPU)
    scale = float(twin.abs().max()) if twin.numel() else 0.0
    torch.testing.assert_close(ours, twin, atol=1e-5 * max(1.0, scale), rtol=1e-4)


def _assert_members_equal_sequential(pop: Path, seq: dict[int, Path], gpu: bool = False) -> None:
    for seed in SEEDS:
        member = pop / "members" / f"seed={seed}"
        mine = load_checkpoint(member / "checkpoints" / "last.ckpt")  # weights_only=True
        # the twin's checkpoint files, by name; the member's (written in threads) all equal
        names = sorted(f.name for f in (member / "checkpoints").glob("*.ckpt"))
        assert names == sorted(f.name for f in (seq[seed] / "checkpoints").glob("*.ckpt"))
        assert len(names) == 2
        assert len({(member / "checkpoints" / n).read_bytes() for n in names}) == 1
        theirs = load_checkpoint(seq[seed] / "checkpoints" / "last.ckpt")
        assert mine["state_dict"].keys() == theirs["state_dict"].keys()
        for key, value in theirs["state_dict"].items():
            _assert_close(mine["state_dict"][key], value, gpu)
        assert mine["global_step"] == theirs["global_step"]
        assert mine["epoch"] == theirs["epoch"]
        assert mine["hyper_parameters"] == theirs["hyper_parameters"]
        ours, twin = mine["optimizer_states"][0], theirs["optimizer_states"][0]
        assert ours["param_groups"] == twin["param_groups"]  # LR after StepLR included
        for i, state in twin["state"].items():
            for name, value in state.items():
                _assert_close(ours["state"][i][name], value, gpu)
        assert mine["lr_schedulers"] == theirs["lr_schedulers"]
        # the member's saved config is the sequential run's (up to where it was written)
        a = yaml.safe_load((member / "config.yaml").read_text())
        b = yaml.safe_load((seq[seed] / "config.yaml").read_text())
        for cfg in (a, b):
            cfg["trainer"].pop("default_root_dir")
            cfg.pop("spawn_points"), cfg.pop("population", None)
        assert a == b


def test_teacher_student_sgd_momentum_weight_decay_members_equal_sequential_runs(
    accelerator, request, tmp_path
):
    if accelerator == "cpu":  # the module's run, which the tests below read too
        pop, seq = request.getfixturevalue("teacher_sgd")
    else:  # the population and its sequential twins all on the GPU
        pop, seq = _train(TEACHER, _overlay(tmp_path, SGD), tmp_path, accelerator)
    _assert_members_equal_sequential(pop, seq, gpu=accelerator != "cpu")


@pytest.mark.parametrize("case", ["teacher_adam", "mnist_mlp_adam", "polynomial_mlp_adam"])
def test_adam_step_lr_members_equal_sequential_runs(case, tmp_path):
    config = {"teacher_adam": TEACHER, "polynomial_mlp_adam": POLYNOMIAL}.get(case)
    config = config or _mnist(tmp_path)
    _assert_members_equal_sequential(*_train(config, _overlay(tmp_path, ADAM), tmp_path))


def test_member_orders_are_the_sequential_runs_epoch_shuffles():
    seeds = [0, 5, 2**32 + 5]  # seeds equal modulo 2**32 share an order, as data_order_seed does
    for epoch in (0, 3):
        orders = member_orders(11, seeds, epoch)
        for seed, row in zip(seeds, orders):
            sampler = EpochShuffle(11, seed % 2**32)
            sampler.set_epoch(epoch)
            assert row.tolist() == list(sampler)
    assert not torch.equal(member_orders(11, [0], 0), member_orders(11, [0], 1))


def test_members_start_from_the_sequential_initial_weights(teacher_sgd, tmp_path):
    _, seq = teacher_sgd
    overlay = _overlay(tmp_path, SGD)
    args = _args(TEACHER, overlay, tmp_path, f"--population=[{SEEDS[0]}, {SEEDS[1]}]")
    cli = build_cli(args[1:], run=False)  # parse and build the members, no training
    for seed, task in zip(SEEDS, cli.population.tasks):
        start = model_state_dict(load_checkpoint(spawn_point(seq[seed], 0)))
        for key, value in task.net.state_dict().items():
            assert torch.equal(value, start[key]), (seed, key)


def test_population_logs_every_member_and_the_mean(teacher_sgd):
    pop, _ = teacher_sgd
    rows = (pop / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for name in ("val/loss", "val/mse", "train/loss", "test/mse"):
        assert {name, f"member/0/{name}", f"member/1/{name}"} <= set(header)
    assert (pop / "config.yaml").is_file()
    assert yaml.safe_load((pop / "config.yaml").read_text())["population"] == list(SEEDS)


def _last_logged(csv: Path) -> dict[str, float]:
    lines = csv.read_text().splitlines()
    last: dict[str, float] = {}
    for line in lines[1:]:
        last |= {k: float(v) for k, v in zip(lines[0].split(","), line.split(",")) if v}
    return last


def test_every_member_has_its_own_metrics_csv_with_the_sequential_names(teacher_sgd):
    pop, _ = teacher_sgd
    population = _last_logged(pop / "metrics.csv")
    for k, seed in enumerate(SEEDS):
        mine = _last_logged(pop / "members" / f"seed={seed}" / "metrics.csv")
        assert not any(name.startswith("member/") for name in mine)
        for name in ("val/loss", "val/mse", "train/loss", "test/mse"):
            assert mine[name] == pytest.approx(population[f"member/{k}/{name}"])
        assert mine["epoch"] == 1


def test_every_member_logs_the_hyperparameters_its_sequential_run_logs(teacher_sgd):
    """A member's ``hparams.yaml`` (CSV) is its twin's: the CLI's config with its own seed, the
    task's hyper-parameters once, under ``model`` (up to the run's folder and spawn points)."""
    pop, seq = teacher_sgd
    for seed in SEEDS:
        mine = yaml.safe_load((pop / "members" / f"seed={seed}" / "hparams.yaml").read_text())
        twin = yaml.safe_load((seq[seed] / "hparams.yaml").read_text())
        for h in (mine, twin):
            (
                h["trainer"].pop("default_root_dir"),
                h["trainer"]["logger"]["init_args"].pop("save_dir"),
            )
            h.pop("spawn_points"), h.pop("population", None)
        assert mine == twin and mine["seed_everything"] == seed
        assert "net" in mine["model"]["init_args"] and "net" not in mine


def test_every_member_is_a_wandb_run_of_its_own_in_the_population_group(tmp_path):
    # the teacher config's own logger: W&B (offline, under tmp_path)
    run_cli(
        "fit",
        "-c",
        *TEACHER,
        *QUIET,
        f"--trainer.default_root_dir={tmp_path}",
        f"--population=[{SEEDS[0]}, {SEEDS[1]}]",
    )
    pop = next(p.parent for p in tmp_path.rglob("members"))
    [main] = [r for r in wandb_run_dirs(tmp_path) if "members" not in str(r)]
    summary = read_wandb_summary(main)
    for k, seed in enumerate(SEEDS):
        [run] = wandb_run_dirs(pop / "members" / f"seed={seed}")
        mine = read_wandb_summary(run)
        assert mine["config"]["seed_everything"] == seed
        assert mine["summary"]["val/mse"] == pytest.approx(
            summary["summary"][f"member/{k}/val/mse"]
        )
        assert mine["summary"]["test/mse"] == pytest.approx(
            summary["summary"][f"member/{k}/test/mse"]
        )
        assert mine["name"] == f"population-seed={seed}" and mine["state"] == "finished"
        assert "population-member" in mine["tags"]
        [group] = {r["run"]["run_group"] for r in read_wandb_records(run) if r.get("type") == "run"}
        assert group == f"population-{pop.name}"  # the population run's id


MEASURE = {
    "trainer": {
        "callbacks": [
            {"class_path": "callbacks.NeuronEntropyMonitor", "init_args": {"bits": 8}},
            {"class_path": "callbacks.PQIndexMonitor", "init_args": {"every_n_epochs": 2}},
        ]
    }
}


def _logged(csv: Path, prefix: str) -> dict[str, list[tuple[int, float]]]:
    """Every (step, value) a metrics.csv holds for each metric named ``prefix...``."""
    lines = csv.read_text().splitlines()
    out: dict[str, list[tuple[int, float]]] = {}
    for line in lines[1:]:
        row = dict(zip(lines[0].split(","), line.split(",")))
        for k, v in row.items():
            if k.startswith(prefix) and v:
                out.setdefault(k, []).append((int(row["step"]), float(v)))
    return out


def test_member_measurement_callbacks_log_what_the_sequential_runs_log(tmp_path):
    """Entropy and PQ index per member: the same values at the same steps (fit start, then
    every epoch / every second epoch) as in its sequential run."""
    overlay = tmp_path / "measure.yaml"
    overlay.write_text(yaml.safe_dump(MEASURE))
    pop, seq = _train(TEACHER, str(overlay), tmp_path)  # 2 epochs of 3 steps
    for seed in SEEDS:
        mine = pop / "members" / f"seed={seed}" / "metrics.csv"
        for prefix in ("entropy/", "pq/"):
            a, b = _logged(mine, prefix), _logged(seq[seed] / "metrics.csv", prefix)
            assert a.keys() == b.keys() and len(a) >= 2
            for name, rows in b.items():
                assert [s for s, _ in a[name]] == [s for s, _ in rows]
                assert [v for _, v in a[name]] == pytest.approx([v for _, v in rows], rel=1e-4)
    assert [s for s, _ in _logged(mine, "entropy/")["entropy/hidden"]] == [0, 3, 6]
    assert [s for s, _ in _logged(mine, "pq/")["pq/flat/hidden"]] == [0, 6]


PRUNING = {
    "finetune_once": {"strategy": "finetune_once", "rate": 0.5, "prune_epoch": 1},
    "lottery_ticket": {"strategy": "lottery_ticket", "rate": 0.5, "prune_epoch": 1},
    "iterative": {
        "strategy": "iterative",
        "rate": 0.6,
        "rounds": 2,
        "reset_optimizer": True,
        "finetune_lr": 0.02,
    },
    "only_prune": {"strategy": "only_prune", "rate": 0.3},
}


@pytest.mark.parametrize("strategy", list(PRUNING))
def test_pruned_members_equal_sequential_runs(strategy, accelerator, tmp_path):
    """callbacks.MagnitudePruning in a population: each member prunes at its twin's epochs,
    to its twin's masks (from its own weights), rewinds and resets as the twin does, and ends
    with its twin's weights, optimizer state, masks and logged sparsities."""
    model = {"init_args": {"optimizer": SGD, "lr_scheduler": STEP_LR}}
    pruning = {"class_path": "callbacks.MagnitudePruning", "init_args": PRUNING[strategy]}
    overlay = tmp_path / "prune.yaml"
    overlay.write_text(yaml.safe_dump({"model": model, "trainer": {"callbacks": [pruning]}}))
    pop, seq = _train(_mnist(tmp_path), str(overlay), tmp_path, accelerator)
    _assert_members_equal_sequential(pop, seq, gpu=accelerator != "cpu")
    for seed in SEEDS:
        member = pop / "members" / f"seed={seed}"
        mine = load_checkpoint(member / "checkpoints" / "last.ckpt")["callbacks"]
        theirs = load_checkpoint(seq[seed] / "checkpoints" / "last.ckpt")["callbacks"]
        ours, twin = mine["MagnitudePruning"], theirs["MagnitudePruning"]
        assert ours["rate"] == twin["rate"] == PRUNING[strategy]["rate"]
        assert ours["masks"].keys() == twin["masks"].keys() == {"layers.0", "head"}
        for layer, mask in twin["masks"].items():
            assert torch.equal(ours["masks"][layer], mask)
        assert (ours["init"] is None) == (twin["init"] is None)
        a = _logged(member / "metrics.csv", "prune/")
        b = _logged(seq[seed] / "metrics.csv", "prune/")
        assert a.keys() == b.keys() and "prune/sparsity/head" in a
        for name, rows in b.items():
            assert [step for step, _ in a[name]] == [step for step, _ in rows]
            assert [v for _, v in a[name]] == pytest.approx([v for _, v in rows])


def test_validate_barrier_of_two_members(teacher_sgd, tmp_path):
    pop, _ = teacher_sgd
    members = [pop / "members" / f"seed={s}" for s in SEEDS]
    run_cli(
        "validate",
        "-c",
        str(CONFIGS / "studies" / "teacher_student_barrier.yaml"),
        *TEACHER[1:],
        f"--model.init_args.checkpoints=[{', '.join(map(str, members))}]",
        "--model.init_args.evaluation.num_alphas=3",
        f"--trainer.default_root_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())["summary"]
    assert summary["barrier_loss_naive"] >= 0
    # known answer: the barrier's endpoints are the members, whose test MSE the population logged
    last = {}
    for line in (pop / "metrics.csv").read_text().splitlines()[1:]:
        row = dict(
            zip((pop / "metrics.csv").read_text().splitlines()[0].split(","), line.split(","))
        )
        last |= {k: float(v) for k, v in row.items() if v}
    mean = (last["member/0/test/mse"] + last["member/1/test/mse"]) / 2
    assert summary["endpoint_loss_mean"] == pytest.approx(mean, rel=1e-4)


# --- bad input: a clear error before any training -------------------------------------------
def _refused(tmp_path: Path, *extra: str, config: list[str] = TEACHER) -> None:
    run_cli(*_args(config, None, tmp_path, *extra))
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize(
    ("seeds", "match"), [("[]", "empty"), ("[1, 2, 1]", r"seed\(s\) \[1\] given more than once")]
)
def test_empty_or_duplicate_seeds_are_refused(seeds, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        _refused(tmp_path, f"--population={seeds}")


def test_batchnorm_members_equal_sequential_runs(accelerator, tmp_path):
    """BatchNorm's running statistics train per member (each its own slice, its own batches)
    and land in the member's checkpoint as its twin's."""
    config = [*_mnist(tmp_path), "--model.init_args.net.init_args.norm=batch"]
    pop, seq = _train(config, _overlay(tmp_path, SGD), tmp_path, accelerator)
    _assert_members_equal_sequential(pop, seq, gpu=accelerator != "cpu")
    state = load_checkpoint(pop / "members" / f"seed={SEEDS[0]}" / "checkpoints" / "last.ckpt")
    assert int(state["state_dict"]["net.norms.0.num_batches_tracked"]) == 6  # 2 epochs x 3


def test_a_network_that_cannot_be_vectorised_is_refused_naming_the_layer(tmp_path):
    with pytest.raises(ValueError, match=r"DataDependentNet cannot be vectorised.*layer 'gate'"):
        _refused(
            tmp_path,
            "--population=[0, 1]",
            "--model.init_args.net=tests.population.nets.DataDependentNet",
        )


def test_a_population_too_large_for_memory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("lmc.population.fit.available_memory", lambda device: 1000)
    with pytest.raises(MemoryError, match=r"population of 2 members needs at least .* GiB free"):
        _refused(tmp_path, "--population=[0, 1]")


def test_a_huge_population_is_refused_before_any_member_is_built(tmp_path, monkeypatch):
    """Issue 31: width 16384 x 32 seeds ran into the OOM killer after 46 s. Its parameters
    alone (counted on the meta device, no memory) exceed the machine: refused before the first
    member is instantiated, naming how many fit."""
    import lmc.population.fit as fit

    built = []
    real = fit.PopulationFit._instantiate

    def spy(self, seed):
        built.append(torch.get_default_device().type)
        return real(self, seed)

    monkeypatch.setattr(fit.PopulationFit, "_instantiate", spy)
    monkeypatch.setattr(fit, "available_memory", lambda device: 24 * 2**30)
    seeds = "[" + ", ".join(map(str, range(32))) + "]"
    with pytest.raises(
        MemoryError,
        # a bound from above: no count the full estimate would refuse again (issue 46: "at
        # most 1260" here, then "at most 560" from the estimate with activations)
        match=r"32 members needs at least 3\d\d\.\d\d GiB .* fewer than 3 member\(s\) fit "
        r"\(activations, counted once the first member is built, lower that further\)",
    ):
        _refused(
            tmp_path,
            f"--population={seeds}",
            "--model.init_args.net.init_args.width=16384",
            config=[str(CONFIGS / "mnist" / "mlp.yaml")],  # MNIST is never read: refused first
        )
    assert built == ["meta"]  # only the probe, on the meta device


def test_activations_are_estimated_on_the_first_member_before_the_others(tmp_path, monkeypatch):
    """Parameters that fit, activations that do not: refused once the first member (and the
    data) exist, before the second is built."""
    import lmc.population.fit as fit

    built = []
    real = fit.PopulationFit._instantiate

    def spy(self, seed):
        built.append((seed, torch.get_default_device().type))
        return real(self, seed)

    monkeypatch.setattr(fit.PopulationFit, "_instantiate", spy)
    monkeypatch.setattr(fit, "estimate_bytes", lambda *a: 10**9)
    monkeypatch.setattr(fit, "available_memory", lambda device: 2 * 10**9)
    with pytest.raises(MemoryError, match=r"3 members needs about 2.79 GiB .* at most 2"):
        _refused(tmp_path, "--population=[0, 1, 2]")
    assert built == [(0, "meta"), (0, "cpu")]


def test_gradient_clipping_and_augmentation_are_refused(tmp_path):
    with pytest.raises(ValueError, match="gradient_clip_val=1.0 .*couple the members"):
        _refused(tmp_path, "--population=[0, 1]", "--trainer.gradient_clip_val=1.0")
    mnist = _mnist(tmp_path)
    with pytest.raises(ValueError, match="augments its training images"):
        _refused(
            tmp_path / "aug",
            "--population=[0, 1]",
            "--data.init_args.augment=true",
            "--data.init_args.rotate=10",
            config=mnist,
        )


def test_a_callback_that_is_no_measurement_is_refused_naming_it(tmp_path):
    overlay = tmp_path / "stop.yaml"
    stop = {
        "class_path": "lightning.pytorch.callbacks.EarlyStopping",
        "init_args": {"monitor": "val/loss"},
    }
    overlay.write_text(yaml.safe_dump({"trainer": {"callbacks": [stop]}}))
    with pytest.raises(
        ValueError, match="EarlyStopping .*NeuronEntropyMonitor.*and callbacks.MagnitudePruning"
    ):
        run_cli(*_args(TEACHER, str(overlay), tmp_path, "--population=[0, 1]"))
    assert not list(tmp_path.rglob("*.ckpt"))


def test_two_pruning_callbacks_are_refused(tmp_path):
    overlay = tmp_path / "prune.yaml"
    prune = {"class_path": "callbacks.MagnitudePruning", "init_args": {"rate": 0.5}}
    overlay.write_text(yaml.safe_dump({"trainer": {"callbacks": [prune, prune]}}))
    with pytest.raises(ValueError, match="2 MagnitudePruning callbacks; a run prunes with one"):
        run_cli(*_args(TEACHER, str(overlay), tmp_path, "--population=[0, 1]"))
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_task_with_its_own_training_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="AdversarialClassificationTask overrides training_step"):
        _refused(
            tmp_path,
            "--population=[0, 1]",
            "--model.class_path=lmc.tasks.AdversarialClassificationTask",
            config=_mnist(tmp_path),
        )


def test_the_speed_recipes_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"speed recipes model.init_args.channels_last/compile"):
        _refused(
            tmp_path,
            "--population=[0, 1]",
            "--model.init_args.channels_last=true",
            "--model.init_args.compile=true",
        )


def test_population_is_for_fit_only(tmp_path):
    with pytest.raises(ValueError, match="for `lmc fit`, not validate"):
        run_cli(
            "validate",
            "-c",
            TEACHER[0],
            *TEACHER[1:],
            "--population=[0, 1]",
            f"--trainer.default_root_dir={tmp_path}",
        )


@pytest.mark.parametrize("differs", [None, "alone", "direct"])
def test_members_are_built_from_the_model_config_only_when_that_is_exact(
    tmp_path, monkeypatch, differs
):
    """The other members' tasks are built by calling their classes directly (no parser) when
    that gives the second member exactly the CLI's build (weights, hyper-parameters, generator
    state after it), else from the model's config alone when that gives member 0 exactly its
    task from the whole config, else from the whole config (simulated: the generator moves
    between seeding and the model, as a class instantiated before the model that draws at init
    would make it; or moves in the direct build only). Either way each member has the weights
    and hyper-parameters the CLI's whole build gives its seed."""
    import lmc.population.build as build
    import lmc.population.fit as fit

    if differs == "direct":
        real = build.seed_everything

        def seed_then_draw_direct(seed, workers=False):
            out = real(seed, workers=workers)
            torch.rand(1)
            return out

        monkeypatch.setattr(build, "seed_everything", seed_then_draw_direct)
    if differs == "alone":
        real_seed = fit.seed_everything

        def seed_then_draw(seed, workers=False):
            out = real_seed(seed, workers=workers)
            if sys._getframe(1).f_code.co_name == "_task":
                torch.rand(1)
            return out

        monkeypatch.setattr(fit, "seed_everything", seed_then_draw)
    seen = {}
    real_setup = fit.PopulationFit._setup

    def spy(self, x, y):
        seen["from"] = self.built_from
        for seed, task in zip(self.seeds, self.tasks):  # against the whole config's build
            whole = self._instantiate(seed).model
            for key, value in task.net.state_dict().items():
                torch.testing.assert_close(value, whole.net.state_dict()[key], rtol=0, atol=0)
            assert dict(task.hparams) == dict(whole.hparams)
            assert dict(task.hparams_initial) == dict(whole.hparams_initial)
            seen.setdefault("checked", []).append(seed)
        return real_setup(self, x, y)

    monkeypatch.setattr(fit.PopulationFit, "_setup", spy)
    run_cli(*_args(TEACHER, None, tmp_path, "--population=[3, 4, 5]"))
    assert seen["from"] == {None: "direct", "alone": "config", "direct": "model"}[differs]
    assert seen["checked"] == [3, 4, 5]


def test_a_direct_build_is_planned_only_for_what_it_can_replay():
    """Networks with plain arguments are rebuilt, the parser's callables shared, plain values
    passed; anything else (a nested object that is no network, extra keys) gets no plan."""
    from jsonargparse import Namespace

    from lmc.population.build import DirectBuild
    from lmc.tasks import RegressionTask

    net = Namespace(
        class_path="torch.nn.Linear", init_args=Namespace(in_features=3, out_features=2)
    )
    cfg = Namespace(
        class_path="lmc.tasks.RegressionTask", init_args=Namespace(net=net, half_mse=True)
    )
    first = RegressionTask(torch.nn.Linear(3, 2), half_mse=True)
    first.hparams["_instantiator"] = "lightning.pytorch.cli.instantiate_module"
    plan = DirectBuild.plan(cfg, first)
    assert plan is not None and [(n, k) for n, k, _ in plan.steps] == [
        ("net", "build"),
        ("half_mse", "value"),
    ]
    built = plan(7)
    torch.manual_seed(7)
    assert torch.equal(built.net.weight, torch.nn.Linear(3, 2).weight) and built.half_mse
    odd = Namespace(class_path="collections.OrderedDict", init_args=Namespace())
    flag = Namespace(class_path="builtins.bool", init_args=Namespace())
    for bad in (
        Namespace(class_path="lmc.tasks.RegressionTask", init_args=Namespace(net=odd)),
        Namespace(class_path="lmc.tasks.RegressionTask", init_args=Namespace(half_mse=flag)),
        Namespace(class_path="lmc.tasks.ClassificationTask", init_args=Namespace(net=net)),
        Namespace(
            class_path="lmc.tasks.RegressionTask", init_args=Namespace(net=net), dict_kwargs={}
        ),
    ):
        assert DirectBuild.plan(bad, first) is None
