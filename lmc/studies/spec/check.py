"""Check a study against its base configs by parsing them with the engine's own parser
(:mod:`lmc.engine.parse`: nothing instantiated, nothing run): every grid key must be a key of
the resolved base config, every grid value must parse, and so must every planned job's own
configuration."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmc.engine.parse import ConfigError
from lmc.engine.parse import resolve_config as _parse
from lmc.studies.running.plan import MEMBER
from lmc.studies.spec.keys import cli_value, config_args, has_key, near_keys
from lmc.studies.spec.schema import SEED_KEY, TRAIN_STAGE, Study, StudyError


def resolve_config(args: Sequence[str]) -> dict[str, Any]:
    """The resolved config of ``lmc <args>`` (:func:`lmc.engine.parse.resolve_config`).

    Raises:
        StudyError: the arguments do not parse; the message is the parser's.
    """
    try:
        return _parse(args)
    except ConfigError as err:
        raise StudyError(str(err)) from None


def check_names(resolved: Mapping[str, Any], where: str) -> None:
    """The registry names of a resolved config's task (``model.init_args``): a matcher, merge
    methods (as many that train as the task takes: ``trained_methods``), a barrier definition
    must be registered ones, and merge methods' options ones they take. The task checks the
    same when it is built; here it is checked before any job of the study runs.

    Raises:
        StudyError: an unknown name, naming the config field, ``where`` and the valid names.
    """
    from lmc.engine.moved import class_named
    from lmc.interpolation.barrier import check_definition
    from lmc.merging import check_options
    from lmc.merging.contract import check_methods
    from lmc.permutation.matchers import MATCHERS

    model = resolved.get("model")
    if not isinstance(model, Mapping):
        return
    init = model.get("init_args")
    if not isinstance(init, Mapping):
        return
    path = model.get("class_path") if isinstance(model, Mapping) else None
    trained = getattr(class_named(path if isinstance(path, str) else None), "trained_methods", None)
    checks = {
        "matcher": lambda v, f: MATCHERS.check(v, f),
        "methods": lambda v, f: check_methods(v, f, trained),
        "barrier": check_definition,
        # without `methods` only the options themselves are checked here (the task checks
        # them against its default methods when it is built)
        "method_options": lambda v, f: check_options(
            v, init.get("methods") or list(v), f, _known_spec(init)
        ),
    }
    _check_option_groups(model.get("class_path"), init, where)
    for key, check in checks.items():
        value = init.get(key)
        if value is None or (key == "methods" and not isinstance(value, list)):
            continue
        try:
            check(value, f"model.init_args.{key}")
        except ValueError as err:
            raise StudyError(f"{where}: {err}") from None


def _plain_class(entry: Any) -> tuple[Any, dict[str, Any]] | None:
    """A config entry ``{class_path, init_args}`` as its class and arguments, when the class
    imports and every argument is plain (no nested class to build), else ``None``."""
    from lmc.engine.moved import class_named

    if not isinstance(entry, Mapping) or not isinstance(entry.get("class_path"), str):
        return None
    args = dict(entry.get("init_args") or {})
    cls = class_named(entry["class_path"])
    if cls is None or any(isinstance(v, Mapping) for v in args.values()):
        return None
    return cls, args


def _check_option_groups(class_path: Any, init: Mapping[str, Any], where: str) -> None:
    """Build the task's option groups (its ``__init__`` arguments typed as option
    dataclasses, e.g. ``evaluation``) from the resolved config, so that their own checks
    (ranges, ``evaluation.tasks`` disjoint, ...) run when the study is planned: the parser
    reads the fields, the checks run when the task builds the group.

    Raises:
        StudyError: a group's refusal, naming the stage.
    """
    import dataclasses
    import typing

    from lmc.engine.moved import class_named
    from lmc.options import as_options

    cls: type[Any] | None = (
        class_named(class_path) if isinstance(class_path, str) and "." in class_path else None
    )
    try:
        hints = typing.get_type_hints(cls.__init__) if cls is not None else {}
    except Exception:  # noqa: BLE001 - a task we cannot inspect: checked when it is built
        return
    for key, hint in hints.items():
        kinds = [
            k
            for k in (typing.get_args(hint) or (hint,))
            if isinstance(k, type) and dataclasses.is_dataclass(k)
        ]
        value = init.get(key)
        if len(kinds) != 1 or not isinstance(value, Mapping):
            continue
        try:
            as_options(kinds[0], value)
        except (ValueError, TypeError) as err:
            text = str(err)
            text = text if text.startswith(f"{key}.") else f"{key}: {text}"
            raise StudyError(f"{where}: model.init_args.{text}") from None


def _known_spec(init: Mapping[str, Any]) -> Any:
    """The permutation spec of the task's ``net`` when it is known without data (a built-in
    network of plain arguments, built here on the CPU), else ``None``: what a merge method's
    options are checked against at plan time (e.g. ZipIt!'s ``zip_until``)."""
    from lmc.permutation.source import needs_example, resolve_spec

    plain, source = _plain_class(init.get("net")), init.get("spec") or "auto"
    if plain is None:
        return None
    try:
        model = plain[0](**plain[1])
        return None if needs_example(source, model) else resolve_spec(source, model)
    except Exception:  # noqa: BLE001 - not known before the job: its task checks when built
        return None


def _check_can_run(config: Mapping[str, Any], where: str, job: Any, runs_here: bool) -> None:
    """A population leader's trainer options and a captured step's needs, as the run would
    refuse them when it starts."""
    import torch

    from lmc.tasks.capture import planned_capture_problems

    if job.members:
        from lmc.population.checks import check_trainer

        try:
            check_trainer(config.get("trainer") or {}, config)
        except ValueError as err:
            raise StudyError(str(err)) from None
    problems = planned_capture_problems(config, torch.cuda.is_available() if runs_here else None)
    if problems:
        raise StudyError("; ".join(problems))


def _other_data(
    jobs: Sequence[Any],
    resolved: Mapping[str, Mapping[str, Any]],
    key_of: Mapping[str, tuple[Any, ...]],
    config_of: Mapping[tuple[Any, ...], Mapping[str, Any]],
) -> list[str]:
    """Evaluate jobs whose data differ from their input models' training data in what the
    models learned (:func:`lmc.data.base.data_differences`), one line each: a barrier on
    another teacher than the students learned gave numbers with exit status 0."""
    from lmc.data.base import data_differences

    found = []
    for job in jobs:
        if job.stage not in resolved or job.stage == TRAIN_STAGE or not job.inputs:
            continue
        config = config_of.get(key_of.get(job.id, ()))
        for source in job.inputs:
            trained = config_of.get(key_of.get(source, ()))
            if config is None or trained is None:
                continue
            for line in data_differences(trained.get("data"), config.get("data")):
                coords = {k: v for k, v in job.coordinates.items() if k != SEED_KEY}
                found.append(f"stage {job.stage!r} job {json.dumps(coords, default=str)}: {line}")
    return found


def check_data(config: Mapping[str, Any], where: str, *_: Any) -> None:
    """That a job's data module finds its dataset's files (where it has ``check_files``:
    MNIST, Fashion-MNIST, CIFAR read from ``data_dir`` or ``$LMC_DATA_DIR``): a wrong folder
    is refused when the study is planned instead of failing every job.

    Raises:
        StudyError: the data module's message (the folder searched, the files expected).
    """
    from lmc.data.formats import DatasetNotFoundError

    plain = _plain_class(config.get("data"))
    if plain is None or getattr(plain[0], "check_files", None) is None:
        return
    try:
        plain[0](**plain[1]).check_files()
    except DatasetNotFoundError as err:
        lines = str(err).splitlines()
        raise StudyError(f"{where}: {lines[0]} ({lines[-1]})") from None
    except Exception:  # noqa: BLE001 - other problems: the job's own error says them
        return


def _net_class(resolved: Mapping[str, Any]) -> str | None:
    model = resolved.get("model")
    init = model.get("init_args") if isinstance(model, Mapping) else None
    net = init.get("net") if isinstance(init, Mapping) else None
    path = net.get("class_path") if isinstance(net, Mapping) else None
    return path if isinstance(path, str) else None


def _check_same_net(train: Mapping[str, Any], stage: Mapping[str, Any], where: str) -> None:
    """An evaluate stage builds the network class the training jobs trained: another class
    would not load their checkpoints (known before any model trains)."""
    trained, built = _net_class(train), _net_class(stage)
    if trained and built and trained.rsplit(".", 1)[-1] != built.rsplit(".", 1)[-1]:
        raise StudyError(
            f"{where} builds a {built} (model.init_args.net of its config) but the training "
            f"jobs train a {trained}: their checkpoints would not load; give the stage's config "
            "the trained network"
        )


def check_study(study: Study) -> dict[str, dict[str, Any]]:
    """Check every grid key and value against the train base config and every evaluate base
    config on its own; return the resolved configs by stage (``train`` and each stage name).

    Raises:
        StudyError: a grid key that the base config lacks (naming the keys next to it), a grid
            value the parser refuses, or an evaluate config that does not parse.
    """
    train = study.train
    base = config_args(train.configs, train.args)
    resolved = {"train": resolve_config([train.command, *base])}
    check_names(resolved["train"], "train")
    grids = [("train", train.grid, base)]
    grids += [
        (f"spawn stage {s.name!r}", s.grid, config_args(train.configs, [*train.args, *s.args]))
        for s in study.spawn
    ]
    for where, grid, args in grids:
        _check_grid(
            where, grid, resolved["train"], [train.command, *args], "the base config", train.configs
        )
    max_epochs = (resolved["train"].get("trainer") or {}).get("max_epochs")
    for spawn in study.spawn:
        late = [e for e in spawn.at_epoch if max_epochs is not None and e >= max_epochs > 0]
        if late:
            raise StudyError(
                f"spawn stage {spawn.name!r}: at_epoch {late} is not before the end of "
                f"training (trainer.max_epochs={max_epochs}), so a child would not train"
            )
    for stage in study.evaluate:
        args = [stage.command, *config_args(stage.configs, stage.args)]
        resolved[stage.name] = resolve_config(args)
        where = f"evaluate stage {stage.name!r}"
        check_names(resolved[stage.name], where)
        _check_same_net(resolved["train"], resolved[stage.name], where)
        _check_grid(where, stage.grid, resolved[stage.name], args, "its config", stage.configs)
    return resolved


def produced_metrics(config: Mapping[str, Any], n_models: int | None = None) -> set[str] | None:
    """The metrics a job of the resolved ``config`` reports, when its task says so before it
    runs (a ``produces(init_args)`` class method, e.g. :class:`lmc.tasks.InterpolationTask`;
    names may be ``fnmatch`` patterns), else ``None`` (known once a job ran: the report
    checks the claims then). ``n_models``: the checkpoints the job is given, for a task whose
    ``produces`` takes it (a merge's default ``num_models``)."""
    import inspect

    from lmc.engine.moved import class_named

    model = config.get("model") or {}
    path = model.get("class_path") if isinstance(model, Mapping) else None
    if not isinstance(path, str) or "." not in path:
        return None
    produces = getattr(class_named(path), "produces", None)
    if produces is None:
        return None
    init_args = dict(model.get("init_args") or {})
    if "n_models" in inspect.signature(produces).parameters:
        return set(produces(init_args, n_models=n_models))
    return set(produces(init_args))


def _check_grid(
    where: str,
    grid: dict[str, list[Any]],
    resolved: dict[str, Any],
    args: list[str],
    what: str,
    configs: Sequence[Path],
) -> None:
    """Every key of ``grid`` is in ``resolved`` (the config ``args`` give) and every value of it
    parses on top of ``args``."""
    from lmc.engine.moved import moved_keys_error

    for key, values in grid.items():
        if not has_key(resolved, key):
            moved = moved_keys_error([*args[1:], f"--{key}={cli_value(values[0])}"])
            if moved:  # an old key of the task: name its new place, not "unknown"
                raise StudyError(f"{where} grid key {key!r}: {moved}")
            raise StudyError(
                f"{where} grid key {key!r} is not in {what} "
                f"{', '.join(str(p) for p in configs)}; {near_keys(resolved, key)}"
            )
        for value in values:
            try:
                check_names(resolve_config([*args, f"--{key}={cli_value(value)}"]), where)
            except StudyError as err:
                raise StudyError(
                    f"{where}.grid.{key}: the value {value!r} is refused: {err}"
                ) from err


NUM_MODELS_KEY = "model.init_args.num_models"
#: how often a large plan's checks say how far they are
PROGRESS_SECONDS = 10.0
#: the one option a job's seed sets; it changes no other option, so configs differing only in
#: it parse alike
SEED_ARG = f"--{SEED_KEY}="


def check_job_configs(
    jobs: Sequence[Any],
    resolved: Mapping[str, Mapping[str, Any]],
    progress: Any = None,
    runs_here: bool = True,
) -> dict[str, set[str] | None]:
    """Each planned job's own configuration (its stage's configs and args with its grid point,
    as the job will run it, less the folders it is given at run time) parsed by the CLI's
    parser, with its registry names and, for an evaluate job, its network class checked:
    values that each parse on the base config may not go together (an optimizer class from one
    grid key, an option of another class from a second). A configuration shared by many jobs
    (they differ in the seed alone) is parsed once. All errors are listed at once.

    Returns, per stage, the metrics its jobs will report (:func:`produced_metrics` of each
    job's own configuration, together), or ``None`` where a job's task does not say.
    ``progress``: gets a line every :data:`PROGRESS_SECONDS` (jobs checked so far, of all).
    ``runs_here``: the jobs train on this machine (its devices decide what can run), not on
    a cluster's.

    Also checked: a population leader's trainer options (:func:`lmc.population.checks.
    check_trainer`) and what keeps a captured step from running
    (:func:`lmc.tasks.capture.planned_capture_problems`).

    Raises:
        StudyError: one line per failing configuration, naming the stage and the job's
            coordinates (seeds left out), then the parser's or the check's message.
    """
    errors: list[str] = []
    missing_data: list[str] = []
    cannot_run: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    key_of: dict[str, tuple[Any, ...]] = {}
    config_of: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    produced: dict[str, set[str] | None] = {}
    import time

    shown = time.monotonic()
    for done, job in enumerate(jobs):
        if progress is not None and time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            progress(f"checked {done}/{len(jobs)} jobs ({len(seen)} distinct configurations)")
        if job.command == MEMBER:  # a population member: its leader's configuration runs
            if job.inputs and job.inputs[0] in key_of:
                key_of[job.id] = key_of[job.inputs[0]]
            continue
        args = tuple(a for a in job.args if not a.startswith(SEED_ARG))  # the command first
        key_of[job.id] = (args, len(job.inputs))
        if key_of[job.id] in seen:
            continue
        seen.add(key_of[job.id])
        coords = {k: v for k, v in job.coordinates.items() if k != SEED_KEY}
        where = f"stage {job.stage!r} job {json.dumps(coords, default=str)}"
        try:
            config = config_of[key_of[job.id]] = resolve_config(args)
            check_names(config, where)
            if job.stage in resolved and job.stage != TRAIN_STAGE:  # an evaluate stage
                _check_same_net(resolved["train"], config, where)
            for check, found in ((check_data, missing_data), (_check_can_run, cannot_run)):
                try:
                    check(config, where, job, runs_here)
                except StudyError as err:
                    text = str(err)
                    found.append(text if text.startswith(where) else f"{where}: {text}")
            names = produced_metrics(config, len(job.inputs) or None)
            known = produced.get(job.stage, set())
            produced[job.stage] = None if names is None or known is None else known | names
        except StudyError as err:
            text = str(err)
            errors.append(text if text.startswith(where) else f"{where}: {text}")
    if errors:
        raise StudyError(
            f"{len(errors)} planned job configuration(s) do not hold together (each grid value "
            "parsed on its own; give values that go together, or split the grid):\n  "
            + "\n  ".join(errors)
        )
    other_data = _other_data(jobs, resolved, key_of, config_of)
    for found, what in (
        (missing_data, "would not find their dataset"),
        (cannot_run, "cannot run as planned"),
        (
            other_data,
            "read other data than their models were trained on (give the stage the "
            "train stage's data options, e.g. in both stages' args)",
        ),
    ):
        if found:
            raise StudyError(
                f"{len(found)} planned job configuration(s) {what}:\n  "
                + "\n  ".join(dict.fromkeys(found))
            )
    return produced


def check_jobs(jobs: Sequence[Any], resolved: Mapping[str, Mapping[str, Any]]) -> None:
    """What the planned jobs can be checked for before any runs: a merge job's ``num_models``
    within [2, the models its group selects]. All such errors are listed at once.

    Raises:
        StudyError: naming each stage, the job's coordinates and the fix.
    """
    errors = []
    for job in jobs:
        if not job.inputs or job.stage not in resolved:
            continue
        init = (resolved[job.stage].get("model") or {}).get("init_args") or {}
        if NUM_MODELS_KEY in job.coordinates:
            ns = job.coordinates[NUM_MODELS_KEY]
        elif "num_models" in init:  # a merge: all of its models by default
            ns = init.get("num_models") or [len(job.inputs)]
        else:
            continue
        ns = ns if isinstance(ns, list) else [ns]
        bad = [n for n in ns if not isinstance(n, int) or not 2 <= n <= len(job.inputs)]
        reference = job.coordinates.get("model.init_args.reference", init.get("reference"))
        smallest = min((n for n in ns if isinstance(n, int)), default=None)
        if isinstance(reference, int) and smallest and not bad and not 0 <= reference < smallest:
            errors.append(
                f"evaluate stage {job.stage!r} {job.coordinates}: reference={reference} must "
                f"index one of the first {smallest} models (the smallest merge, num_models "
                f"{ns}); give a reference in [0, {smallest - 1}]"
            )
        if bad:
            errors.append(
                f"evaluate stage {job.stage!r} {job.coordinates}: num_models {bad} must lie in "
                f"[2, {len(job.inputs)}] (the models its group selects); lower num_models or "
                "select more models (more values of the group's `vary` key)"
            )
    if errors:
        raise StudyError("; ".join(dict.fromkeys(errors)))
