"""Reading a study file (:func:`load_study`): its YAML checked key by key into the dataclasses of
:mod:`lmc.studies.spec.schema` (whose docstring shows the layout), so a wrong key or type stops the
study before any job runs; the figures and claims are parsed by their own modules."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from lmc.studies.running.auto_population import check_population
from lmc.studies.spec.schema import (
    ARCHITECTURE_PREFIXES,
    AUTO,
    BARRIER_ARG,
    CONSECUTIVE,
    EVALUATE_COMMANDS,
    EVALUATE_KINDS,
    NAME_PATTERN,
    PARENT_PREFIX,
    SPAWN_EPOCH,
    TRAIN_COMMANDS,
    TRAIN_STAGE,
    EvaluateStage,
    Executor,
    Groups,
    Pairs,
    SpawnStage,
    Study,
    StudyError,
    TrainStage,
)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StudyError(f"{where} must be a mapping, got {type(value).__name__}: {value!r}")
    return value


def _check_keys(
    value: Mapping[str, Any], where: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    valid = (*required, *optional)
    for key in value:
        if key not in valid:
            raise StudyError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}")
    for key in required:
        if key not in value:
            raise StudyError(f"{where} needs the key {key!r} (valid keys: {', '.join(valid)})")


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StudyError(f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def _configs(value: Any, where: str, base: Path) -> tuple[Path, ...]:
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise StudyError(
            f"{where} must be a config path or a non-empty list of them, got {value!r}"
        )
    resolved = tuple((base / p).resolve() for p in paths)
    for given, path in zip(paths, resolved):
        if not path.is_file():
            raise StudyError(
                f"{where}: {given} not found (looked at {path}; paths are relative "
                "to the study file)"
            )
    return resolved


def _grid(value: Mapping[str, Any], where: str) -> tuple[dict[str, list[Any]], tuple]:
    """``where.grid`` and ``where.zip`` of a training stage, checked."""
    grid_in = _mapping(value["grid"], f"{where}.grid")
    if not grid_in:
        raise StudyError(f"{where}.grid is empty: give at least one key with a list of values")
    grid: dict[str, list[Any]] = {}
    for key, values in grid_in.items():
        if not isinstance(key, str) or not key:
            raise StudyError(f"{where}.grid key {key!r} must be a dotted config key")
        if not isinstance(values, list):
            raise StudyError(f"{where}.grid.{key} must be a list of values, got {values!r}")
        if not values:
            raise StudyError(f"{where}.grid.{key} is an empty list: give at least one value")
        grid[key] = list(values)
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for i, group in enumerate(value.get("zip") or []):
        at = f"{where}.zip[{i}]"
        keys = _str_list(group, at)
        if len(keys) < 2:
            raise StudyError(f"{at} must name two or more grid keys, got {group!r}")
        for key in keys:
            if key not in grid:
                raise StudyError(
                    f"{at} names {key!r}, not a {where}.grid key; grid keys: {', '.join(grid)}"
                )
            if key in seen:
                raise StudyError(f"{at}: {key!r} is already in another zip group")
            seen.add(key)
        lengths = {k: len(grid[k]) for k in keys}
        if len(set(lengths.values())) != 1:
            raise StudyError(f"{at}: zipped keys need lists of one length, got {lengths}")
        groups.append(keys)
    axes = [[tuple(grid[k][i] for k in g) for i in range(len(grid[g[0]]))] for g in groups]
    axes += [[(v,) for v in grid[k]] for k in grid if k not in seen]
    for axis, key in zip(
        axes, [*(", ".join(g) for g in groups), *(k for k in grid if k not in seen)]
    ):
        if len({repr(v) for v in axis}) != len(axis):
            raise StudyError(f"{where}.grid: {key} repeats a value (zipped keys: a combination)")
    return grid, tuple(groups)


def _train(value: Any, base: Path) -> TrainStage:
    value = _mapping(value, "train")
    _check_keys(value, "train", ("config", "grid"), ("zip", "args", "population", "command"))
    grid, groups = _grid(value, "train")
    population = value.get("population", AUTO)
    command = value.get("command", "fit")
    if command not in TRAIN_COMMANDS:
        raise StudyError(
            f"train.command {command!r}: valid commands: {', '.join(TRAIN_COMMANDS)} (validate: "
            "jobs that measure on their own, such as a FedMA run)"
        )
    check_population(population, command, grid, groups)
    return TrainStage(
        configs=_configs(value["config"], "train.config", base),
        grid=grid,
        zip=groups,
        args=_str_list(value.get("args"), "train.args"),
        population=population,
        command=command,
    )


def _spawn(value: Any, i: int, train: TrainStage, taken: set[str]) -> SpawnStage:
    where = f"spawn[{i}]"
    value = _mapping(value, where)
    _check_keys(value, where, ("name", "at_epoch", "grid"), ("zip", "args"))
    name = _stage_name(value["name"], f"{where}.name", taken)
    where = f"spawn stage {name!r}"
    epochs = value["at_epoch"]
    if (
        not isinstance(epochs, list)
        or not epochs
        or any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in epochs)
        or len(set(epochs)) != len(epochs)
    ):
        raise StudyError(
            f"{where}.at_epoch must list distinct whole numbers of epochs >= 0 (0: before "
            f"training), got {epochs!r}"
        )
    grid, groups = _grid(value, where)
    if SPAWN_EPOCH in grid:
        raise StudyError(f"{where}.grid: {SPAWN_EPOCH!r} is the spawn epoch; set it by at_epoch")
    return SpawnStage(
        name=name,
        at_epoch=tuple(epochs),
        grid=grid,
        zip=groups,
        args=_str_list(value.get("args"), f"{where}.args"),
        parent_grid=train.grid,
        parent_zip=train.zip,
    )


def _stage_name(name: Any, where: str, taken: set[str]) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or name == TRAIN_STAGE:
        raise StudyError(
            f"{where} must be a folder-safe name other than "
            f"{TRAIN_STAGE!r} (letters, digits, _ . -), got {name!r}"
        )
    if name in taken:
        raise StudyError(f"{where}: stage names must be unique, {name!r} is used twice")
    taken.add(name)
    return name


@dataclass(frozen=True)
class _Source:
    """The training stage an evaluate stage selects from: its coordinates and zip groups."""

    name: str
    keys: dict[str, list[Any]]
    zip: tuple[tuple[str, ...], ...]

    @property
    def what(self) -> str:
        return "a train.grid key" if self.name == TRAIN_STAGE else f"a key of {self.name!r}"

    @property
    def job(self) -> str:
        return "training job" if self.name == TRAIN_STAGE else f"job of stage {self.name!r}"


def _misspelt(a: str, b: str) -> bool:
    """Whether dotted keys ``a`` and ``b`` differ only by a likely typo in their last part."""
    (pa, _, la), (pb, _, lb) = a.rpartition("."), b.rpartition(".")
    return a != b and pa == pb and difflib.SequenceMatcher(None, la, lb).ratio() >= 0.8


def _selection_keys(
    select: Mapping[str, Any], where: str, source: _Source
) -> tuple[tuple[str, ...], str]:
    over = _str_list(select.get("over"), f"{where}.over")
    vary = select["vary"]
    for key in (*over, vary):
        if key not in source.keys:
            close = [k for k in source.keys if _misspelt(k, key)]
            if close and source.name == TRAIN_STAGE:  # the typo is in the grid, not here
                raise StudyError(
                    f"train.grid key {close[0]!r} looks misspelt: {where} names {key!r}; "
                    f"fix the grid key (or the selection, if the grid is right)"
                )
            raise StudyError(
                f"{where} names {key!r}, not {source.what}; its keys: {', '.join(source.keys)}"
            )
    if vary in over:
        raise StudyError(f"{where}: {vary!r} cannot be both `vary` and in `over`")
    zipped = next((g for g in source.zip if vary in g), (vary,))
    for key in source.keys:
        # a key zipped with `vary` varies with it (e.g. a task's classes with its seed)
        if key not in zipped and key not in over:
            raise StudyError(
                f"{where}: key {key!r} of {source.name!r} is neither in `over` nor `vary`; "
                "add it to `over` (the selected models must agree on it)"
            )
    for key in zipped:
        bare = key[len(PARENT_PREFIX) :] if key.startswith(PARENT_PREFIX) else key
        if any(bare == p or bare.startswith(p + ".") for p in ARCHITECTURE_PREFIXES):
            fix = (
                "Put it in `over` and vary a seed instead"
                if key == vary
                else f"It is zipped with {vary!r} (the zip of {source.name!r}), so it varies "
                f"with it{' even though it is in `over`' if key in over else ''}: take it out "
                f"of that zip, or vary a key not zipped with it"
            )
            raise StudyError(
                f"{where} selects models that differ in {key!r}, a key of the network: their "
                f"weights cannot be aligned or merged. {fix}"
            )
    if len(source.keys[vary]) < 2:
        raise StudyError(f"{where}: {vary!r} has one value, so there is nothing to select")
    return over, vary


def _pairs(value: Any, where: str, source: _Source) -> Pairs:
    pairs = _mapping(value, where)
    _check_keys(pairs, where, ("vary",), ("over", "reference"))
    over, vary = _selection_keys(pairs, where, source)
    # by default the pairs are disjoint (independent replicates); a shared reference is asked
    # for by name, and then only the disjoint pairs count in a claim (lmc.studies.claims.verdicts)
    reference = pairs.get("reference", CONSECUTIVE)
    if reference == CONSECUTIVE:
        values = list(source.keys[vary])
        if len(values) % 2:
            raise StudyError(
                f"{where}.reference: consecutive pairs {vary}'s values two by two (0-1, 2-3, "
                f"...), but it has an odd number of them ({len(values)}): {values!r}"
            )
        partners = tuple(zip(values[0::2], values[1::2]))
        return Pairs(over=over, vary=vary, reference=tuple(values[0::2]), partners=partners)
    refs = reference if isinstance(reference, list) else [reference]
    if not refs:
        raise StudyError(f"{where}.reference is an empty list: give a value of {vary!r}")
    for ref in refs:
        if ref not in source.keys[vary]:
            raise StudyError(
                f"{where}.reference {ref!r}: no {source.job} has "
                f"{vary}={ref!r}; its values: {source.keys[vary]!r}"
            )
    if isinstance(reference, list):
        if len(set(map(repr, refs))) != len(refs):
            raise StudyError(f"{where}.reference {reference!r} lists a value twice")
        reference = tuple(reference)
    return Pairs(over=over, vary=vary, reference=reference)


def _groups(value: Any, where: str, source: _Source) -> Groups:
    groups = _mapping(value, where)
    _check_keys(groups, where, ("vary",), ("over", "values"))
    over, vary = _selection_keys(groups, where, source)
    values = groups.get("values")
    if values is not None:
        if not isinstance(values, list) or len(values) < 2:
            raise StudyError(
                f"{where}.values must list two or more values of {vary}, got {values!r}"
            )
        for v in values:
            if v not in source.keys[vary]:
                raise StudyError(
                    f"{where}.values: no {source.job} has {vary}={v!r}; its values: "
                    f"{source.keys[vary]!r}"
                )
        if len({repr(v) for v in values}) != len(values):
            raise StudyError(f"{where}.values repeats a value: {values!r}")
        values = tuple(values)
    return Groups(over=over, vary=vary, values=values)


def _evaluate(
    value: Any,
    i: int,
    base: Path,
    sources: dict[str, _Source],
    taken: set[str],
    barrier: str | None = None,
) -> EvaluateStage:
    where = f"evaluate[{i}]"
    value = _mapping(value, where)
    _check_keys(
        value,
        where,
        ("name", "kind", "config"),
        ("pairs", "groups", "args", "stage", "command", "grid", "zip"),
    )
    name = _stage_name(value["name"], f"{where}.name", taken)
    where = f"evaluate stage {name!r}"
    kind = value["kind"]
    if kind not in EVALUATE_KINDS:
        raise StudyError(
            f"{where}: unknown kind {kind!r}; valid kinds: {', '.join(EVALUATE_KINDS)}"
        )
    selector = EVALUATE_KINDS[kind].selects
    other = "groups" if selector == "pairs" else "pairs"
    if other in value:
        raise StudyError(
            f"{where}: a {kind} stage selects its models with `{selector}`, not `{other}`"
        )
    if selector not in value:
        raise StudyError(f"{where} needs `{selector}` (which trained models it evaluates)")
    stage = value.get("stage", TRAIN_STAGE)
    if stage not in sources:
        raise StudyError(
            f"{where}.stage {stage!r} is no training stage; training stages: {', '.join(sources)}"
        )
    command = value.get("command", "validate")
    if command not in EVALUATE_COMMANDS:
        raise StudyError(
            f"{where}.command {command!r}: valid commands: {', '.join(EVALUATE_COMMANDS)}"
        )
    select: Pairs | Groups
    pairs: Pairs | None = None
    by_group: Groups | None = None
    if selector == "pairs":
        select = pairs = _pairs(value[selector], f"{where}.{selector}", sources[stage])
    else:
        select = by_group = _groups(value[selector], f"{where}.{selector}", sources[stage])
    grid: dict[str, list[Any]] = {}
    groups: tuple = ()
    if "grid" in value:
        grid, groups = _grid(value, where)
        clash = [k for k in grid if k in (*select.over, select.vary)]
        if clash:
            raise StudyError(
                f"{where}.grid: {clash} already come from the selected models "
                f"(`{selector}`); a stage grid varies keys of the stage's own config"
            )
    elif "zip" in value:
        raise StudyError(f"{where}: zip needs a grid (keys of the stage config) to zip")
    args = _str_list(value.get("args"), f"{where}.args")
    if barrier is not None and EVALUATE_KINDS[kind].takes_barrier:
        if any(a.startswith(f"{BARRIER_ARG}=") for a in args):
            raise StudyError(
                f"{where}.args sets {BARRIER_ARG}, which the study's `barrier: {barrier}` sets "
                "for every barrier stage: remove one of them"
            )
        args = (*args, f"{BARRIER_ARG}={barrier}")
    return EvaluateStage(
        name=name,
        kind=kind,
        configs=_configs(value["config"], f"{where}.config", base),
        pairs=pairs,
        groups=by_group,
        args=args,
        stage=stage,
        command=command,
        grid=grid,
        zip=groups,
    )


def _executor(value: Any) -> Executor:
    if value is None:
        return Executor()
    value = _mapping(value, "executor")
    _check_keys(value, "executor", (), ("workers", "submitit"))
    workers = value.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise StudyError(f"executor.workers must be a whole number >= 1, got {workers!r}")
    options = dict(_mapping(value.get("submitit") or {}, "executor.submitit"))
    return Executor(workers=workers, submitit=options)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the
    last silently, so a study file's first ``grid:`` or ``args:`` would be dropped)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # left to the loader's own error
            if key in seen:
                raise StudyError(
                    f"the key {key!r} is given twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); YAML would keep only the last: merge them "
                    "into one"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_study(path: str | Path, added: Mapping[str, list[Any]] | None = None) -> Study:
    """Read and check the study file at ``path`` (structure, keys, types, pairs; the grid keys
    against the base configs are checked by :func:`lmc.studies.spec.check.check_study`); ``added``:
    values appended to train grid keys (the second stage of ``replicates: auto``).

    Raises:
        StudyError: the file is missing, not YAML, or has a wrong key, type or value.
    """
    path = Path(path).resolve()
    if path.is_dir():
        copy = path / "study.yaml"
        hint = f" (a study folder: its copy of the study file is {copy})" if copy.is_file() else ""
        raise StudyError(f"{path} is a folder: give the study file (a .yaml){hint}")
    if not path.is_file():
        raise StudyError(f"study file not found: {path}")
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except StudyError as err:
        raise StudyError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise StudyError(f"{path} is not valid YAML: {err}") from None
    data = _mapping(data, f"the study file {path}")
    _check_keys(
        data,
        "the study file",
        ("name", "train"),
        ("spawn", "evaluate", "executor", "figures", "barrier", "claims", "replicates"),
    )
    pilot_grid = (
        dict((data.get("train") or {}).get("grid") or {})
        if isinstance(data.get("train"), Mapping)
        else {}
    )
    if added:
        data = {**data, "train": {**data["train"], "grid": dict(data["train"]["grid"])}}
        for key, values in added.items():
            data["train"]["grid"][key] = [*data["train"]["grid"][key], *values]
    name = data["name"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise StudyError(
            f"name must be a folder-safe string (letters, digits, _ . -), got {name!r}"
        )
    train = _train(data["train"], path.parent)
    taken: set[str] = set()
    spawned = data.get("spawn") or []
    if not isinstance(spawned, list):
        raise StudyError(f"spawn must be a list of stages, got {spawned!r}")
    spawn = tuple(_spawn(s, i, train, taken) for i, s in enumerate(spawned))
    if spawn and train.population is True:
        raise StudyError(
            "train.population cannot be combined with spawn stages (a population writes its "
            "members once trained, not at spawn epochs): remove population or the spawn stages"
        )
    if train.command != "fit" and (spawned or data.get("evaluate")):
        raise StudyError(
            f"train.command: {train.command} jobs leave no trained model, so spawn and evaluate "
            "stages have nothing to select: remove them, or use train.command: fit"
        )
    sources = {TRAIN_STAGE: _Source(TRAIN_STAGE, train.grid, train.zip)}
    sources.update({s.name: _Source(s.name, s.keys, s.zipped) for s in spawn})
    stages = data.get("evaluate") or []
    if not isinstance(stages, list):
        raise StudyError(f"evaluate must be a list of stages, got {stages!r}")
    barrier = _barrier(data.get("barrier"), stages)
    evaluate = tuple(
        _evaluate(s, i, path.parent, sources, taken, barrier) for i, s in enumerate(stages)
    )
    study = Study(
        name=name,
        train=train,
        evaluate=evaluate,
        path=path,
        text=text,
        executor=_executor(data.get("executor")),
        spawn=spawn,
        barrier=barrier,
    )
    if data.get("figures"):
        from lmc.studies.reporting.figure_spec import parse_figures

        study = replace(study, figures=parse_figures(data["figures"], study.stage_keys()))
    if data.get("claims") is not None:
        from lmc.studies.claims.declared import parse_claims

        study = replace(study, claims=parse_claims(data["claims"], study))
    if data.get("replicates") is not None:
        from lmc.studies.running.replicates import parse_replicates

        study = replace(study, replicates=parse_replicates(data["replicates"], study, pilot_grid))
    return study


def _barrier(value: Any, stages: Any) -> str | None:
    """The study's ``barrier:`` definition, checked (``None`` when it has none)."""
    if value is None:
        return None
    from lmc.interpolation.barrier import BARRIER_DEFINITIONS

    if value not in BARRIER_DEFINITIONS:
        names = "; ".join(f"{k} = {v}" for k, v in BARRIER_DEFINITIONS.items())
        raise StudyError(f"barrier: unknown barrier definition {value!r}; use one of: {names}")
    if isinstance(stages, list) and not any(
        isinstance(s, Mapping) and s.get("kind") == "barrier" for s in stages
    ):
        raise StudyError(
            f"barrier: {value} sets the definition of the barrier stages, but the study has "
            "no evaluate stage of kind barrier: remove it"
        )
    return value
