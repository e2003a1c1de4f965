"""The W&B Report of a study as a spec (step 1 of :mod:`lmc.studies.reporting.wandb_report`): the study
folder (``plan.json``, ``study.yaml``), its figures (:class:`lmc.studies.reporting.figure_spec.FigureSpec`)
and its summary tables as a plain, versioned, JSON-able dict (:func:`report_spec`), stored as
``report/wandb_report.json`` (:func:`write_spec` / :func:`read_spec`). Standard library only.

Keys: a coordinate of a training stage (``train`` or a spawn stage) is the config key itself;
any other coordinate (every coordinate of an evaluate stage, ``spawn_epoch``, ``parent:<key>``)
is read from the ``study.coordinates`` entry every study job logs in its config. A metric of a
training stage is the logged name (``test/loss``); an evaluate job's task logs its summary under
a prefix, which its run record names (``logged_as``; :data:`EVALUATE_PREFIX` by stage kind
before any job is done): ``barrier_loss_matched`` of a barrier stage is
``interp/barrier_loss_matched`` on W&B.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmc.io import atomic_write
from lmc.studies.reporting.figure_spec import FIGURE_KINDS
from lmc.studies.running.store import (
    PLAN_FILE,
    STUDY_FILE,
    StudyStore,
    read_plan,
    read_study_copy,
    study_folder,
)
from lmc.studies.spec.schema import (
    EVALUATE_KINDS,
    PARENT_PREFIX,
    SPAWN_EPOCH,
    TRAIN_STAGE,
    StudyError,
)

SCHEMA = "lmc.wandb_report"
VERSION = 1
#: the spec's file name, in the study's report folder
SPEC_FILE = "wandb_report.json"
#: the command that writes (and uploads) the spec, named in errors
COMMAND = "lmc study report DIR --wandb ENTITY/PROJECT"
#: the W&B summary prefix of the metrics an evaluate stage's task logs, by stage kind
#: (:class:`lmc.studies.spec.schema.StageKind`), where no done job's run record says which it used
#: (``logged_as``)
EVALUATE_PREFIX = {name: kind.prefix for name, kind in EVALUATE_KINDS.items()}
#: the config entry a study job logs its study, stage, id and coordinates in
STUDY_CONFIG = "study"
_FIGURE_FIELDS = (
    "name",
    "kind",
    "stage",
    "y",
    "x",
    "hue",
    "rows",
    "series",
    "fit",
    "xscale",
    "yscale",
    "xlabel",
    "ylabel",
    "title",
    "references",
)


def _plain(value: Any) -> Any:
    """``value`` as JSON: tuples to lists, numpy scalars to numbers, non-finite floats to None."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy / torch scalar
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _stage_kinds(text: str) -> dict[str, str]:
    """Stage name -> ``train``, ``spawn`` or the evaluate kind, from the study file's text."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise StudyError(f"the study copy {STUDY_FILE} is not valid YAML: {err}") from None
    if not isinstance(data, Mapping):
        data = {}
    kinds = {TRAIN_STAGE: TRAIN_STAGE}
    for stage in data.get("spawn") or []:
        if isinstance(stage, Mapping) and "name" in stage:
            kinds[str(stage["name"])] = "spawn"
    for stage in data.get("evaluate") or []:
        if isinstance(stage, Mapping) and "name" in stage:
            kinds[str(stage["name"])] = str(stage.get("kind"))
    return kinds


def _coordinate(key: str, kind: str) -> dict[str, str]:
    """The W&B config key of the coordinate ``key`` of a stage of ``kind``."""
    if kind in (TRAIN_STAGE, "spawn") and key != SPAWN_EPOCH and not key.startswith(PARENT_PREFIX):
        return {"config": key}
    return {"config": f"{STUDY_CONFIG}.coordinates.{key}"}


def _metric(name: str, kind: str, prefix: str | None = None) -> dict[str, str]:
    """The W&B summary key of the study metric ``name`` of a stage of ``kind``: under the
    ``prefix`` its jobs logged it (read from their run records), else the kind's own."""
    prefix = prefix or EVALUATE_PREFIX.get(kind)
    return {"summary": f"{prefix}/{name}" if prefix else name}


