"""The study file: a grid of ``lmc fit`` trainings and evaluation stages over them, as the
dataclasses here; :func:`lmc.studies.spec.load.load_study` reads a file into them, checked key by key,
so a wrong key or type stops the study before any job runs.

Layout (paths relative to the study file)::

    name: width
    train:
      config: ../synthetic/teacher_student.yaml     # or a list: base config, then overlays
      grid: {model.init_args.net.init_args.width: [4, 8], seed_everything: [0, 1]}
      zip: [[key_a, key_b]]                         # optional: varied together, not crossed
      args: [--trainer.max_epochs=5]                # optional: extra CLI args of every job
      population: auto                              # optional: the seed_everything values of
                                                    # each point as one `lmc fit --population`:
                                                    # true, false, or auto (default: on a GPU
                                                    # when the model allows it)
      command: fit                                  # optional; validate: jobs that measure
                                                    # (a FedMA run trains its own clients)
    evaluate:
      - name: barrier
        kind: barrier
        config: teacher_student_barrier.yaml        # an ``lmc validate`` config
        pairs: {over: [model.init_args.net.init_args.width], vary: seed_everything}  # disjoint: 0-1, 2-3
        args: []
      - name: merge
        kind: merge                                 # barrier | curve: pairs; merge: groups
        config: merge.yaml
        command: validate                           # optional; fit: a task trained from them
        groups: {over: [model.init_args.net.init_args.width], vary: seed_everything}
        grid: {model.init_args.otfusion.prune_rate: [0.0, 0.5]}   # optional: every selection evaluated
        zip: []                                         # at each point of the stage's own grid
    barrier: abs_chord                              # optional: the barrier definition of every
                                                    # barrier stage (chord | abs_chord), passed
                                                    # as --model.init_args.barrier
    claims: [...]                                   # optional: the paper's claims, evaluated by
                                                    # the report (lmc.studies.claims.declared)
    replicates: {auto: true, budget: 40}            # optional: the grid's seeds are a pilot; then
                                                    # the seeds the claims need (lmc.studies.running.replicates)
    figures:                                        # optional: the report's figures
      - {name: barrier_vs_width, kind: line, stage: barrier,
         x: model.init_args.net.init_args.width, y: [barrier_loss_matched, barrier_loss_naive]}
    executor:                                       # optional
      workers: 2                                    # default of --workers
      submitit: {slurm_partition: gpu, timeout_min: 60, gpus_per_node: 1}

Every evaluate job sets ``model.init_args.checkpoints`` of its ``lmc validate`` config to the
run folders of the models it selects: a pair (``pairs``) or a group (``groups``: every model at
the ``values`` of ``vary``, default all, in that order) of models that agree on every ``over``
key. Pairs are by default (and with ``reference: consecutive``) disjoint pairs of consecutive
values of ``vary``, 0-1, 2-3, ..., independent replicates with no pair id, so the seeds of a
point can still train as one population. ``reference: 0`` pairs the model at ``vary == 0`` with
every other one (the pairs then share that model, and a claim counts only the disjoint ones);
``reference`` may be a list, e.g. ``[0, 2, 4]`` with the pairs' id in ``over``, for independent
pairs: each reference is paired with every model of its group that is not one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

TRAIN_STAGE = "train"
#: ``train.population: auto`` (the default): decided before planning
AUTO = "auto"


@dataclass(frozen=True)
class StageKind:
    """A kind of evaluate stage, in one place: how it selects its models and how its task
    names what it logs.

    Attributes:
        name: the study file's ``kind``.
        selects: ``pairs`` (two models at a time) or ``groups`` (any number).
        prefix: the prefix its task logs its summary under (``{prefix}/{key}``), used by the
            W&B Report until a done job's run record says which it used.
        takes_barrier: a study's ``barrier:`` definition is passed to its stages of this kind.
    """

    name: str
    selects: str
    prefix: str
    takes_barrier: bool = False


#: kind -> :class:`StageKind` (log_study, log_curve and log_merge of lmc.tasks log these)
EVALUATE_KINDS: dict[str, StageKind] = {
    k.name: k
    for k in (
        StageKind("barrier", "pairs", "interp", takes_barrier=True),
        StageKind("curve", "pairs", "curve"),
        StageKind("merge", "groups", "merge"),
    )
}
# the lmc command an evaluate job runs: validate (measure) or fit (train from the checkpoints)
EVALUATE_COMMANDS = ("validate", "fit")
# the lmc command a train job runs: fit (train a model) or validate (a task that measures alone)
TRAIN_COMMANDS = ("fit", "validate")
# config keys of the network: models that differ in one cannot be aligned or merged
ARCHITECTURE_PREFIXES = ("model.init_args.net",)
#: a stage's (or a study's) name
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# the argument by which a study's `barrier:` reaches its barrier stages (InterpolationTask)
BARRIER_ARG = "--model.init_args.barrier"


class StudyError(ValueError):
    """The study file (or the study folder) cannot be used; the message says what to change."""


Coordinates = Mapping[str, Any]


def _same_over(over: tuple[str, ...], coords: Coordinates) -> tuple[str, ...]:
    return tuple(repr(coords[k]) for k in over)


@dataclass(frozen=True)
class Pairs:
    """Pairs of trained models: equal on every ``over`` key, one at ``vary == reference``
    (a value, or a tuple of values: each is paired with the models at none of them)."""

    #: one selection, in messages
    noun: ClassVar[str] = "pair"

    over: tuple[str, ...]
    vary: str
    reference: Any
    #: ``reference: consecutive``: each reference value with its only partner, the next value
    #: of ``vary`` (disjoint pairs 0-1, 2-3, ... as 000 A.1.1 pairs models i and i + 1)
    partners: tuple[tuple[Any, Any], ...] = ()

    def is_reference(self, value: Any) -> bool:
        """Whether a model at ``vary == value`` is a reference."""
        refs = self.reference if isinstance(self.reference, tuple) else (self.reference,)
        return value in refs

    def pairs_with(self, ref: Any, value: Any) -> bool:
        """Whether the model at ``vary == value`` is paired with the reference at ``ref``."""
        if self.partners:
            return any(r == ref and v == value for r, v in self.partners)
        return not self.is_reference(value)

    def select(self, models: Sequence[Coordinates]) -> list[list[int]]:
        """The indices into ``models`` (their coordinates) of every pair: the reference, then
        its partner."""
        key = _same_over
        return [
            [i, j]
            for i, ref in enumerate(models)
            if self.is_reference(ref[self.vary])
            for j, other in enumerate(models)
            if key(self.over, other) == key(self.over, ref)
            and self.pairs_with(ref[self.vary], other[self.vary])
        ]

    def coordinate(self, values: list[Any]) -> Any:
        """A selection's ``vary`` coordinate: the partner's value."""
        return values[1]


@dataclass(frozen=True)
class Groups:
    """Groups of trained models: equal on every ``over`` key, one per value of ``vary`` in
    ``values`` (all of them when ``None``), in that order."""

    noun: ClassVar[str] = "group of two or more"

    over: tuple[str, ...]
    vary: str
    values: tuple[Any, ...] | None = None

    def select(self, models: Sequence[Coordinates]) -> list[list[int]]:
        """The indices into ``models`` of every group of two or more, one model per selected
        value of ``vary``, in the order of ``values`` (else the models')."""
        order = list(self.values) if self.values is not None else None
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, coords in enumerate(models):
            if order is None or coords[self.vary] in order:
                groups.setdefault(_same_over(self.over, coords), []).append(i)
        if order is not None:
            for members in groups.values():
                members.sort(key=lambda i: order.index(models[i][self.vary]))
        return [members for members in groups.values() if len(members) >= 2]

    def coordinate(self, values: list[Any]) -> Any:
        """A selection's ``vary`` coordinate: the list of its models' values."""
        return values


@dataclass(frozen=True)
class EvaluateStage:
    name: str
    kind: str
    configs: tuple[Path, ...]
    pairs: Pairs | None = None
    args: tuple[str, ...] = ()
    groups: Groups | None = None
    #: the training stage whose models it selects
    stage: str = TRAIN_STAGE
    #: ``validate`` (measure the selected models) or ``fit`` (train from them: a curve, an
    #: STE-MM search)
    command: str = "validate"
    #: keys of the stage's own config, each selection evaluated at every point (e.g. a fusion
    #: at several pruning rates); ``zip`` as the train grid's
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: tuple[tuple[str, ...], ...] = ()

    @property
    def select(self) -> Pairs | Groups:
        if self.pairs is not None:
            return self.pairs
        assert self.groups is not None  # load_study sets one of pairs, groups
        return self.groups


@dataclass(frozen=True)
class Executor:
    """How jobs run when the command line does not say: ``workers`` local worker processes,
    and the submitit options (``cluster`` plus any ``update_parameters`` keyword: partition,
    timeout, GPUs per job, array parallelism) for ``--executor submitit``."""

    workers: int = 1
    submitit: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainStage:
    configs: tuple[Path, ...]
    grid: dict[str, list[Any]]
    zip: tuple[tuple[str, ...], ...] = ()
    args: tuple[str, ...] = ()
    #: train the seeds of each point of the other keys as one ``lmc fit --population`` run:
    #: ``True``, ``False`` or :data:`AUTO` (decided before planning: ``lmc.studies.running.auto_population``)
    population: bool | str = AUTO
    #: ``fit`` (train: the models the other stages select) or ``validate`` (each job measures
    #: on its own and leaves no model to select, e.g. FedMA, which trains its own clients)
    command: str = "fit"


SEED_KEY = "seed_everything"
#: ``pairs.reference: consecutive``: disjoint pairs of consecutive values of ``vary``
CONSECUTIVE = "consecutive"
SPAWN_EPOCH = "spawn_epoch"
PARENT_PREFIX = "parent:"


@dataclass(frozen=True)
class SpawnStage:
    """Trainings that start from each train job's checkpoint after each of ``at_epoch`` epochs
    and go on with their own ``grid`` values (e.g. another ``seed_everything``: another data
    order). A child's coordinates: its parent's (a key the spawn grid sets again is renamed
    ``parent:<key>``), ``spawn_epoch``, then its own grid's."""

    name: str
    at_epoch: tuple[int, ...]
    grid: dict[str, list[Any]]
    zip: tuple[tuple[str, ...], ...] = ()
    args: tuple[str, ...] = ()
    parent_grid: dict[str, list[Any]] = field(default_factory=dict)
    parent_zip: tuple[tuple[str, ...], ...] = ()

    def parent_key(self, key: str) -> str:
        """The name of the parent's coordinate ``key`` among the children's coordinates."""
        return PARENT_PREFIX + key if key in self.grid else key

    @property
    def keys(self) -> dict[str, list[Any]]:
        """Every coordinate of a child, with the values it takes."""
        keys = {self.parent_key(k): v for k, v in self.parent_grid.items()}
        keys[SPAWN_EPOCH] = list(self.at_epoch)
        return {**keys, **self.grid}

    @property
    def zipped(self) -> tuple[tuple[str, ...], ...]:
        parent = tuple(tuple(self.parent_key(k) for k in g) for g in self.parent_zip)
        return parent + self.zip


@dataclass(frozen=True)
class Replicates:
    """``replicates: {auto: true, budget: N}``: the train grid's values of ``key`` are a pilot;
    once they ran, the study adds the values its claims need at 80 % power, up to ``budget``
    values in all, and decides each claim by a two-stage test (:mod:`lmc.studies.running.replicates`)."""

    key: str
    budget: int
    pilot: tuple[int, ...]
    #: a zipped ``key`` (trials): the keys of its zip whose values an added trial takes fresh
    #: (its models' seeds); the zip's other keys are copied from the first trial
    fresh: tuple[str, ...] = ()
    #: the zip ``key`` belongs to (``()`` when it is a plain grid key)
    zipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    name: str
    train: TrainStage
    evaluate: tuple[EvaluateStage, ...]
    path: Path
    text: str
    executor: Executor = field(default_factory=Executor)
    spawn: tuple[SpawnStage, ...] = ()
    #: the report's figures (:class:`lmc.studies.reporting.figure_spec.FigureSpec`)
    figures: tuple[Any, ...] = ()
    #: the barrier definition every barrier stage reports (``chord`` or ``abs_chord``), or
    #: ``None``: each stage config's own (the task's default is ``chord``)
    barrier: str | None = None
    #: the paper's claims (:class:`lmc.studies.claims.declared.Claim`), evaluated by the report
    claims: tuple[Any, ...] = ()
    #: ``replicates: auto``: the pilot and the budget, or ``None``
    replicates: Replicates | None = None

    def stage_keys(self) -> dict[str, list[str]]:
        """Every stage's coordinate keys: a training stage's grid (and spawn) keys, an evaluate
        stage's ``over`` and ``vary`` keys."""
        keys = {TRAIN_STAGE: list(self.train.grid)}
        keys.update({s.name: list(s.keys) for s in self.spawn})
        keys.update({s.name: [*s.select.over, s.select.vary, *s.grid] for s in self.evaluate})
        return keys

    def training_stage(self, name: str) -> tuple[dict[str, list[Any]], tuple]:
        """The coordinate keys (with their values) and zip groups of the training stage
        ``name`` (``train`` or a spawn stage)."""
        if name == TRAIN_STAGE:
            return self.train.grid, self.train.zip
        for stage in self.spawn:
            if stage.name == name:
                return stage.keys, stage.zipped
        names = [TRAIN_STAGE, *(s.name for s in self.spawn)]
        raise StudyError(f"no training stage {name!r}; training stages: {', '.join(names)}")

    @property
    def digest(self) -> str:
        """sha256 of the study file's text."""
        return hashlib.sha256(self.text.encode()).hexdigest()
