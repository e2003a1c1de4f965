"""``train.population: true``: the seeds of each point train as one ``lmc fit --population``
run, every seed's job still gets its own run folder, and the study's stages and results are
those of the sequential study (issue #16 item 3)."""

from __future__ import annotations

import json

import pytest
import torch

from lmc.io import load_checkpoint
from lmc.studies import StudyError, StudyStore, load_study, run_study
from lmc.studies.reporting.results import results
from lmc.studies.running.plan import MEMBER, plan
from tests.studies.conftest import CONFIGS, TINY_DATA, WIDTH, copy_run, tiny_study, write_study

DATA_SEED = "data.init_args.seed"


@pytest.fixture(scope="module")
def population_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("population_study")
    path = write_study(root, tiny_study(population=True))
    summary = run_study(path, root / "out", log=lambda _: None)
    assert not summary.failed, summary
    return path, root / "out"


def test_plan_has_a_leader_per_width_and_member_jobs_for_the_other_seeds(tmp_path):
    jobs = plan(load_study(write_study(tmp_path, tiny_study(population=True))))
    train = [j for j in jobs if j.stage == "train"]
    leaders = [j for j in train if j.members]
    assert [j.coordinates for j in train] == [
        {WIDTH: w, "seed_everything": s} for w in (4, 8) for s in (0, 1)
    ]
    assert [j.coordinates[WIDTH] for j in leaders] == [4, 8]
    for lead in leaders:
        assert lead.members == (0, 1) and "--population=[0, 1]" in lead.args
        assert not any(a.startswith("--seed_everything") for a in lead.args)
    members = [j for j in train if not j.members]
    assert all(j.command == MEMBER and j.coordinates["seed_everything"] == 1 for j in members)
    assert [m.inputs for m in members] == [(lead.id,) for lead in leaders]
    barriers = [j for j in jobs if j.stage == "barrier"]
    assert [b.inputs for b in barriers] == [(lead.id, m.id) for lead, m in zip(leaders, members)]


def test_every_member_equals_the_sequential_studys_run(population_run, tiny_run):
    _, out = population_run
    pop, seq = StudyStore(out), StudyStore(tiny_run[1])
    seq_jobs = {
        json.dumps(j["coordinates"], sort_keys=True): j for j in seq.plan() if j["stage"] == "train"
    }
    train = [j for j in pop.plan() if j["stage"] == "train"]
    assert len(train) == 4
    for job in train:
        twin = seq_jobs[json.dumps(job["coordinates"], sort_keys=True)]
        mine = load_checkpoint(pop.run_dir(job) / "checkpoints" / "last.ckpt")
        theirs = load_checkpoint(seq.run_dir(twin) / "checkpoints" / "last.ckpt")
        for key, value in theirs["state_dict"].items():
            torch.testing.assert_close(mine["state_dict"][key], value, atol=1e-5, rtol=1e-5)


def test_results_and_barriers_are_the_sequential_studys(population_run, tiny_run):
    a, b = results(population_run[1]), results(tiny_run[1])
    keys = ["stage", WIDTH, "seed_everything", "metric"]
    merged = a.merge(b, on=keys, suffixes=("_pop", "_seq"))
    wanted = merged[merged.metric.isin(["test/loss", "barrier_loss_matched", "train/loss"])]
    assert set(wanted.stage) == {"train", "barrier"} and len(wanted) >= 10
    assert wanted.value_pop.to_numpy() == pytest.approx(wanted.value_seq.to_numpy(), rel=1e-4)