def _logged_prefixes(store: StudyStore, jobs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Stage -> the prefix its done jobs' tasks logged their summaries under (the detail
    ``logged_as`` of the run record, :func:`lmc.results.logging.publish`); one job a stage."""
    from lmc.results import RecordError, read_record
    from lmc.results.logging import LOGGED_AS

    found: dict[str, str] = {}
    for job in jobs:
        if job["stage"] in found or job["stage"] == TRAIN_STAGE or not store.is_done(job):
            continue
        run = store.run_dir(job)
        if not (run / "summary.json").is_file():
            continue
        try:
            prefix = read_record(run).details.get(LOGGED_AS)
        except (RecordError, OSError, ValueError):
            continue
        if isinstance(prefix, str) and prefix:
            found[job["stage"]] = prefix
    return found


def _figure_dict(fig: Any) -> dict[str, Any]:
    return {f: _plain(getattr(fig, f, None)) for f in _FIGURE_FIELDS}


@dataclass(frozen=True)
class _Keys:
    """How a stage's coordinates and metrics are named on W&B (:func:`_coordinate`,
    :func:`_metric`): its kind and the prefix its jobs logged under."""

    kind: str
    logged_as: str | None

    def coordinate(self, key: str) -> dict[str, str]:
        return _coordinate(key, self.kind)

    def metric(self, name: str) -> dict[str, str]:
        return _metric(name, self.kind, self.logged_as)


def _line_panel(entry: dict[str, Any], fig: Any, ys: list[str], keys: _Keys) -> list[str]:
    entry.update(panel="ScatterPlot", x=keys.coordinate(fig.x), y=[keys.metric(y) for y in ys])
    return [
        f"{', '.join(ys)} against {fig.x}: one point per run of stage {fig.stage!r}, no line "
        "through the means over seeds" + (" (one panel per metric)" if len(ys) > 1 else "")
    ]


def _bar_panel(entry: dict[str, Any], fig: Any, ys: list[str], keys: _Keys) -> list[str]:
    entry.update(panel="BarPlot", x=keys.coordinate(fig.x), y=[keys.metric(y) for y in ys])
    return [
        f"{', '.join(ys)} of the runs of stage {fig.stage!r} grouped by {fig.x}: mean, with the "
        "standard error as the range"
    ]


def _scatter_panel(entry: dict[str, Any], fig: Any, ys: list[str], keys: _Keys) -> list[str]:
    entry.update(panel="ScatterPlot", x=keys.metric(fig.x), y=[keys.metric(ys[0])])
    notes = [f"{ys[0]} against {fig.x}: one point per run of stage {fig.stage!r}"]
    if fig.fit:
        notes.append(f"the {fig.fit} fit (a, b, R^2) is not drawn here; report.html has it")
    return notes


def _heatmap_panel(entry: dict[str, Any], fig: Any, ys: list[str], keys: _Keys) -> list[str]:
    entry.update(
        panel="ParallelCoordinatesPlot",
        x=keys.coordinate(fig.x),
        y=[keys.metric(y) for y in ys],
        rows=keys.coordinate(fig.rows),
    )
    return [
        f"W&B has no heat map over runs: {ys[0]} over {fig.rows} (rows) and {fig.x} "
        f"(columns) as parallel coordinates of the runs of stage {fig.stage!r}"
    ]


def _curve_panel(entry: dict[str, Any], fig: Any, ys: list[str], keys: _Keys) -> list[str]:
    prefix = keys.logged_as or EVALUATE_PREFIX.get(keys.kind)
    entry.update(
        panel="MediaBrowser" if prefix else "MarkdownBlock",
        media=[f"{prefix}/figure"] if prefix else [],
    )
    return [
        f"the {fig.series!r} series of {', '.join(ys)} over each job's path is a series "
        "per run, not a run summary, so no W&B panel draws it across runs"
        + (
            f"; here: the figure each run of stage {fig.stage!r} logged ({prefix}/figure), its "
            f"tables and charts are under {prefix}/ on the run pages"
            if prefix
            else ""
        )
    ]


# every figure kind's W&B panel: fills the spec entry's panel and axes, returns the notes on
# what the panel cannot show
for _kind, _to_panel in (
    ("line", _line_panel),
    ("bar", _bar_panel),
    ("scatter", _scatter_panel),
    ("curve", _curve_panel),
    ("heatmap", _heatmap_panel),
):
    FIGURE_KINDS[_kind].render("wandb", _to_panel)


def _panel(
    fig: Any, kinds: dict[str, str], stages: list[str], logged: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The spec entry of one figure: its W&B panel kind, axes (``{"config": key}`` or
    ``{"summary": key}``) and the notes on what W&B cannot show of it."""
    name, kind, stage = fig.name, fig.kind, fig.stage
    if stage not in stages:
        raise StudyError(
            f"figure {name!r}: stage {stage!r} has no jobs in {PLAN_FILE}; stages: "
            f"{', '.join(stages)}"
        )
    skind = kinds.get(stage, "")
    logged_as = (logged or {}).get(stage)
    ys = [str(y) for y in fig.y]
    title = fig.title or name
    xlabel = fig.xlabel or fig.x
    ylabel = fig.ylabel or ", ".join(ys)
    notes: list[str] = []
    entry: dict[str, Any] = {
        "figure": name,
        "kind": kind,
        "stage": stage,
        "title": title,
        "xlabel": xlabel,
        "ylabel": ylabel,
        "log_x": fig.xscale == "log",
        "log_y": fig.yscale == "log",
        "x": None,
        "y": [],
        "hue": None,
        "rows": None,
        "media": [],
    }
    if kind not in FIGURE_KINDS:
        raise StudyError(
            f"figure {name!r}: unknown kind {kind!r}; kinds: {', '.join(FIGURE_KINDS)}"
        )
    notes += FIGURE_KINDS[kind].renderer("wandb")(entry, fig, ys, _Keys(skind, logged_as))
    if fig.hue and not FIGURE_KINDS[kind].wandb_hue:
        entry["hue"] = _coordinate(fig.hue, skind)
        notes.append(
            f"hue {fig.hue} is not drawn (W&B colours points by run); group the runset by it "
            "in the W&B UI to compare its values"
        )
    if fig.references:
        marks = "; ".join(f"{lab} at ({x:g}, {y:g})" for x, y, lab in fig.references)
        notes.append(f"paper values (not drawn here): {marks}")
    entry["notes"] = notes
    entry["source"] = _figure_dict(fig)
    return entry


