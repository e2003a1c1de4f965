"""A study as a W&B Report (``lmc study report DIR --wandb ENTITY/PROJECT``): the study's runs
(one runset per stage: W&B ``group`` = the study, ``job_type`` = the stage), its figures as
panels over those runs, its summary tables and the study file.

Two steps, so that a machine without a connection still gets everything short of the upload:

1. :func:`report_spec` turns the study folder (``plan.json``, ``study.yaml``), its figures
   (:class:`lmc.studies.reporting.figure_spec.FigureSpec`) and its summary tables into a plain, versioned,
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

Keys (:mod:`lmc.studies.reporting.wandb_spec`): a coordinate of a training stage (``train`` or a spawn stage) is the config key itself
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
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from lmc.studies.reporting.wandb_spec import (
    COMMAND,
    SPEC_FILE,
    check_spec,
    read_spec,
    report_spec,
    spec_path,
    write_spec,
)
from lmc.studies.running.store import StudyStore, read_plan, study_folder
from lmc.studies.spec.schema import StudyError

__all__ = [  # the spec's API too, so that one module serves ``lmc study report --wandb``
    "SPEC_FILE",
    "build_report",
    "markdown_table",
    "parse_target",
    "publish",
    "publish_or_save",
    "read_spec",
    "report_spec",
    "spec_path",
    "summary_tables",
    "write_spec",
]

INSTALL_HINT = 'pip install -e ".[reports]"'
#: rows of a summary table shown in the report; longer tables are cut (the CSV has them all)
MAX_TABLE_ROWS = 200
_TARGET = re.compile(r"^([^/\s]+)/([^/\s]+)$")


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
    check_spec(spec, "the spec")
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
    # already set up: its flag, too (Any: a module with wandb's private _silent flag)
    term: Any = sys.modules.get("wandb.errors.term")
    flag = getattr(term, "_silent", None)
    if flag is not None:
        term._silent = True
    try:
        yield
    finally:
        if flag is not None:
            term._silent = flag
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


def logged_to_wandb(root: str | Path) -> bool:
    """Whether any done job of the study folder ``root`` logged to W&B (a ``WandbLogger`` in
    its run's saved ``config.yaml``)."""
    root = study_folder(root)
    store = StudyStore(root)
    for job in read_plan(root)["jobs"]:
        config = store.run_dir(job) / "config.yaml"
        if not store.is_done(job) or not config.is_file():
            continue
        logger = ((yaml.safe_load(config.read_text()) or {}).get("trainer") or {}).get("logger")
        loggers = logger if isinstance(logger, list) else [logger]
        if any("WandbLogger" in str((lg or {}).get("class_path", "")) for lg in loggers):
            return True
    return False


def publish_or_save(root: str | Path, report: Any, target: str) -> str:
    """The ``--wandb`` step of ``lmc study report``: write the spec of the study folder
    ``root``'s report (``report``: what :func:`lmc.studies.reporting.report.write_report` returned: the
    specs of its figures, its ``summary`` table) beside ``report.html``, then upload it;
    returns the line to print: the URL, or, without a connection, where the spec is and how to
    upload it later.

    Raises:
        StudyError: ``target`` is not ``ENTITY/PROJECT``, or no run of the study logged to
            W&B (nothing written in either case), or wandb-workspaces is missing (the spec is
            written first).
    """
    parse_target(target)
    if not logged_to_wandb(root):
        raise StudyError(
            f"the runs of the study in {root} logged to CSV only (no WandbLogger in their saved "
            "configs), so a W&B report would chart runs that do not exist: add "
            "configs/loggers/wandb.yaml to train.config (and to the evaluate stages' configs) "
            "and run the study again, or read its report.html"
        )
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
