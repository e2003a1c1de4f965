"""``train.population: auto`` (the default, issue 30 item 6): a study's seed axis trains as one
population per point on a GPU when the model allows it, else one run per seed; the choice is
said, and a study's folder keeps the one it was planned with."""

from __future__ import annotations

import pytest
import torch

from lmc.studies import StudyError, StudyStore, load_study, run_study
from lmc.studies.running import auto_population as auto
from lmc.studies.running.run import checked_plan
from tests.studies.conftest import tiny_study, write_study


def planned(tmp_path, previous=None, **changes):
    lines: list[str] = []
    study = load_study(write_study(tmp_path, tiny_study(**changes)))
    assert study.train.population == "auto"
    jobs = checked_plan(study, previous, lines.append)
    train = [j for j in jobs if j.stage == "train"]
    return train, lines


def test_on_the_cpu_each_seed_is_a_run(tmp_path):
    train, lines = planned(tmp_path)  # the tiny study trains on the CPU
    assert len(train) == 4 and not any(j.members for j in train)
    assert lines == [
        "train.population auto: one run per seed (the runs train on the CPU, where separate "
        "runs are as fast)"
    ]


def test_on_a_gpu_a_model_that_allows_it_trains_as_populations(tmp_path, monkeypatch):
    monkeypatch.setattr(auto, "on_gpu", lambda resolved: True)
    train, lines = planned(tmp_path)
    leaders = [j for j in train if j.members]
    assert [j.members for j in leaders] == [(0, 1), (0, 1)]  # one per width
    assert all("--population=[0, 1]" in j.args for j in leaders)
    assert lines == [
        "train.population auto: one population per point (a CUDA device, and every point's "
        "model trains as one population)"
    ]


def test_on_a_gpu_a_setting_a_population_cannot_reproduce_keeps_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(auto, "on_gpu", lambda resolved: True)
    study = tiny_study()
    args = [*study["train"]["args"], "--trainer.gradient_clip_val=1.0"]
    train, lines = planned(tmp_path, args=args)
    assert not any(j.members for j in train)
    [line] = lines
    assert line.startswith("train.population auto: one run per seed (the model cannot train as")
    assert "gradient_clip_val=1.0" in line and "model.init_args.net.init_args.width" in line


def test_the_study_folder_keeps_its_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(auto, "on_gpu", lambda resolved: True)

    def probe(args):
        raise AssertionError("a planned folder decides without probing")

    monkeypatch.setattr(auto, "probe_population", probe)
    previous = [{"stage": "train", "members": []}, {"stage": "barrier"}]
    train, lines = planned(tmp_path, previous=previous)
    assert not any(j.members for j in train)
    assert lines == ["train.population auto: one run per seed (as the study's folder was planned)"]


def test_a_run_study_keeps_the_plan_it_started_with(tmp_path, monkeypatch):
    """Run on the CPU (one run per seed), rerun where a GPU is seen: the same jobs, all done."""
    path = write_study(tmp_path, tiny_study(evaluate=[]))
    first = run_study(path, tmp_path / "out", log=lambda _: None)
    assert not first.failed and len(first.ran) == 4
    monkeypatch.setattr(auto, "on_gpu", lambda resolved: True)
    lines: list[str] = []
    again = run_study(path, tmp_path / "out", log=lines.append)
    assert not again.ran and len(again.skipped) == 4
    assert "train.population auto: one run per seed (as the study's folder was planned)" in lines
    assert not any(j.get("members") for j in StudyStore(tmp_path / "out").plan())


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_population_takes_true_false_or_auto(tmp_path, value):
    with pytest.raises(StudyError, match="must be true, false or auto"):
        load_study(write_study(tmp_path, tiny_study(population=value)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_study_on_a_gpu_trains_its_seeds_as_populations(tmp_path):
    study = tiny_study()
    study["train"]["args"] = [*study["train"]["args"], "--trainer.accelerator=auto"]
    path = write_study(tmp_path, study)
    lines: list[str] = []
    summary = run_study(path, tmp_path / "out", log=lines.append)
    assert not summary.failed, summary
    assert any(line.startswith("train.population auto: one population per point") for line in lines)
    store = StudyStore(tmp_path / "out")
    train = [j for j in store.plan() if j["stage"] == "train"]
    assert len(train) == 4 and sum(bool(j.get("members")) for j in train) == 2
    assert all(store.is_done(j) for j in store.plan())
