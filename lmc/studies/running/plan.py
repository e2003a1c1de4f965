"""Plan a study: the train grid into one ``lmc fit`` job per point (product of the keys, zip
groups varied together; with ``train.population`` one ``lmc fit --population`` per point of
the other keys, its seeds' jobs taking their members from it), and each evaluate stage into one ``lmc validate`` job per pair of
trained models, selected by grid coordinates. Pure: no job runs, no folder is written."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from lmc.io import spawn_point
from lmc.studies.spec.keys import cli_value, config_args, has_key
from lmc.studies.spec.schema import (
    PARENT_PREFIX,
    SEED_KEY,
    SPAWN_EPOCH,
    TRAIN_STAGE,
    EvaluateStage,
    SpawnStage,
    Study,
    StudyError,
)

CHECKPOINTS_KEY = "model.init_args.checkpoints"
#: the command of a population member's job: no run, its member is taken from the leader
MEMBER = "member"


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
    #: a spawned training: the epoch of its parent (``inputs[0]``) it starts from
    spawn_epoch: int | None = None
    #: a population's leader: the seeds its ``lmc fit --population`` trains (its own first)
    members: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "command": self.command,
            "coordinates": self.coordinates,
            "args": list(self.args),
            "inputs": list(self.inputs),
            "spawn_epoch": self.spawn_epoch,
            **({"members": list(self.members)} if self.members else {}),
        }


def _config_digest(path: Path) -> str:
    """sha256 of the config's content (parsed: comments and layout do not count), read once per
    version of the file (every job of a stage shares its configs)."""
    stat = path.stat()
    return _digest_of(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _digest_of(path: Path, mtime_ns: int, size: int) -> str:
    content = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True, default=str)
    return hashlib.sha256(content.encode()).hexdigest()


def job_id(
    stage: str,
    command: str,
    args: tuple[str, ...],
    inputs: tuple[str, ...],
    configs: tuple[Path, ...],
    spawn_epoch: int | None = None,
) -> str:
    """Short sha256 of the job's resolved args (canonical JSON), its inputs' ids and the content
    of its base configs, so editing a value or a base config makes a new job."""
    paths = {str(p) for p in configs}  # where the repository sits does not change a job
    payload: dict[str, Any] = {
        "stage": stage,
        "command": command,
        "args": sorted("<config>" if a in paths else a for a in args),
        "inputs": list(inputs),
        "configs": [_config_digest(p) for p in configs],
    }
    if spawn_epoch is not None:
        payload["spawn_epoch"] = spawn_epoch
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def grid_points(
    grid: Mapping[str, list[Any]], zip_groups: Sequence[Sequence[str]]
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


def coord_args(coords: Mapping[str, Any]) -> list[str]:
    return [f"--{k}={cli_value(v)}" for k, v in coords.items()]


def _selections(stage: EvaluateStage, train_jobs: list[Job]) -> list[list[Job]]:
    """The train jobs each evaluate job of ``stage`` takes, in order: per pair, the reference
    model then the other; per group, one model per selected value of ``vary``."""
    chosen = stage.select.select([j.coordinates for j in train_jobs])
    return [[train_jobs[i] for i in members] for members in chosen]


def _evaluate_jobs(
    stage: EvaluateStage, train_jobs: list[Job], resolved: Mapping[str, Any] | None
) -> list[Job]:
    select = stage.select
    # the selected models share their `over` coordinates; those the evaluate config has (e.g.
    # the width of its net) are passed to it
    passed = [
        k
        for k in select.over
        if not k.startswith(PARENT_PREFIX)
        and k != SPAWN_EPOCH
        and (resolved is None or has_key(resolved, k))
    ]
    jobs = []
    points = grid_points(stage.grid, stage.zip) if stage.grid else [{}]
    base = (stage.command, *config_args(stage.configs, stage.args))
    for members in _selections(stage, train_jobs):
        first = members[0].coordinates
        values = [m.coordinates[select.vary] for m in members]
        selected = {k: first[k] for k in select.over}
        selected[select.vary] = select.coordinate(values)
        shared = (*base, *coord_args({k: first[k] for k in passed}))
        inputs = tuple(m.id for m in members)
        for point in points:  # the stage's own grid: each selection at every point
            coords = {**selected, **point}
            args = (*shared, *coord_args(point))
            jobs.append(
                Job(
                    stage.name,
                    stage.command,
                    coords,
                    args,
                    inputs,
                    job_id(stage.name, stage.command, args, inputs, stage.configs),
                )
            )
    if not jobs:
        raise StudyError(f"evaluate stage {stage.name!r} selects no {select.noun} of training jobs")
    return jobs


def plan(study: Study, resolved: Mapping[str, Mapping[str, Any]] | None = None) -> list[Job]:
    """The study's jobs in run order: the train jobs, then each evaluate stage's.

    Args:
        study: the checked study (:func:`lmc.studies.spec.schema.load_study`).
        resolved: the resolved base config per stage (:func:`lmc.studies.spec.check.check_study`);
            decides which shared coordinates an evaluate job passes on. Without it, all of
            them are passed.
    """
    train = study.train
    epochs = sorted({e for stage in study.spawn for e in stage.at_epoch})
    points = [f"--spawn_points={json.dumps(epochs)}"] if epochs else []
    base = (train.command, *config_args(train.configs, [*train.args, *points]))
    jobs = []
    together = train.population is True  # "auto" is decided before planning (run.py)
    if together:
        jobs = _population_jobs(study, base)
    for coords in grid_points(train.grid, train.zip) if not together else []:
        args = (*base, *coord_args(coords))
        jobs.append(
            Job(
                TRAIN_STAGE,
                train.command,
                coords,
                args,
                (),
                job_id(TRAIN_STAGE, train.command, args, (), train.configs),
            )
        )
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise StudyError("two training jobs have the same args; check train.grid for duplicates")
    by_stage = {TRAIN_STAGE: jobs}
    spawned = []
    for spawn in study.spawn:
        by_stage[spawn.name] = _spawn_jobs(study, spawn, jobs)
        spawned += by_stage[spawn.name]
    evaluated = []
    for stage in study.evaluate:
        evaluated += _evaluate_jobs(stage, by_stage[stage.stage], (resolved or {}).get(stage.name))
    return jobs + spawned + evaluated


def _population_jobs(study: Study, base: tuple[str, ...]) -> list[Job]:
    """``train.population``: per point of the grid's other keys, its first seed's job is the
    population's leader (``lmc fit --population [seeds]``, ``members``) and every other seed's
    job a :data:`MEMBER` job that takes its trained member from the leader (``inputs``). Each
    job keeps the coordinates of its seed, so stages select them as sequential runs."""
    train = study.train
    leaders: dict[str, Job] = {}
    jobs = []
    groups = seed_groups(train.grid, train.zip)
    for coords in grid_points(train.grid, train.zip):
        rest = _without_seed(coords)
        key = repr(rest)
        if key not in leaders:
            seeds = groups[key][1]
            args = (*base, *coord_args(rest), f"--population={json.dumps(list(seeds))}")
            jid = job_id(TRAIN_STAGE, "fit", args, (), train.configs)
            leaders[key] = Job(TRAIN_STAGE, "fit", coords, args, (), jid, members=seeds)
            jobs.append(leaders[key])
            continue
        args = (f"--{SEED_KEY}={cli_value(coords[SEED_KEY])}",)
        inputs = (leaders[key].id,)
        jid = job_id(TRAIN_STAGE, MEMBER, args, inputs, train.configs)
        jobs.append(Job(TRAIN_STAGE, MEMBER, coords, args, inputs, jid))
    return jobs


def seed_groups(
    grid: Mapping[str, list[Any]], zip_groups: Sequence[Sequence[str]]
) -> dict[str, tuple[dict[str, Any], tuple[Any, ...]]]:
    """Per point of the grid's keys other than the seed (keyed by its ``repr``): that point and
    its seeds, in grid order (the seeds that train as one population)."""
    groups: dict[str, tuple[dict[str, Any], list[Any]]] = {}
    for point in grid_points(grid, zip_groups):
        rest = _without_seed(point)
        groups.setdefault(repr(rest), (rest, []))[1].append(point[SEED_KEY])
    return {k: (rest, tuple(seeds)) for k, (rest, seeds) in groups.items()}


def _without_seed(coords: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in coords.items() if k != SEED_KEY}


def _spawn_jobs(study: Study, spawn: SpawnStage, parents: list[Job]) -> list[Job]:
    """Per parent train job, spawn epoch and point of the spawn grid, one ``lmc fit`` that
    starts from the parent's checkpoint after that epoch (its run folder known once it ran)."""
    train = study.train
    base = ("fit", *config_args(train.configs, [*train.args, *spawn.args]))
    jobs = []
    for parent in parents:
        kept = {k: v for k, v in parent.coordinates.items() if k not in spawn.grid}
        for epoch in spawn.at_epoch:
            for point in grid_points(spawn.grid, spawn.zip):
                coords = {spawn.parent_key(k): v for k, v in parent.coordinates.items()}
                coords = {**coords, SPAWN_EPOCH: epoch, **point}
                args = (*base, *coord_args(kept), *coord_args(point))
                inputs = (parent.id,)
                jid = job_id(spawn.name, "fit", args, inputs, train.configs, epoch)
                jobs.append(Job(spawn.name, "fit", coords, args, inputs, jid, epoch))
    return jobs


