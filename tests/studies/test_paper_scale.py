"""The paper-scale study files (``configs/studies/paper/*.yaml``) stay runnable: each one loads,
checks against its base configs (every grid key and value, through ``lmc``'s own parser) and
plans the number of jobs its header states (``Jobs: N``). No job runs.

Checking parses the base config once per grid value, and these files list up to 60 seeds or pair
ids; all of them are integers that only name a replicate, so the check takes the first two of
each such list (every other key's values are checked in full), and the plan takes them all."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lmc.studies import load_study, plan
from lmc.studies.spec.check import check_study
from lmc.studies.spec.schema import Study
from tests.helpers import CONFIGS

PAPER = CONFIGS / "studies" / "paper"
FILES = sorted(PAPER.glob("*.yaml"))
#: grid keys whose values only name a replicate (a seed or a pair id)
REPLICATE_KEYS = ("seed_everything", "data.init_args.seed", "model.init_args.seed")
#: the studies of 000, 002, 003 and 004 with a CPU-scale twin that the paper folder mirrors
EXPECTED = {
    "000_init_scale",
    "000_training",
    "000_training_mnist",
    "000_pruning",
    "000_pruning_vgg",
    "000_fusion",
    "000_fedma",
    "002_curves",
    "002_robust_curves",
    "003_width",
    "003_overlap",
    "003_pq_lr",
    "003_mnist_width",
    "004_merge_n",
    "004_geometry",
}


@pytest.fixture(autouse=True)
def _data_dir(tmp_path, monkeypatch):
    # nothing is read: planning and checking never open a dataset
    monkeypatch.setenv("LMC_DATA_DIR", str(tmp_path))


def header_jobs(path: Path) -> int:
    """The job count the file's header states (``Jobs: N``)."""
    head = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    found = re.findall(r"Jobs: (\d+)", head)
    assert len(found) == 1, f"{path.name}: the header must state `Jobs: N` once"
    return int(found[0])


def replicates_cut(study: Study) -> Study:
    """``study`` with each replicate list of its train grid cut to its first two values (the
    zipped lists together, so zip groups keep equal lengths)."""
    train = study.train
    cut = {k for group in train.zip for k in group if set(group) & set(REPLICATE_KEYS)}
    cut |= {k for k in train.grid if k in REPLICATE_KEYS}
    grid = {k: (v[:2] if k in cut else v) for k, v in train.grid.items()}
    return dataclasses.replace(study, train=dataclasses.replace(train, grid=grid))


def test_every_paper_study_is_there():
    assert {p.stem for p in FILES} == EXPECTED
    for name in EXPECTED:  # each has its CPU-scale twin
        assert (CONFIGS / "studies" / f"{name}.yaml").is_file(), name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_paper_study_checks_and_plans(path):
    study = load_study(path)
    assert study.name == f"{path.stem}_paper"  # never mixed with the CPU study's folder
    resolved = check_study(replicates_cut(study))
    jobs = plan(study, resolved)
    assert len(jobs) == header_jobs(path)
    assert len({j.id for j in jobs}) == len(jobs)
    # 000 reads its Def. 2.1 with an absolute value; 003 and 004 (and 002, without barrier
    # stages) take the signed gap above the chord
    barrier_stages = [s for s in study.evaluate if s.kind == "barrier"]
    if barrier_stages:
        want = "abs_chord" if path.stem.startswith("000") else "chord"
        assert study.barrier == want
