"""Planning and bad input: the grid expands into jobs with stable ids, and every bad study is
refused with a clear message before any job runs."""

from __future__ import annotations

import re

import pytest

from lmc.studies import StudyError, load_and_plan, run_study
from lmc.studies.spec.schema import EVALUATE_KINDS, Groups, Pairs
from tests.helpers import CONFIGS
from tests.studies.conftest import (
    TINY_DATA,
    WIDTH,
    merge_stage,
    tiny_study,
    width_claim,
    write_study,
)


def test_plan_expands_the_grid_with_stable_ids(tmp_path):
    study, jobs = load_and_plan(write_study(tmp_path, tiny_study()))
    train = [j for j in jobs if j.stage == "train"]
    barrier = [j for j in jobs if j.stage == "barrier"]
    assert [(j.coordinates[WIDTH], j.coordinates["seed_everything"]) for j in train] == [
        (4, 0),
        (4, 1),
        (8, 0),
        (8, 1),
    ]
    assert len({j.id for j in jobs}) == 6 and len(barrier) == 2
    for job in barrier:  # seed 0 with seed 1 at the same width, which the barrier net gets
        a, b = (next(t for t in train if t.id == i) for i in job.inputs)
        assert a.coordinates == {WIDTH: job.coordinates[WIDTH], "seed_everything": 0}
        assert b.coordinates == {WIDTH: job.coordinates[WIDTH], "seed_everything": 1}
        assert f"--{WIDTH}={job.coordinates[WIDTH]}" in job.args
    assert "--seed_everything=1" in train[1].args and f"--{WIDTH}=4" in train[1].args

    # same file elsewhere: same ids; one changed arg: every train id changes
    _, again = load_and_plan(write_study(tmp_path / "elsewhere", tiny_study()))
    assert [j.id for j in again] == [j.id for j in jobs]
    changed = tiny_study()
    changed["train"]["args"] = [*changed["train"]["args"], "--trainer.max_epochs=2"]
    _, other = load_and_plan(write_study(tmp_path / "changed", changed))
    assert not {j.id for j in other} & {j.id for j in jobs}


def test_zip_varies_keys_together(tmp_path):
    std = "model.init_args.net.init_args.init_std"
    study = tiny_study(
        grid={WIDTH: [4, 8], std: [0.1, 0.01], "seed_everything": [0, 1]}, zip=[[WIDTH, std]]
    )
    study["evaluate"][0]["pairs"]["over"] = [WIDTH, std]
    _, jobs = load_and_plan(write_study(tmp_path, study))
    train = [j.coordinates for j in jobs if j.stage == "train"]
    assert [(c[WIDTH], c[std]) for c in train] == [(4, 0.1), (4, 0.1), (8, 0.01), (8, 0.01)]


def test_reference_list_gives_independent_pairs(tmp_path):
    """``reference: [0, 2, 4]`` with a pair id zipped into ``over``: seeds 0-1, 2-3, 4-5 (002
    Table 1's three independent pairs); two references are never paired with each other."""
    trial = "data.init_args.seed"
    study = tiny_study(
        grid={WIDTH: [4], trial: [0, 0, 1, 1, 2, 2], "seed_everything": [0, 1, 2, 3, 4, 5]},
        zip=[[trial, "seed_everything"]],
    )
    study["evaluate"][0]["pairs"] = {
        "over": [WIDTH, trial],
        "vary": "seed_everything",
        "reference": [0, 2, 4],
    }
    _, jobs = load_and_plan(write_study(tmp_path, study))
    seeds = {j.id: j.coordinates["seed_everything"] for j in jobs if j.stage == "train"}
    pairs = [tuple(seeds[i] for i in j.inputs) for j in jobs if j.stage == "barrier"]
    assert pairs == [(0, 1), (2, 3), (4, 5)]


