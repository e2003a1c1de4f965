"""Spawned trainings (Frankle et al.'s instability analysis): children start from a train job's
checkpoint after k epochs and go on with their own seed; a child with its parent's seed is its
parent, exactly; barriers select children by parent, spawn epoch and seed."""

from __future__ import annotations

import csv

import pytest
import torch

from lmc.io import load_checkpoint, model_state_dict, resolve_checkpoint
from lmc.studies import StudyError, StudyStore, load_and_plan, run_study
from lmc.studies.reporting.results import results
from tests.studies.conftest import tiny_study, write_study

MINIBATCH = [  # 64 samples in batches of 16: 4 steps an epoch, so the data order matters
    "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--data.init_args.n_train=64",
    "--data.init_args.n_val=32",
    "--data.init_args.n_test=32",
    "--data.init_args.batch_size=16",
    "--model.init_args.optimizer.init_args.lr=0.01",
]


def spawn_study(**changes) -> dict:
    study = tiny_study(grid={"seed_everything": [0]}, args=MINIBATCH)
    study["spawn"] = [{"name": "children", "at_epoch": [0, 1], "grid": {"seed_everything": [0, 1]}}]
    barrier = study["evaluate"][0]
    barrier["stage"] = "children"
    barrier["pairs"] = {
        "over": ["parent:seed_everything", "spawn_epoch"],
        "vary": "seed_everything",
        "reference": 0,
    }
    barrier["args"] = [*barrier["args"], "--model.init_args.matcher=none"]
    study.update(changes)
    return study


def _weights(store: StudyStore, job) -> dict[str, torch.Tensor]:
    return model_state_dict(load_checkpoint(resolve_checkpoint(store.run_dir(job))))


def test_children_start_from_their_parent_and_a_same_seed_child_is_its_parent(tmp_path):
    path = write_study(tmp_path, spawn_study())
    _, jobs = load_and_plan(path)
    train = [j for j in jobs if j.stage == "train"]
    children = [j for j in jobs if j.stage == "children"]
    barriers = [j for j in jobs if j.stage == "barrier"]
    assert len(train) == 1 and len(children) == 4 and len(barriers) == 2
    assert "--spawn_points=[0, 1]" in train[0].args
    assert {(c.spawn_epoch, c.coordinates["seed_everything"]) for c in children} == {
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    }
    assert all(c.inputs == (train[0].id,) for c in children)
    assert all(c.coordinates["parent:seed_everything"] == 0 for c in children)
    out = tmp_path / "out"
    summary = run_study(path, out, log=lambda _: None)
    assert not summary.failed and len(summary.ran) == 7
    store = StudyStore(out)
    parent = _weights(store, train[0])

    def child(epoch, seed):
        return next(
            c
            for c in children
            if c.spawn_epoch == epoch and c.coordinates["seed_everything"] == seed
        )

    record = store.record(child(1, 1))
    spawn_from = next(a for a in record["resolved_args"] if a.startswith("--spawn_from="))
    assert spawn_from.endswith("checkpoints/spawn/epoch=1.ckpt")
    for epoch in (0, 1):
        # the parent's seed: the same data order from the same point, so the same weights
        same = _weights(store, child(epoch, 0))
        assert all(torch.equal(same[k], parent[k]) for k in parent)
        other = _weights(store, child(epoch, 1))
        assert not all(torch.equal(other[k], parent[k]) for k in parent)
    # a child spawned after epoch 1 trains only the second epoch
    with (store.run_dir(child(1, 1)) / "metrics.csv").open() as f:
        steps = [row for row in csv.DictReader(f) if row["train/loss_step"]]
    assert {row["epoch"] for row in steps} == {"1"} and len(steps) == 4
    table = results(out)
    barrier = table[(table.stage == "barrier") & (table.metric == "barrier_loss_naive")]
    assert sorted(barrier.spawn_epoch) == [0, 1] and barrier.value.notna().all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"spawn": [{"name": "c", "at_epoch": [0, 2], "grid": {"seed_everything": [1]}}]},
            "at_epoch [2] is not before the end of training (trainer.max_epochs=2)",
        ),
        (
            {"spawn": [{"name": "c", "at_epoch": [0], "grid": {"seed": [1]}}]},
            "spawn stage 'c' grid key 'seed' is not in the base config",
        ),
        (
            {"spawn": [{"name": "c", "at_epoch": [-1], "grid": {"seed_everything": [1]}}]},
            "at_epoch must list distinct whole numbers of epochs >= 0",
        ),
        (
            {"spawn": [{"name": "train", "at_epoch": [0], "grid": {"seed_everything": [1]}}]},
            "must be a folder-safe name other than 'train'",
        ),
    ],
)
def test_bad_spawn_stages_are_refused_before_any_job(tmp_path, change, message):
    study = spawn_study(**change)
    study["evaluate"] = []
    path = write_study(tmp_path, study)
    with pytest.raises(StudyError) as err:
        run_study(path, tmp_path / "out", runner=lambda a: None, log=lambda _: None)
    assert message in str(err.value)
    assert not (tmp_path / "out" / "jobs").exists()


def test_an_evaluate_stage_must_name_a_training_stage_and_cover_its_keys(tmp_path):
    study = spawn_study()
    study["evaluate"][0]["stage"] = "kids"
    with pytest.raises(StudyError, match="stage 'kids' is no training stage; training stages: "):
        run_study(write_study(tmp_path, study), tmp_path / "out", log=lambda _: None)
    study = spawn_study()
    study["evaluate"][0]["pairs"]["over"] = ["parent:seed_everything"]
    with pytest.raises(StudyError, match="key 'spawn_epoch' of 'children' is neither in `over`"):
        run_study(write_study(tmp_path, study), tmp_path / "out", log=lambda _: None)
