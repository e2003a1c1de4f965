"""A tiny study (2 widths x 2 seeds of the teacher-student task, 1 epoch on 64 samples, then
the barrier of seed 0 with seed 1 per width), written into tmp folders, and one run of it that
the tests copy before they change anything."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from lmc.studies import run_study
from tests.helpers import CONFIGS

WIDTH = "model.init_args.net.init_args.width"


def merge_stage(*args: str) -> dict:
    """A merge stage of the tiny study: its seeds' models merged (teacher_student_merge.yaml)
    with ``args``."""
    return {
        "name": "merge",
        "kind": "merge",
        "config": str(CONFIGS / "studies" / "teacher_student_merge.yaml"),
        "groups": {"over": [WIDTH], "vary": "seed_everything"},
        "args": list(args),
    }


TINY_DATA = [
    "--data.init_args.n_train=64",
    "--data.init_args.n_val=32",
    "--data.init_args.n_test=32",
    "--data.init_args.batch_size=64",
]


def tiny_study(**changes) -> dict:
    """The tiny study as a dict; ``changes`` replace top-level or ``train`` entries."""
    study = {
        "name": "tiny",
        "train": {
            "config": [
                str(CONFIGS / "synthetic" / "teacher_student.yaml"),
                str(CONFIGS / "loggers" / "csv.yaml"),
            ],
            "grid": {WIDTH: [4, 8], "seed_everything": [0, 1]},
            "args": [
                "--trainer.max_epochs=1",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
                *TINY_DATA,
            ],
        },
        "evaluate": [
            {
                "name": "barrier",
                "kind": "barrier",
                "config": str(CONFIGS / "studies" / "teacher_student_barrier.yaml"),
                "pairs": {"over": [WIDTH], "vary": "seed_everything", "reference": 0},
                "args": ["--model.init_args.evaluation.num_alphas=3", *TINY_DATA],
            }
        ],
    }
    for key, value in changes.items():
        if key in ("config", "grid", "zip", "args", "population"):
            study["train"][key] = value
        else:
            study[key] = value
    return study


def write_study(folder: Path, study: dict, name: str = "study.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """(study file, study folder) after one complete run of the tiny study. Do not change it:
    copy it with :func:`copy_run`."""
    root = tmp_path_factory.mktemp("tiny_study")
    path = write_study(root, tiny_study())
    summary = run_study(path, root / "out", log=lambda _: None)
    assert not summary.failed, summary
    return path, root / "out"


def copy_run(tiny_run: tuple[Path, Path], tmp_path: Path) -> Path:
    dest = tmp_path / "out"
    shutil.copytree(tiny_run[1], dest)
    return dest


def width_claim(**changes) -> dict:
    """A claim on the tiny study: the matched barrier at width 8 below width 4 (``changes``
    replace its entries)."""
    claim = {
        "name": "wider_is_flatter",
        "claim": "the barrier falls with the width",
        "source": "003 §4",
        "test": "difference",
        "stage": "barrier",
        "metric": "barrier_loss_matched",
        "a": {"where": {WIDTH: 8}},
        "b": {"where": {WIDTH: 4}},
        "expect": "less",
    }
    return claim | changes