def test_consecutive_references_give_disjoint_pairs_of_one_population(tmp_path):
    """``reference: consecutive`` pairs seeds 0-1, 2-3, 4-5 (000 A.1.1's models i and i + 1)
    without a pair id, so the six seeds of a width still train as one population."""
    study = tiny_study(grid={WIDTH: [4], "seed_everything": [0, 1, 2, 3, 4, 5]}, population=True)
    study["evaluate"][0]["pairs"]["reference"] = "consecutive"
    _, jobs = load_and_plan(write_study(tmp_path, study))
    seed = {j.id: j.coordinates["seed_everything"] for j in jobs if j.stage == "train"}
    pairs = [tuple(seed[i] for i in j.inputs) for j in jobs if j.stage == "barrier"]
    assert pairs == [(0, 1), (2, 3), (4, 5)]
    assert len([j for j in jobs if j.stage == "train" and j.members]) == 1  # one population
    # pairs are disjoint by default: no reference gives the same pairs (issue 47)
    del study["evaluate"][0]["pairs"]["reference"]
    _, again = load_and_plan(write_study(tmp_path / "default", study))
    assert [j.inputs for j in again if j.stage == "barrier"] == [
        j.inputs for j in jobs if j.stage == "barrier"
    ]


def test_stage_grid_evaluates_each_selection_at_every_point(tmp_path):
    """An evaluate stage's own ``grid`` (keys of its config): every pair at every point, the
    point in the job's coordinates and args; zipped keys go together."""
    study = tiny_study()
    stage = study["evaluate"][0]
    stage["grid"] = {
        "model.init_args.evaluation.num_alphas": [3, 5],
        "model.init_args.seed": [0, 1],
    }
    stage["zip"] = [["model.init_args.evaluation.num_alphas", "model.init_args.seed"]]
    loaded, jobs = load_and_plan(write_study(tmp_path, study))
    barrier = [j for j in jobs if j.stage == "barrier"]
    assert len(barrier) == 4 and len({j.id for j in barrier}) == 4
    got = [
        (j.coordinates[WIDTH], j.coordinates["model.init_args.evaluation.num_alphas"], j.inputs)
        for j in barrier
    ]
    assert [g[:2] for g in got] == [(4, 3), (4, 5), (8, 3), (8, 5)]
    assert got[0][2] == got[1][2] != got[2][2]  # one pair, two points
    assert "--model.init_args.evaluation.num_alphas=5" in barrier[1].args
    assert "--model.init_args.seed=1" in barrier[1].args
    assert "model.init_args.evaluation.num_alphas" in loaded.stage_keys()["barrier"]


def _with_stage(**entries):
    study = tiny_study()
    study["evaluate"][0].update(entries)
    return study


def _bad(**changes):
    return tiny_study(**changes)


def _with_train(**entries):
    study = tiny_study()
    study["train"].update(entries)
    return study


def _bad_pairs(**pairs):
    study = tiny_study()
    study["evaluate"][0]["pairs"].update(pairs)
    return study