def _table(name: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    columns: list[str] = []
    for row in rows:
        columns += [str(k) for k in row if str(k) not in columns]
    return {
        "name": str(name),
        "columns": columns,
        "rows": [[_plain(row.get(c)) for c in columns] for row in rows],
    }


def report_spec(
    root: str | Path,
    figures: Sequence[Any],
    summary_tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The W&B report of the study folder ``root`` as a plain JSON-able dict (see the module
    docstring for what each figure becomes).

    Args:
        root: the study folder (``plan.json``, ``study.yaml``).
        figures: the figures (objects with the fields of
            :class:`lmc.studies.reporting.figure_spec.FigureSpec`), each one report section.
        summary_tables: name -> rows (dicts column -> value), shown as markdown tables.

    Raises:
        StudyError: ``root`` is no study folder, or a figure names a stage without jobs.
    """
    root = study_folder(root)
    plan = read_plan(root)
    text = read_study_copy(root)
    name = str(plan.get("study") or root.name)
    store = StudyStore(root)
    jobs: dict[str, dict[str, int]] = {}
    keys: dict[str, list[str]] = {}
    for job in plan["jobs"]:
        counts = jobs.setdefault(job["stage"], {"planned": 0, "done": 0})
        counts["planned"] += 1
        counts["done"] += int(store.is_done(job))
        stage_keys = keys.setdefault(job["stage"], [])
        stage_keys += [k for k in job["coordinates"] if k not in stage_keys]
    stages = list(jobs)
    kinds = _stage_kinds(text)
    logged = _logged_prefixes(store, plan["jobs"])
    panels = [_panel(fig, kinds, stages, logged) for fig in figures]
    tables = [_table(n, rows) for n, rows in (summary_tables or {}).items()]
    done = ", ".join(f"{s}: {c['done']} of {c['planned']} done" for s, c in jobs.items())
    description = (
        f"Study {name}: W&B group {name}, one job type per stage ({done}). Figures over the "
        "runs' summaries; the study's report.html has the exact figures."
    )
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "title": f"lmc study {name}",
        "description": description,
        "study": name,
        "group": name,
        "stages": stages,
        "stage_kinds": {s: kinds.get(s, "") for s in stages},
        "coordinates": keys,
        "jobs": jobs,
        "study_file": text,
        "study_path": plan.get("file"),
        "runsets": [{"name": s, "group": name, "job_type": s} for s in stages],
        "panels": panels,
        "tables": tables,
    }


def spec_path(report_dir: str | Path) -> Path:
    """Where the spec of a study's report lives: ``<report folder>/wandb_report.json``."""
    return Path(report_dir) / SPEC_FILE


def write_spec(spec: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``spec`` as JSON to ``path`` atomically."""
    check_spec(spec, str(path))
    text = json.dumps(spec, indent=2, allow_nan=False)
    return atomic_write(path, lambda f: f.write(text + "\n"), mode="w")


def check_spec(spec: Any, where: str) -> None:
    if not isinstance(spec, Mapping) or spec.get("schema") != SCHEMA:
        got = spec.get("schema") if isinstance(spec, Mapping) else type(spec).__name__
        raise StudyError(
            f"{where} is no W&B report spec of lmc (schema {got!r}, expected {SCHEMA!r}); "
            f"`{COMMAND}` writes one"
        )
    if spec.get("version") != VERSION:
        raise StudyError(
            f"{where} is a W&B report spec of version {spec.get('version')!r}; this lmc reads "
            f"version {VERSION}. Write it again with `{COMMAND}`"
        )


def read_spec(path: str | Path) -> dict[str, Any]:
    """The spec written by :func:`write_spec`.

    Raises:
        StudyError: no such file, not JSON, or not a spec of this schema and version.
    """
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"no W&B report spec at {path}; `{COMMAND}` writes one")
    try:
        spec = json.loads(path.read_text())
    except ValueError as err:
        raise StudyError(
            f"{path} is not valid JSON ({err}); write it again with `{COMMAND}`"
        ) from None
    check_spec(spec, str(path))
    return spec