def job_args(job: Job, job_dir: Path, input_runs: list[Path]) -> list[str]:
    """The full ``lmc`` args of ``job`` run in ``job_dir``, given its inputs' run folders."""
    args = [*job.args]
    if job.spawn_epoch is not None:
        args.append(f"--spawn_from={spawn_point(input_runs[0], job.spawn_epoch)}")
    elif job.inputs:
        args.append(f"--{CHECKPOINTS_KEY}=[{', '.join(str(r) for r in input_runs)}]")
    args.append(f"--trainer.default_root_dir={job_dir}")
    return args


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``1 <= i <= n``.

    Raises:
        StudyError: anything else.
    """
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise StudyError(
            f"--shard {text}: give i/n with 1 <= i <= n (shard i of n machines), e.g. 1/2"
        )
    return i, n


def shard(jobs: list[Job], i: int, n: int) -> tuple[list[Job], list[Job]]:
    """Shard ``i`` of ``n`` of the study's jobs, and the evaluate jobs no shard runs.

    The unit is a group of jobs that evaluate jobs link (e.g. one width's trainings and their
    barriers), so every shard runs its evaluate jobs with its own trainings; groups go to shards
    largest first, each to the shard with the fewest jobs. When there are fewer groups than
    shards, the train jobs are dealt out one by one and the evaluate jobs are left for one run
    over the shard folders copied together (the second list).
    """
    parent = {j.id: j.id for j in jobs}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for job in jobs:
        for dep in job.inputs:
            parent[find(dep)] = find(job.id)
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(find(job.id), []).append(job)
    units = list(groups.values())
    left: list[Job] = []
    if len(units) < n:
        units = [[j] for j in jobs if not j.inputs]
        left = [j for j in jobs if j.inputs]
    loads = [0] * n
    mine: set[str] = set()
    for unit in sorted(units, key=len, reverse=True):  # stable: plan order among equals
        k = loads.index(min(loads))
        loads[k] += len(unit)
        if k == i - 1:
            mine.update(j.id for j in unit)
    return [j for j in jobs if j.id in mine], left
