"""``train.population: auto`` (the default): a study's seed axis trains as one ``lmc fit
--population`` per point of its other keys when that is faster and gives the same models: the
runs train on a GPU (where one vectorised program of many small models beats as many runs) and
the model, data, optimizer and trainer options are ones a population reproduces exactly (every
member equal to its sequential run, as ``train.population: true`` promises). Otherwise, or with
``false``, each seed is its own run. The choice is said in the plan's log and kept with the
study's folder: a study resumed on another machine keeps the jobs it started with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from lmc.studies.running.plan import coord_args, seed_groups
from lmc.studies.spec.keys import config_args
from lmc.studies.spec.schema import AUTO, SEED_KEY, Study, StudyError

#: ``lmc fit <args> --population [seeds]`` built and checked (no training): ``None`` if it
#: would train, else why not
Probe = Callable[[list[str]], "str | None"]


def check_population(
    population: Any, command: str, grid: Mapping[str, list[Any]], groups: Sequence[Sequence[str]]
) -> None:
    """``train.population`` of a study file: ``true`` (with a seed axis of integers to train
    together), ``false`` or ``auto``; :class:`StudyError` naming the fix otherwise."""
    if population is not True and population is not False and population != AUTO:
        raise StudyError(
            f"train.population must be true, false or auto (the default: one population per "
            f"point on a GPU when the model allows it), got {population!r}"
        )
    if population is True and command != "fit":
        raise StudyError("train.population trains models: it needs train.command: fit")
    problem = seed_axis_problem(grid, groups) if population is True else None
    if problem:
        raise StudyError(problem)


def seed_axis_problem(grid: Mapping[str, list[Any]], groups: Sequence[Sequence[str]]) -> str | None:
    """Why ``grid`` has no seed axis to train as populations (two or more integer seeds at each
    point of the other keys), as the study file's error says it; ``None`` if it has one.

    A seed zipped with other keys (a trial: several models' seeds zipped with one data seed, or
    disjoint pairs with a pair id) trains as one population per value of its zip partners: the
    seeds that share every other coordinate, as for a product grid."""
    seeds = grid.get(SEED_KEY, [])
    if len(seeds) < 2:
        return (
            f"train.population: true trains the seeds of train.grid.{SEED_KEY} as one "
            f"population, but the grid gives {len(seeds)} seed(s): add "
            f"{SEED_KEY}: [0, 1, ...] to train.grid or remove population"
        )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in seeds):
        return f"train.population: {SEED_KEY} values must be integers, got {seeds}"
    # a point of the other keys with one seed (only a zip makes one: a product grid gives every
    # point all of its two or more seeds)
    alone = [rest for rest, seeds in seed_groups(grid, groups).values() if len(seeds) < 2]
    if alone:
        zipped = [k for g in groups if SEED_KEY in g for k in g if k != SEED_KEY]
        return (
            f"train.population: {SEED_KEY} is zipped with {', '.join(zipped)}, and at {alone[0]} "
            f"it has one seed: a population trains the seeds that share every other coordinate "
            f"(e.g. a trial's models, which share its data seed), so each value of "
            f"{', '.join(zipped)} needs two or more seeds; repeat its values in the zip (one per "
            f"model) or remove population"
        )
    return None


def on_gpu(resolved_train: Mapping[str, Any]) -> bool:
    """Whether the train config's runs would train on a CUDA device here."""
    import torch

    accelerator = str((resolved_train.get("trainer") or {}).get("accelerator") or "auto").lower()
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def probe_population(args: list[str]) -> str | None:
    """Build ``lmc fit <args>`` as a population, with every check it makes before training
    (trainer options, task, data in memory, vectorisable network, optimizer, memory)."""
    from lmc.engine import build_cli

    try:
        build_cli(args, run=False)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - any refusal: the seeds as runs
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def resolve_population(
    study: Study,
    resolved_train: Mapping[str, Any],
    previous: Sequence[Mapping[str, Any]] | None = None,
    probe: Probe = probe_population,
) -> tuple[Study, str | None]:
    """``study`` with ``train.population`` decided, and the line that says what ``auto``
    chose and why (``None`` when the study file says ``true`` or ``false``).

    Args:
        resolved_train: the train stage's resolved base config (:func:`check_study`).
        previous: the jobs of the plan already in the study's folder, if any: their choice is
            kept (a population leader among them: population; else separate runs).
        probe: builds and checks one point's population (tests give their own).
    """
    train = study.train
    if train.population != AUTO:
        return study, None
    chosen, why = _choose(study, resolved_train, previous, probe)
    line = (
        f"train.population auto: {'one population per point' if chosen else 'one run per seed'}"
        f" ({why})"
    )
    return replace(study, train=replace(train, population=chosen)), line


def _choose(
    study: Study,
    resolved_train: Mapping[str, Any],
    previous: Sequence[Mapping[str, Any]] | None,
    probe: Probe,
) -> tuple[bool, str]:
    train = study.train
    if previous:
        kept = any(j.get("members") for j in previous if j.get("stage") == "train")
        return kept, "as the study's folder was planned"
    if train.command != "fit" or study.spawn:
        return False, "a population is for `fit` studies without spawn stages"
    if seed_axis_problem(train.grid, train.zip):
        return False, f"train.grid has no axis of two or more integer {SEED_KEY} values"
    if not on_gpu(resolved_train):
        return False, "the runs train on the CPU, where separate runs are as fast"
    base = config_args(train.configs, train.args)
    for rest, seeds in seed_groups(train.grid, train.zip).values():
        problem = probe([*base, *coord_args(rest), f"--population={json.dumps(list(seeds))}"])
        if problem:
            where = f" at {rest}" if rest else ""
            return False, f"the model cannot train as a population{where}: {problem}"
    return True, "a CUDA device, and every point's model trains as one population"
