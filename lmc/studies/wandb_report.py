"""A study as a W&B Report (``lmc study report DIR --wandb ENTITY/PROJECT``): the study's runs
(one runset per stage: W&B ``group`` = the study, ``job_type`` = the stage), its figures as
panels over those runs, its summary tables and the study file.

Two steps, so that a machine without a connection still gets everything short of the upload:

1. :func:`report_spec` turns the study folder (``plan.json``, ``study.yaml``), its figures
   (:class:`lmc.studies.figure_spec.FigureSpec`) and its summary tables into a plain, versioned,
   JSON-able dict; :func:`write_spec` / :func:`read_spec` store it (``report/wandb_report.json``).
2. :func:`build_report` makes the ``wandb_workspaces.reports.v2.Report`` of a spec for an entity
   and project without saving it; :func:`publish` saves it (the library looks the project up
   while it serialises, so this needs a connection and a ``wandb login``) and returns its URL.
   Without a connection it raises a :class:`RuntimeError` saying the spec stays where it is and
   the same command uploads it later.

W&B draws a run's *history* in a line plot (against step, time or another logged metric), not
one point per run against a config value, so the figures map onto the panels W&B has over run
summaries and configs:

============  ==============================================================================
figure kind   W&B panel
============  ==============================================================================
line          one ``ScatterPlot`` per ``y`` metric: x = the coordinate (config), y = the
              metric (summary), one point per run (W&B draws no mean over seeds here)
bar           ``BarPlot`` of the ``y`` metrics, runs grouped by the ``x`` coordinate (mean,
              standard error as the range)
scatter       ``ScatterPlot``: x metric against y metric (summaries), one point per run
heatmap       ``ParallelCoordinatesPlot`` with the axes ``rows``, ``x`` (configs), ``y``
              (summary): W&B has no heat map over run summaries
curve         ``MediaBrowser`` of the stage's runs' own figure images (``<prefix>/figure``, the
              interpolation or curve each evaluate job drew) and a note naming the series and
              metrics: a per-run series over alpha or t is no run summary
============  ==============================================================================

``hue`` has no counterpart in these panels (W&B colours by run, or groups by one key) and
``references`` (paper values) and ``fit`` cannot be drawn on them: each figure's note says so;
``report.html`` has the exact figures.

Keys: a coordinate of a training stage (``train`` or a spawn stage) is the config key itself
(nested config, so ``model.init_args.net.init_args.width`` is ``Config("model.init_args.net
.init_args.width")``); any other coordinate (every coordinate of an evaluate stage, whose
``lmc validate`` config need not hold it, ``spawn_epoch``, ``parent:<key>``) is read from the
``study.coordinates`` entry every study job logs in its config. A metric of a training stage
is the logged name (``test/loss``); an evaluate job's task logs its summary under a prefix
(:data:`EVALUATE_PREFIX`: ``barrier_loss_matched`` of a barrier stage is
``interp/barrier_loss_matched`` on W&B).

``wandb-workspaces`` is an optional dependency (``pip install -e ".[reports]"``), imported only
by :func:`build_report` and :func:`publish`; the spec needs nothing beyond the standard library.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from lmc.io import atomic_write
from lmc.studies.schema import PARENT_PREFIX, SPAWN_EPOCH, TRAIN_STAGE, StudyError
from lmc.studies.store import PLAN_FILE, STUDY_FILE, StudyStore, study_folder

SCHEMA = "lmc.wandb_report"
VERSION = 1
#: the spec's file name, in the study's report folder
SPEC_FILE = "wandb_report.json"
INSTALL_HINT = 'pip install -e ".[reports]"'
COMMAND = "lmc study report DIR --wandb ENTITY/PROJECT"
#: the W&B summary prefix of the metrics an evaluate stage's task logs, by stage kind
#: (``log_study``, ``log_curve`` and ``log_merge`` of lmc.tasks: ``{prefix}/{summary key}``)
EVALUATE_PREFIX = {"barrier": "interp", "curve": "curve", "merge": "merge"}
#: the config entry a study job logs its study, stage, id and coordinates in
STUDY_CONFIG = "study"
#: rows of a summary table shown in the report; longer tables are cut (the CSV has them all)
MAX_TABLE_ROWS = 200
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
_TARGET = re.compile(r"^([^/\s]+)/([^/\s]+)$")


# ---------------------------------------------------------------------------------------------
# the spec


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
    if kind in ("line", "bar", "heatmap"):
        entry["x"] = _coordinate(fig.x, skind)
        entry["y"] = [_metric(y, skind, logged_as) for y in ys]
    if kind == "line":
        entry["panel"] = "ScatterPlot"
        notes.append(
            f"{', '.join(ys)} against {fig.x}: one point per run of stage {stage!r}, no line "
            "through the means over seeds" + (" (one panel per metric)" if len(ys) > 1 else "")
        )
    elif kind == "bar":
        entry["panel"] = "BarPlot"
        notes.append(
            f"{', '.join(ys)} of the runs of stage {stage!r} grouped by {fig.x}: mean, with the "
            "standard error as the range"
        )
    elif kind == "scatter":
        entry["panel"] = "ScatterPlot"
        entry["x"] = _metric(fig.x, skind, logged_as)
        entry["y"] = [_metric(ys[0], skind, logged_as)]
        notes.append(f"{ys[0]} against {fig.x}: one point per run of stage {stage!r}")
        if fig.fit:
            notes.append(f"the {fig.fit} fit (a, b, R^2) is not drawn here; report.html has it")
    elif kind == "heatmap":
        entry["panel"] = "ParallelCoordinatesPlot"
        entry["rows"] = _coordinate(fig.rows, skind)
        notes.append(
            f"W&B has no heat map over runs: {ys[0]} over {fig.rows} (rows) and {fig.x} "
            f"(columns) as parallel coordinates of the runs of stage {stage!r}"
        )
    elif kind == "curve":
        prefix = logged_as or EVALUATE_PREFIX.get(skind)
        entry["panel"] = "MediaBrowser" if prefix else "MarkdownBlock"
        entry["media"] = [f"{prefix}/figure"] if prefix else []
        notes.append(
            f"the {fig.series!r} series of {', '.join(ys)} over each job's path is a series "
            "per run, not a run summary, so no W&B panel draws it across runs"
            + (
                f"; here: the figure each run of stage {stage!r} logged ({prefix}/figure), its "
                f"tables and charts are under {prefix}/ on the run pages"
                if prefix
                else ""
            )
        )
    else:
        raise StudyError(
            f"figure {name!r}: unknown kind {kind!r}; kinds: line, bar, scatter, curve, heatmap"
        )
    if fig.hue and kind in ("line", "bar", "scatter"):
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
            :class:`lmc.studies.figure_spec.FigureSpec`), each one report section.
        summary_tables: name -> rows (dicts column -> value), shown as markdown tables.

    Raises:
        StudyError: ``root`` is no study folder, or a figure names a stage without jobs.
    """
    root = study_folder(root)
    plan = json.loads((root / PLAN_FILE).read_text())
    text = (root / STUDY_FILE).read_text()
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
    counts = ", ".join(f"{s}: {c['done']} of {c['planned']} done" for s, c in jobs.items())
    description = (
        f"Study {name}: W&B group {name}, one job type per stage ({counts}). Figures over the "
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
    _check_spec(spec, str(path))
    text = json.dumps(spec, indent=2, allow_nan=False)
    return atomic_write(path, lambda f: f.write(text + "\n"), mode="w")


def _check_spec(spec: Any, where: str) -> None:
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
    _check_spec(spec, str(path))
    return spec


# ---------------------------------------------------------------------------------------------
# the wandb-workspaces report


def _reports() -> Any:
    """``wandb_workspaces.reports.v2``, or a StudyError saying how to install it."""
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as err:
        raise StudyError(
            f"a W&B Report needs the wandb-workspaces package ({err}): {INSTALL_HINT}"
        ) from None
    return wr


def _axis(wr: Any, ref: Mapping[str, str]) -> Any:
    if "config" in ref:
        return wr.Config(ref["config"])
    return wr.SummaryMetric(ref["summary"])


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Mapping[str, Any], max_rows: int = MAX_TABLE_ROWS) -> str:
    """A spec table as a markdown table (the first ``max_rows`` rows, and how many there are)."""
    columns, rows = table["columns"], table["rows"]
    if not columns:
        return "_(empty)_"
    lines = ["| " + " | ".join(_fmt(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"\n_first {max_rows} of {len(rows)} rows_")
    return "\n".join(lines)


def _panels(wr: Any, entry: Mapping[str, Any]) -> list[Any]:
    """The wandb-workspaces panels of one spec entry."""
    panel, title = entry["panel"], entry["title"]
    log_x, log_y = entry.get("log_x") or None, entry.get("log_y") or None
    if panel == "ScatterPlot":
        x = _axis(wr, entry["x"])
        many = len(entry["y"]) > 1
        return [
            wr.ScatterPlot(
                title=f"{title}: {next(iter(y.values()))}" if many else title,
                x=x,
                y=_axis(wr, y),
                log_x=log_x,
                log_y=log_y,
                layout=wr.Layout(w=12, h=8),
            )
            for y in entry["y"]
        ]
    if panel == "BarPlot":
        return [
            wr.BarPlot(
                title=title,
                metrics=[_axis(wr, y) for y in entry["y"]],
                orientation="v",
                groupby=_axis(wr, entry["x"]),
                groupby_aggfunc="mean",
                groupby_rangefunc="stderr",
                title_x=entry.get("xlabel"),
                title_y=entry.get("ylabel"),
                layout=wr.Layout(w=12, h=8),
            )
        ]
    if panel == "ParallelCoordinatesPlot":
        axes = [(entry["rows"], False), (entry["x"], entry.get("log_x"))]
        axes += [(y, entry.get("log_y")) for y in entry["y"]]
        return [
            wr.ParallelCoordinatesPlot(
                title=title,
                columns=[
                    wr.ParallelCoordinatesPlotColumn(
                        metric=_axis(wr, ref), display_name=next(iter(ref.values())), log=log
                    )
                    for ref, log in axes
                ],
                layout=wr.Layout(w=24, h=8),
            )
        ]
    if panel == "MediaBrowser":
        return [
            wr.MediaBrowser(
                title=title,
                media_keys=list(entry["media"]),
                gallery_axis="run",
                layout=wr.Layout(w=24, h=10),
            )
        ]
    return []  # MarkdownBlock: the notes only


def _runset(wr: Any, entity: str, project: str, spec: Mapping[str, Any], rs: Mapping) -> Any:
    from wandb_workspaces import expr

    return wr.Runset(
        entity=entity,
        project=project,
        name=f"{spec['study']}: {rs['name']}",
        filters=[expr.Metric("Group") == rs["group"], expr.Metric("JobType") == rs["job_type"]],
    )


def build_report(spec: Mapping[str, Any], entity: str, project: str) -> Any:
    """The ``wandb_workspaces.reports.v2.Report`` of ``spec`` in ``entity/project``, not saved
    (building it needs no connection; saving does). Blocks: the description, the study's runs
    (a panel grid with one runset per stage), one section per figure (its note and a panel
    grid over its stage's runset), the summary tables (markdown) and the study file (YAML).

    Raises:
        StudyError: ``spec`` is no spec of this version, or wandb-workspaces is missing.
    """
    _check_spec(spec, "the spec")
    wr = _reports()
    runsets = {rs["name"]: _runset(wr, entity, project, spec, rs) for rs in spec["runsets"]}
    blocks: list[Any] = [
        wr.MarkdownBlock(text=spec["description"]),
        wr.H1(text="Runs"),
        wr.MarkdownBlock(
            text=f"Runs of group `{spec['group']}`, one runset per stage (job type): "
            + ", ".join(f"`{s}`" for s in spec["stages"])
        ),
        wr.PanelGrid(runsets=list(runsets.values())),
    ]
    if spec["panels"]:
        blocks.append(wr.H1(text="Figures"))
    for entry in spec["panels"]:
        blocks.append(wr.H2(text=entry["title"]))
        if entry.get("notes"):
            blocks.append(wr.MarkdownBlock(text="\n".join(f"- {n}" for n in entry["notes"])))
        panels = _panels(wr, entry)
        if panels:
            blocks.append(wr.PanelGrid(runsets=[runsets[entry["stage"]]], panels=panels))
    if spec["tables"]:
        blocks.append(wr.H1(text="Summary tables"))
    for table in spec["tables"]:
        blocks += [wr.H2(text=table["name"]), wr.MarkdownBlock(text=markdown_table(table))]
    blocks += [
        wr.H1(text="Study file"),
        wr.CodeBlock(code=spec["study_file"], language="yaml"),
    ]
    return wr.Report(
        entity=entity,
        project=project,
        title=spec["title"][:128],
        description=spec["description"],
        blocks=blocks,
    )


def parse_target(target: str) -> tuple[str, str]:
    """``"ENTITY/PROJECT"`` -> ``(entity, project)``.

    Raises:
        StudyError: another form.
    """
    match = _TARGET.match(target.strip()) if isinstance(target, str) else None
    if not match:
        raise StudyError(
            f"--wandb {target!r}: give the W&B entity and project as ENTITY/PROJECT "
            "(e.g. my-team/lmc)"
        )
    return match.group(1), match.group(2)


@contextmanager
def _no_login_prompt() -> Iterator[None]:
    """W&B silent while the report is saved: without credentials it raises instead of asking
    for an API key on a terminal (its prompt is shown only when not silent)."""
    old = os.environ.get("WANDB_SILENT")
    os.environ["WANDB_SILENT"] = "true"
    term = sys.modules.get("wandb.errors.term")  # already set up: its flag, too
    flag = getattr(term, "_silent", None)
    if flag is not None:
        term._silent = True  # type: ignore[union-attr]
    try:
        yield
    finally:
        if flag is not None:
            term._silent = flag  # type: ignore[union-attr]
        if old is None:
            os.environ.pop("WANDB_SILENT", None)
        else:
            os.environ["WANDB_SILENT"] = old


def publish(
    spec: Mapping[str, Any] | str | Path,
    target: str,
    *,
    path: str | Path | None = None,
) -> str:
    """Upload the report of ``spec`` (a spec, or the path of one) to ``target``
    (``"ENTITY/PROJECT"``) and return its URL.

    Args:
        path: where ``spec`` is stored (named in the error); the path ``spec`` was read from
            when it is one.

    Raises:
        StudyError: ``target`` is not ``ENTITY/PROJECT`` (before anything else), the spec is
            wrong, or wandb-workspaces is missing.
        RuntimeError: the upload failed (no connection, not logged in, no such project, ...);
            the message says where the spec stays and that the same command uploads it later.
    """
    entity, project = parse_target(target)
    if not isinstance(spec, Mapping):
        path = spec
        spec = read_spec(spec)
    report = build_report(spec, entity, project)
    try:
        with _no_login_prompt():
            report.save()
            return str(report.url)
    except Exception as err:  # the library raises bare Exceptions for auth and lookups
        where = f"its spec stays at {path}" if path else "write its spec with write_spec"
        raise RuntimeError(
            f"the W&B report could not be uploaded to {entity}/{project} "
            f"({type(err).__name__}: {err}); {where}, and the same command uploads it later: "
            f"`{COMMAND}` (needs a connection and `wandb login`, and the study's runs synced "
            "to that project, e.g. `wandb sync DIR/jobs/*/*/wandb/offline-run-*`)"
        ) from err


# ---------------------------------------------------------------------------------------------
# the CLI's step


def _read_csv(path: Path) -> list[dict[str, Any]]:
    def value(text: str | None) -> Any:
        if text is None or text == "":
            return None
        try:
            number = float(text)
        except ValueError:
            return text
        return int(number) if number.is_integer() and "." not in text else number

    with Path(path).open(newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def summary_tables(csv_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The summary table of a study report (``tables/summary.csv``: one row per stage, grid
    point and metric) as one table per stage, without the columns empty in that stage."""
    rows = _read_csv(Path(csv_path))
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_stage.setdefault(str(row.get("stage", "")), []).append(row)
    tables = {}
    for stage, part in by_stage.items():
        used = [c for c in part[0] if c != "stage" and any(r.get(c) is not None for r in part)]
        name = f"summary: {stage}" if stage else "summary"
        tables[name] = [{c: r.get(c) for c in used} for r in part]
    return tables


def publish_or_save(root: str | Path, report: Any, target: str) -> str:
    """The ``--wandb`` step of ``lmc study report``: write the spec of the study folder
    ``root``'s report (``report``: what :func:`lmc.studies.report.write_report` returned: the
    specs of its figures, its ``summary`` table) beside ``report.html``, then upload it;
    returns the line to print: the URL, or, without a connection, where the spec is and how to
    upload it later.

    Raises:
        StudyError: ``target`` is not ``ENTITY/PROJECT`` (nothing written), or
            wandb-workspaces is missing (the spec is written first).
    """
    parse_target(target)
    figures = [getattr(f, "spec", f) for f in getattr(report, "figures", None) or []]
    summary = (getattr(report, "tables", None) or {}).get("summary")
    tables = summary_tables(summary) if summary and Path(summary).is_file() else {}
    spec = report_spec(root, figures, tables)
    out = spec_path(Path(report.html).parent)
    write_spec(spec, out)
    try:
        url = publish(spec, target, path=out)
    except RuntimeError as err:
        return f"W&B report not uploaded: {err}"
    except StudyError as err:
        raise StudyError(f"{err} (the W&B report spec is at {out})") from None
    return f"W&B report: {url} (spec: {out})"
