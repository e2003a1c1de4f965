"""Plan a study: the train grid into one ``lmc fit`` job per point (product of the keys, zip
groups varied together), and each evaluate stage into one ``lmc validate`` job per pair of
trained models, selected by grid coordinates. Pure: no job runs, no folder is written."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmc.studies.check import cli_value, config_args, has_key
from lmc.studies.schema import TRAIN_STAGE, EvaluateStage, Study, StudyError

CHECKPOINTS_KEY = "model.init_args.checkpoints"


@dataclass(frozen=True)
class Job:
    """One ``lmc`` run of a study.

    ``args`` are the CLI args without the job folder (``--trainer.default_root_dir``) and, for
    evaluate jobs, without the checkpoints: those are the run folders of the ``inputs`` (train
    job ids), known once they ran (:func:`job_args`).
    """

    stage: str
    command: str
    coordinates: dict[str, Any]
    args: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    id: str = field(default="")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "command": self.command,
            "coordinates": self.coordinates,
            "args": list(self.args),
            "inputs": list(self.inputs),
        }


def _config_digest(path: Path) -> str:
    """sha256 of the config's content (parsed: comments and layout do not count)."""
    content = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True, default=str)
    return hashlib.sha256(content.encode()).hexdigest()


def job_id(
    stage: str,
    command: str,
    args: tuple[str, ...],
    inputs: tuple[str, ...],
    configs: tuple[Path, ...],
) -> str:
    """Short sha256 of the job's resolved args (canonical JSON), its inputs' ids and the content
    of its base configs, so editing a value or a base config makes a new job."""
    paths = {str(p) for p in configs}  # where the repository sits does not change a job
    payload = {
        "stage": stage,
        "command": command,
        "args": sorted("<config>" if a in paths else a for a in args),
        "inputs": list(inputs),
        "configs": [_config_digest(p) for p in configs],
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def grid_points(
    grid: Mapping[str, list[Any]], zip_groups: tuple[tuple[str, ...], ...]
) -> list[dict[str, Any]]:
    """Every point of ``grid``: the product over the keys, each zip group as one axis whose
    values go together. Keys keep the order of the grid."""
    zipped = {k for group in zip_groups for k in group}
    axes: list[list[dict[str, Any]]] = []
    for key in grid:
        group = next((g for g in zip_groups if g[0] == key), None)
        if group is not None:
            axes.append([dict(zip(group, vals)) for vals in zip(*(grid[k] for k in group))])
        elif key not in zipped:
            axes.append([{key: v} for v in grid[key]])
    points = []
    for combo in itertools.product(*axes):
        merged = {k: v for part in combo for k, v in part.items()}
        points.append({k: merged[k] for k in grid})
    return points


def _coord_args(coords: Mapping[str, Any]) -> list[str]:
    return [f"--{k}={cli_value(v)}" for k, v in coords.items()]


def _evaluate_jobs(
    stage: EvaluateStage, train_jobs: list[Job], resolved: Mapping[str, Any] | None
) -> list[Job]:
    pairs = stage.pairs
    # a pair shares its `over` coordinates; those the evaluate config has (e.g. the width of its
    # net) are passed to it
    passed = [k for k in pairs.over if resolved is None or has_key(resolved, k)]
    jobs = []
    for ref in train_jobs:
        if ref.coordinates[pairs.vary] != pairs.reference:
            continue
        for other in train_jobs:
            same = all(other.coordinates[k] == ref.coordinates[k] for k in pairs.over)
            if not same or other is ref:
                continue
            coords = {k: ref.coordinates[k] for k in pairs.over}
            coords[pairs.vary] = other.coordinates[pairs.vary]
            args = (
                "validate",
                *config_args(stage.configs, stage.args),
                *_coord_args({k: ref.coordinates[k] for k in passed}),
            )
            inputs = (ref.id, other.id)
            jobs.append(
                Job(
                    stage.name,
                    "validate",
                    coords,
                    args,
                    inputs,
                    job_id(stage.name, "validate", args, inputs, stage.configs),
                )
            )
    if not jobs:
        raise StudyError(f"evaluate stage {stage.name!r} selects no pair of training jobs")
    return jobs


def plan(study: Study, resolved: Mapping[str, Mapping[str, Any]] | None = None) -> list[Job]:
    """The study's jobs in run order: the train jobs, then each evaluate stage's.

    Args:
        study: the checked study (:func:`lmc.studies.schema.load_study`).
        resolved: the resolved base config per stage (:func:`lmc.studies.check.check_study`);
            decides which shared coordinates an evaluate job passes on. Without it, all of
            them are passed.
    """
    train = study.train
    base = ("fit", *config_args(train.configs, train.args))
    jobs = []
    for coords in grid_points(train.grid, train.zip):
        args = (*base, *_coord_args(coords))
        jobs.append(
            Job(
                TRAIN_STAGE,
                "fit",
                coords,
                args,
                (),
                job_id(TRAIN_STAGE, "fit", args, (), train.configs),
            )
        )
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise StudyError("two training jobs have the same args; check train.grid for duplicates")
    evaluated = []
    for stage in study.evaluate:
        evaluated += _evaluate_jobs(stage, jobs, (resolved or {}).get(stage.name))
    return jobs + evaluated


def job_args(job: Job, job_dir: Path, input_runs: list[Path]) -> list[str]:
    """The full ``lmc`` args of ``job`` run in ``job_dir``, given its inputs' run folders."""
    args = [*job.args]
    if job.inputs:
        args.append(f"--{CHECKPOINTS_KEY}=[{', '.join(str(r) for r in input_runs)}]")
    args.append(f"--trainer.default_root_dir={job_dir}")
    return args