def test_a_rerun_skips_the_population_and_its_members(population_run, tmp_path):
    path, _ = population_run
    out = copy_run(population_run, tmp_path)
    ran = []
    summary = run_study(path, out, runner=ran.append, log=lambda _: None)
    assert not ran and len(summary.skipped) == 6


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"grid": {WIDTH: [4, 8], "seed_everything": [0]}}, "gives 1 seed"),
        ({"grid": {WIDTH: [4, 8]}}, "gives 0 seed"),
        (
            {
                "grid": {WIDTH: [4, 8], "seed_everything": [0, 1]},
                "zip": [[WIDTH, "seed_everything"]],
            },
            "needs two or more seeds",
        ),
        ({"grid": {WIDTH: [4], "seed_everything": [0, 1.5]}}, "must be integers"),
    ],
)
def test_a_population_without_a_seed_axis_is_refused(changes, match, tmp_path):
    path = write_study(tmp_path, tiny_study(population=True, **changes))
    with pytest.raises(StudyError, match=match):
        load_study(path)


def test_a_population_with_spawn_stages_is_refused(tmp_path):
    study = tiny_study(population=True)
    study["spawn"] = [{"name": "child", "at_epoch": [0], "grid": {"seed_everything": [5]}}]
    with pytest.raises(StudyError, match="cannot be combined with spawn stages"):
        load_study(write_study(tmp_path, study))


def _trial_study(population: bool) -> dict:
    """Two trials of two models: each data seed zipped with its models' seeds (disjoint pairs)."""
    return tiny_study(
        population=population,
        grid={WIDTH: [4], DATA_SEED: [0, 0, 1, 1], "seed_everything": [0, 1, 2, 3]},
        zip=[[DATA_SEED, "seed_everything"]],
        evaluate=[
            {
                "name": "barrier",
                "kind": "barrier",
                "config": str(CONFIGS / "studies" / "teacher_student_barrier.yaml"),
                "pairs": {"over": [WIDTH, DATA_SEED], "vary": "seed_everything"},
                "args": ["--model.init_args.evaluation.num_alphas=3", *TINY_DATA],
            }
        ],
    )


def test_trials_train_as_one_population_each_equal_to_their_sequential_twins(tmp_path):
    """Issue 48: seeds zipped with a data seed (a trial, or a disjoint pair with its pair id)
    train as one population per data seed; each member equals its own sequential run, and the
    barriers between them are the sequential study's."""
    jobs = plan(load_study(write_study(tmp_path / "p", _trial_study(True))))
    leaders = [j for j in jobs if j.stage == "train" and j.members]
    assert [(j.coordinates[DATA_SEED], j.members) for j in leaders] == [(0, (0, 1)), (1, (2, 3))]
    assert all(f"--{DATA_SEED}={j.coordinates[DATA_SEED]}" in j.args for j in leaders)
    outs = {}
    for population in (True, False):
        root = tmp_path / str(population)
        summary = run_study(write_study(root, _trial_study(population)), root / "out", log=print)
        assert not summary.failed, summary
        outs[population] = root / "out"
    pop, seq = StudyStore(outs[True]), StudyStore(outs[False])
    key = lambda j: json.dumps(j["coordinates"], sort_keys=True)  # noqa: E731
    twins = {key(j): j for j in seq.plan() if j["stage"] == "train"}
    members = [j for j in pop.plan() if j["stage"] == "train"]
    assert sorted(map(key, members)) == sorted(twins)
    for job in members:
        mine = load_checkpoint(pop.run_dir(job) / "checkpoints" / "last.ckpt")["state_dict"]
        theirs = load_checkpoint(seq.run_dir(twins[key(job)]) / "checkpoints" / "last.ckpt")
        for name, value in theirs["state_dict"].items():
            torch.testing.assert_close(mine[name], value, atol=1e-5, rtol=1e-5)
    a, b = results(outs[True]), results(outs[False])
    cols = ["stage", DATA_SEED, "seed_everything", "metric"]
    both = a.merge(b, on=cols, suffixes=("_pop", "_seq"))
    barrier = both[both.metric == "barrier_loss_matched"]
    assert len(barrier) == 2  # one barrier per trial
    assert barrier.value_pop.to_numpy() == pytest.approx(barrier.value_seq.to_numpy(), rel=1e-4)