BAD = {
    "unknown study key": (_bad(trian={}), "unknown key 'trian' in the study file"),
    "unknown train key": (
        _with_train(grids={}),
        "unknown key 'grids' in train; valid keys: config, grid, zip, args",
    ),
    "grid key not in base": (
        _bad(
            grid={"model.init_args.net.init_args.widht": [4], "seed_everything": [0, 1]},
            evaluate=[],
        ),
        "'model.init_args.net.init_args.widht' is not in the base config",
    ),
    "grid value of a wrong type": (
        _bad(grid={WIDTH: ["wide"], "seed_everything": [0, 1]}),
        "the value 'wide' is refused",
    ),
    "empty grid list": (
        _bad(grid={WIDTH: [], "seed_everything": [0, 1]}),
        f"train.grid.{WIDTH} is an empty list",
    ),
    "zip of unequal lengths": (
        _bad(grid={WIDTH: [4, 8], "seed_everything": [0, 1, 2]}, zip=[[WIDTH, "seed_everything"]]),
        "zipped keys need lists of one length",
    ),
    "unknown matcher in an evaluate stage's args": (
        _with_stage(
            args=["--model.init_args.matcher=wieght", "--model.init_args.evaluation.num_alphas=3"]
        ),
        "evaluate stage 'barrier': model.init_args.matcher: unknown matcher 'wieght'; choose "
        "one of none, weight",
    ),
    "unknown matcher in an evaluate stage's grid": (
        _with_stage(grid={"model.init_args.matcher": ["weight", "wieght"]}),
        "evaluate stage 'barrier'.grid.model.init_args.matcher: the value 'wieght' is refused",
    ),
    "grid key typo with an evaluate stage": (
        _bad(grid={"model.init_args.net.init_args.widht": [4], "seed_everything": [0, 1]}),
        "train.grid key 'model.init_args.net.init_args.widht' looks misspelt: evaluate stage "
        "'barrier'.pairs names 'model.init_args.net.init_args.width'",
    ),
    "over names no grid key": (
        _bad_pairs(over=["model.init_args.net.init_args.depth"]),
        "not a train.grid key",
    ),
    "vary names no grid key": (_bad_pairs(vary="seed"), "names 'seed', not a train.grid key"),
    "reference no job has": (_bad_pairs(reference=7), "no training job has seed_everything=7"),
    "reference list value no job has": (
        _bad_pairs(reference=[0, 7]),
        "reference 7: no training job has seed_everything=7",
    ),
    "reference list repeats": (_bad_pairs(reference=[0, 0]), "lists a value twice"),
    "reference list empty": (_bad_pairs(reference=[]), "reference is an empty list"),
    "consecutive pairs of an odd number": (
        _bad(grid={WIDTH: [4], "seed_everything": [0, 1, 2]})
        | {
            "evaluate": [
                {
                    **tiny_study()["evaluate"][0],
                    "pairs": {
                        "over": [WIDTH],
                        "vary": "seed_everything",
                        "reference": "consecutive",
                    },
                }
            ]
        },
        "consecutive pairs seed_everything's values two by two",
    ),
    "evaluate network of another class": (
        _with_stage(
            args=[
                "--model.init_args.net=lmc.models.MLP",
                "--model.init_args.evaluation.num_alphas=3",
            ]
        ),
        "evaluate stage 'barrier' builds a lmc.models.MLP (model.init_args.net of its config) but "
        "the training jobs train a lmc.models.TwoLayerReLU",
    ),
    "num_models above the group's size": (
        tiny_study(evaluate=[merge_stage("--model.init_args.num_models=[2, 3]")]),
        "evaluate stage 'merge' {'model.init_args.net.init_args.width': 4, 'seed_everything': "
        "[0, 1]}: num_models [3] must lie in [2, 2] (the models its group selects)",
    ),
    "an option a merge method does not take": (
        tiny_study(
            evaluate=[
                merge_stage(
                    "--model.init_args.methods=[naive, mergemany]",
                    "--model.init_args.method_options={mergemany: {max_round: 2}}",
                )
            ]
        ),
        "evaluate stage 'merge': model.init_args.method_options.mergemany: unknown option(s) "
        "'max_round'; merge method 'mergemany' takes max_rounds",
    ),
    "zip_until past the network's groups": (  # issue 46: found after the training
        tiny_study(
            evaluate=[
                merge_stage(
                    "--model.init_args.methods=[naive, zip]",
                    "--model.init_args.method_options={zip: {zip_until: 5}}",
                )
            ]
        ),
        "model.init_args.method_options.zip.zip_until: zip_until=5 is past the network's 1 groups",
    ),
    "zip_until naming no group": (
        tiny_study(
            evaluate=[
                merge_stage(
                    "--model.init_args.methods=[naive, zip]",
                    "--model.init_args.method_options={zip: {zip_until: fc9}}",
                )
            ]
        ),
        "zip_until='fc9' names no group; groups in order: ",
    ),
    "a population with limit_train_batches": (  # issue 46: passed plan, failed every job
        _with_train(
            population=True,
            args=[*tiny_study()["train"]["args"], "--trainer.limit_train_batches=2"],
        ),
        "cannot run as planned:\n  stage 'train' job {\"model.init_args.net.init_args.width\": 4}: "
        "--population trains every member exactly",
    ),
    "the capture overlay on the CPU": (  # issue 46: passed plan, failed every job
        _with_train(
            config=[*tiny_study()["train"]["config"], str(CONFIGS / "speed" / "capture.yaml")],
            args=[*tiny_study()["train"]["args"], "--trainer.accelerator=cpu"],
        ),
        "capture_step needs a CUDA device (trainer.accelerator=cpu",
    ),
    "a merge reference past the smallest merge": (  # issue 46: failed after the training
        tiny_study(evaluate=[merge_stage("--model.init_args.reference=5")]),
        "reference=5 must index one of the first 2 models (the smallest merge",
    ),
    "an empty list of merge methods": (  # issue 46: ran three methods, the config said []
        tiny_study(evaluate=[merge_stage("--model.init_args.methods=[]")]),
        "model.init_args.methods is empty: name at least one merge method, or leave it out",
    ),
    "overlapping evaluation.tasks": (  # issue 46: accepted, each label scored twice
        tiny_study(evaluate=[merge_stage("--model.init_args.evaluation.tasks=[[0, 1], [1, 2]]")]),
        "evaluate stage 'merge': model.init_args.evaluation.tasks: labels [1] are in more "
        "than one task",
    ),
    "zip beta out of range": (
        tiny_study(
            evaluate=[
                merge_stage(
                    "--model.init_args.methods=[naive, zip]",
                    "--model.init_args.method_options={zip: {beta: 2}}",
                )
            ]
        ),
        "model.init_args.method_options.zip.beta must lie in [0, 1], got 2",
    ),
    "zip alpha of the wrong type": (
        tiny_study(
            evaluate=[
                merge_stage(
                    "--model.init_args.methods=[naive, zip]",
                    "--model.init_args.method_options={zip: {alpha: high}}",
                )
            ]
        ),
        "model.init_args.method_options.zip.alpha must be a number, got 'high'",
    ),
    "grid values that parse alone but not together": (
        _bad(
            grid={
                WIDTH: [4],
                "model.init_args.optimizer.class_path": ["torch.optim.SGD", "torch.optim.Adam"],
                "model.init_args.optimizer.init_args.momentum": [0.0, 0.9],
                "seed_everything": [0, 1],
            },
            evaluate=[],
        ),
        "2 planned job configuration(s) do not hold together (each grid value parsed on its own; "
        "give values that go together, or split the grid):\n  stage 'train' job "
        f'{{"{WIDTH}": 4, "model.init_args.optimizer.class_path": "torch.optim.Adam", '
        '"model.init_args.optimizer.init_args.momentum": 0.0}: `lmc fit',
    ),
    "unknown evaluate kind": (
        tiny_study(evaluate=[{**tiny_study()["evaluate"][0], "kind": "barier"}]),
        "unknown kind 'barier'; valid kinds: barrier, curve, merge",
    ),
    "merge stage given pairs": (
        tiny_study(evaluate=[{**tiny_study()["evaluate"][0], "kind": "merge"}]),
        "a merge stage selects its models with `groups`, not `pairs`",
    ),
    "group value no job has": (
        tiny_study(
            evaluate=[
                {
                    **{k: v for k, v in tiny_study()["evaluate"][0].items() if k != "pairs"},
                    "kind": "merge",
                    "groups": {"over": [WIDTH], "vary": "seed_everything", "values": [0, 3]},
                }
            ]
        ),
        "values: no training job has seed_everything=3",
    ),
    "pair of different architectures": (
        _bad_pairs(over=["seed_everything"], vary=WIDTH, reference=4),
        f"selects models that differ in {WIDTH!r}, a key of the network",
    ),
    "pair of architectures zipped with the seed": (  # issue 46: said "put it in over"
        tiny_study(zip=[[WIDTH, "seed_everything"]]),
        f"differ in {WIDTH!r}, a key of the network: their weights cannot be aligned or merged. "
        "It is zipped with 'seed_everything' (the zip of 'train'), so it varies with it even "
        "though it is in `over`",
    ),
    "unknown evaluate command": (
        tiny_study(evaluate=[{**tiny_study()["evaluate"][0], "command": "test"}]),
        "command 'test': valid commands: validate, fit",
    ),
    "stage grid key not in its config": (
        _with_stage(grid={"model.init_args.num_alpha": [3, 5]}),
        "evaluate stage 'barrier' grid key 'model.init_args.num_alpha' is not in its config",
    ),
    "stage grid key that moved": (  # issue 46: was reported as unknown
        _with_stage(grid={"model.init_args.num_alphas": [3, 5]}),
        "evaluate stage 'barrier' grid key 'model.init_args.num_alphas': lmc.tasks."
        "InterpolationTask: model.init_args.num_alphas moved to "
        "model.init_args.evaluation.num_alphas",
    ),
    "stage grid value refused": (
        _with_stage(grid={"model.init_args.evaluation.num_alphas": ["many"]}),
        "evaluate stage 'barrier'.grid.model.init_args.evaluation.num_alphas: the value 'many' is refused",
    ),
    "stage grid repeats a selection key": (
        _with_stage(grid={WIDTH: [4, 8]}),
        "already come from the selected models",
    ),
    "stage zip without a grid": (
        _with_stage(zip=[["a", "b"]]),
        "evaluate stage 'barrier': zip needs a grid",
    ),
    "unknown train command": (
        _with_train(command="test"),
        "train.command 'test': valid commands: fit, validate",
    ),
    "validate train jobs selected by a stage": (
        _with_train(command="validate"),
        "train.command: validate jobs leave no trained model",
    ),
    "validate train jobs as a population": (
        _with_train(command="validate", population=True),
        "train.population trains models: it needs train.command: fit",
    ),
    "unknown barrier definition": (
        tiny_study(barrier="max"),
        "barrier: unknown barrier definition 'max'; use one of: chord = ",
    ),
    "barrier definition without a barrier stage": (
        tiny_study(barrier="abs_chord", evaluate=[]),
        "no evaluate stage of kind barrier",
    ),
    "barrier definition set twice": (
        _with_stage(args=["--model.init_args.barrier=chord"]) | {"barrier": "abs_chord"},
        "sets --model.init_args.barrier, which the study's `barrier: abs_chord` sets",
    ),
    "claim on a stage the study lacks": (
        tiny_study(claims=[width_claim(stage="merge")]),
        "stage 'merge' is not a stage of the study; its stages: train, barrier",
    ),
    "claim on a value the study does not run": (
        tiny_study(claims=[width_claim(a={"where": {WIDTH: 16}})]),
        f"{WIDTH}=16 is not a value the study runs; its values: [4, 8]",
    ),
    "claim on a metric the stage does not produce": (
        tiny_study(claims=[width_claim(metric="barrier_los_matched")]),
        "reads 'barrier_los_matched', which stage 'barrier' does not produce (",
    ),
    "claim comparing a cell with itself": (  # issue 46: an inconclusive difference of 0
        tiny_study(claims=[width_claim(b={"where": {WIDTH: 8}})]),
        "a and b select the same values",
    ),
    "claim on a misspelt merge metric": (  # issue 46: was found after all 12 jobs ran
        tiny_study(
            evaluate=[merge_stage(*TINY_DATA)],
            claims=[width_claim(stage="merge", metric="mergemany/n2/test/los")],
        ),
        "reads 'mergemany/n2/test/los', which stage 'merge' does not produce (",
    ),
    "claim on a merge metric at an n the stage does not merge": (
        tiny_study(
            evaluate=[merge_stage(*TINY_DATA)],
            claims=[width_claim(stage="merge", metric="mergemany/n3/test/loss")],
        ),
        "the closest it produces: mergemany/n2/test/loss",
    ),
    "executor workers 0": (
        tiny_study(executor={"workers": 0}),
        "executor.workers must be a whole number >= 1, got 0",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_before_any_job(tmp_path, case):
    study, message = BAD[case]
    path = write_study(tmp_path, study)
    ran = []
    with pytest.raises(StudyError, match=None) as err:
        run_study(path, tmp_path / "out", runner=ran.append, log=lambda _: None)
    assert message in str(err.value)
    assert not ran and not (tmp_path / "out").exists()  # no empty --dir left (issue 46)


def test_the_study_barrier_definition_reaches_every_barrier_stage(tmp_path):
    study, jobs = load_and_plan(write_study(tmp_path, tiny_study(barrier="abs_chord")))
    assert study.barrier == "abs_chord"
    barrier = [j for j in jobs if j.stage == "barrier"]
    assert barrier and all("--model.init_args.barrier=abs_chord" in j.args for j in barrier)
    assert not any(
        "--model.init_args.barrier" in a for j in jobs if j.stage == "train" for a in j.args
    )
    _, plain = load_and_plan(write_study(tmp_path / "plain", tiny_study()))
    assert not any("--model.init_args.barrier" in a for j in plain for a in j.args)


def test_shipped_example_plans(capsys):
    from lmc.cli import main
    from tests.helpers import CONFIGS

    study, jobs = load_and_plan(CONFIGS / "studies" / "003_width.yaml")
    train = [j for j in jobs if j.stage == "train"]
    assert len(train) == 140 and len(jobs) == 140 + 70  # 20 seeds, 10 disjoint pairs a width
    assert {j.coordinates[WIDTH] for j in train} == {2, 4, 8, 16, 32, 64, 128}
    main(["study", "plan", str(CONFIGS / "studies" / "003_width.yaml")])
    out = capsys.readouterr().out
    assert "study 003_width: 210 jobs" in out
    # coordinates for people: short keys, command-line values, no dict repr
    first = next(line for line in out.splitlines() if line.startswith("train"))
    assert re.search(r"  width=2 lr=0.2 seed_everything=\d+", first) and "{" not in first
    # the spawn example: 2 parents x 5 epochs x 2 children, a barrier per parent and epoch
    _, jobs = load_and_plan(CONFIGS / "studies" / "instability.yaml")
    assert [sum(j.stage == s for j in jobs) for s in ("train", "children", "barrier")] == [
        2,
        20,
        10,
    ]


def test_a_repeated_value_is_refused_but_not_within_a_zip(tmp_path):
    std = "model.init_args.net.init_args.init_std"
    study = tiny_study(grid={WIDTH: [4, 8], std: [0.1, 0.1], "seed_everything": [0, 1]})
    study["evaluate"] = []
    with pytest.raises(StudyError, match=f"{std} repeats a value"):
        load_and_plan(write_study(tmp_path, study))
    study["train"]["zip"] = [[WIDTH, std]]
    _, jobs = load_and_plan(write_study(tmp_path, study))
    assert len(jobs) == 4


def test_ids_follow_the_base_config_content_not_its_comments(tmp_path):
    from tests.helpers import CONFIGS

    base = tmp_path / "base.yaml"
    text = (CONFIGS / "synthetic" / "teacher_student.yaml").read_text()
    base.write_text(text)
    study = tiny_study(config=[str(base)], grid={"seed_everything": [0, 1]}, evaluate=[])
    _, jobs = load_and_plan(write_study(tmp_path, study))
    base.write_text("# a new comment\n" + text)
    _, same = load_and_plan(write_study(tmp_path, study))
    assert [j.id for j in same] == [j.id for j in jobs]
    base.write_text(text.replace("lr: 0.2", "lr: 0.1"))
    _, changed = load_and_plan(write_study(tmp_path, study))
    assert not {j.id for j in changed} & {j.id for j in jobs}


def test_an_evaluate_stage_runs_the_command_it_names(tmp_path):
    """``command: fit`` (a task trained from the selected checkpoints, e.g. STE-MM) plans
    ``lmc fit`` jobs with the same selection; the default stays ``validate``, and the command
    is part of the job id."""
    study = tiny_study()
    _, default = load_and_plan(write_study(tmp_path / "validate", study))
    study["evaluate"][0]["command"] = "fit"
    _, fit = load_and_plan(write_study(tmp_path / "fit", study))
    evaluate = [j for j in default if j.stage == "barrier"]
    fitted = [j for j in fit if j.stage == "barrier"]
    assert {j.command for j in evaluate} == {"validate"} and {j.command for j in fitted} == {"fit"}
    assert [j.args[0] for j in fitted] == ["fit"] * len(fitted)
    assert [j.inputs for j in fitted] == [j.inputs for j in evaluate]
    assert {j.id for j in fitted}.isdisjoint(j.id for j in evaluate)


def test_has_key_reads_a_list_as_its_last_entry():
    """``--trainer.callbacks.init_args.rate`` addresses the last callback, so a grid key under
    a list is checked against the list's last entry."""
    from lmc.studies.spec.keys import has_key

    cfg = {"trainer": {"callbacks": [{"init_args": {"bits": 10}}, {"init_args": {"rate": 0.5}}]}}
    assert has_key(cfg, "trainer.callbacks.init_args.rate")
    assert not has_key(cfg, "trainer.callbacks.init_args.bits")
    assert not has_key({"trainer": {"callbacks": []}}, "trainer.callbacks.init_args")


@pytest.mark.parametrize("kind", sorted(EVALUATE_KINDS))
def test_every_stage_kind_selects_known_models(kind, tmp_path):
    """Every registered stage kind: its selector (pairs or groups) picks, among six models of two
    widths and three seeds, the known selections, each within one width; a stage of the kind
    given the other selector is refused by name."""
    stage_kind = EVALUATE_KINDS[kind]
    models = [{WIDTH: w, "seed_everything": s} for w in (4, 8) for s in (0, 1, 2)]
    if stage_kind.selects == "pairs":
        select = Pairs((WIDTH,), "seed_everything", 0)
        expected = [[0, 1], [0, 2], [3, 4], [3, 5]]
        assert select.coordinate([0, 2]) == 2
    else:
        assert stage_kind.selects == "groups"
        select = Groups((WIDTH,), "seed_everything", (2, 0))
        expected = [[2, 0], [5, 3]]
        assert select.coordinate([2, 0]) == [2, 0]
    assert select.select(models) == expected
    assert stage_kind.prefix and "/" not in stage_kind.prefix
    other = "groups" if stage_kind.selects == "pairs" else "pairs"
    stage = {
        "name": "s",
        "kind": kind,
        "config": str(CONFIGS / "studies" / "teacher_student_barrier.yaml"),
        other: {
            "over": [WIDTH],
            "vary": "seed_everything",
            **({"reference": 0} if other == "pairs" else {}),
        },
    }
    with pytest.raises(
        StudyError, match=f"a {kind} stage selects its models with `{stage_kind.selects}`"
    ):
        load_and_plan(write_study(tmp_path, tiny_study(evaluate=[stage])))


def test_a_key_given_twice_in_a_study_file_is_refused_naming_both_lines(tmp_path):
    """Issue 46: plain YAML kept the last of two `grid:` keys and dropped the first silently."""
    path = write_study(tmp_path, tiny_study())
    text = path.read_text().replace("  grid:\n", "  grid: {}\n  grid:\n", 1)
    path.write_text(text)
    with pytest.raises(StudyError, match=r"the key 'grid' is given twice .*lines \d+ and \d+"):
        run_study(path, tmp_path / "out", runner=lambda a: None, log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_the_study_file_is_named_as_a_folder(tiny_run, tmp_path):
    _, out = tiny_run
    with pytest.raises(StudyError, match=r"is a folder: give the study file .*study\.yaml"):
        run_study(out, tmp_path / "new", runner=lambda a: None, log=lambda _: None)


def test_a_dataset_the_jobs_cannot_find_is_refused_when_planned(tmp_path):
    """Issue 46: a wrong LMC_DATA_DIR passed `plan` and failed every job."""
    study = tiny_study(
        config=[str(CONFIGS / "mnist" / "mlp.yaml"), str(CONFIGS / "loggers" / "csv.yaml")],
        grid={"seed_everything": [0, 1]},
        args=[f"--data.init_args.data_dir={tmp_path / 'nowhere'}"],
        evaluate=[],
    )
    path = write_study(tmp_path, study)
    with pytest.raises(StudyError, match=r"stage 'train' job \{\}: MNIST not found: missing .*"):
        run_study(path, tmp_path / "out", runner=lambda a: None, log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_large_plan_is_announced_and_its_checks_show_progress(tmp_path, monkeypatch):
    """Issue 46: a 198,000-job grid planned silently for 5 minutes."""
    import lmc.studies.running.run as run
    import lmc.studies.spec.check as check

    monkeypatch.setattr(run, "LARGE_PLAN", 3)
    monkeypatch.setattr(check, "PROGRESS_SECONDS", 0.0)
    lines: list[str] = []
    load_and_plan(write_study(tmp_path, tiny_study()), log=lines.append)
    assert any(line.startswith("note: the study plans 6 jobs") for line in lines), lines
    assert any(line.startswith("checked 1/6 jobs") for line in lines), lines


def test_an_evaluate_stage_on_other_data_than_its_models_learned_is_refused(tmp_path):
    """Issue 46 (a new bad-input check): a barrier stage on a teacher of width 4 between
    students trained on a teacher of width 6 ran and gave numbers, exit status 0."""
    study = tiny_study()
    study["train"]["args"] = [*study["train"]["args"], "--data.init_args.teacher_width=6"]
    path = write_study(tmp_path, study)
    with pytest.raises(
        StudyError,
        match=r"read other data than their models were trained on .*\n  stage 'barrier' job "
        r".*data\.init_args\.teacher_width: 4 here, 6 in training",
    ):
        run_study(path, tmp_path / "out", runner=lambda a: None, log=lambda _: None)
    # the same data in both stages: planned
    study["evaluate"][0]["args"] = [
        *study["evaluate"][0]["args"],
        "--data.init_args.teacher_width=6",
    ]
    load_and_plan(write_study(tmp_path, study))


def test_a_file_given_as_the_study_folder_is_refused(tmp_path):
    path = write_study(tmp_path, tiny_study())
    with pytest.raises(StudyError, match=r"--dir .*study\.yaml is a file: give the study's folder"):
        run_study(path, path, runner=lambda a: None, log=lambda _: None)


def test_a_misspelt_figure_metric_is_refused_when_planned(tmp_path):
    """Issue 46's new bad-input check: a figure's misspelt metric passed `plan`, every job ran,
    then the report was not written (exit status 0)."""
    study = tiny_study(
        figures=[
            {
                "name": "f",
                "kind": "line",
                "stage": "barrier",
                "x": WIDTH,
                "y": ["barrier_loss_matchd"],
            }
        ]
    )
    path = write_study(tmp_path, study)
    with pytest.raises(
        StudyError,
        match=r"figure 'f' draws 'barrier_loss_matchd', which stage 'barrier' does not produce "
        r"\(\d+ names; the closest it produces: barrier_loss_matched",
    ):
        run_study(path, tmp_path / "out", runner=lambda a: None, log=lambda _: None)


def test_coordinates_read_with_the_shortest_keys_that_keep_them_apart():
    from lmc.studies.spec.keys import readable_coordinates, short_keys

    assert short_keys([WIDTH, "seed_everything"]) == {
        WIDTH: "width",
        "seed_everything": "seed_everything",
    }
    keys = ["model.init_args.net.init_args.seed", "data.init_args.seed", "trainer.max_epochs"]
    assert short_keys(keys) == {
        keys[0]: "net.seed",
        keys[1]: "data.seed",
        keys[2]: "max_epochs",
    }
    coords = {
        WIDTH: 8,
        "model.init_args.optimizer.init_args.lr": 0.1,
        "data.init_args.name": "mnist",
    }
    assert readable_coordinates(coords) == "width=8 lr=0.1 name=mnist"
    assert readable_coordinates({}) == ""
