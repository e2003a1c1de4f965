"""A study's report: ``report.html`` (one self-contained file: CSS inline, figures inline as
SVG, no script, font or request leaving the file) and ``report.md`` (the same content, figures
as PNG files beside it), with the study file, its grid, every declared figure, the summary
tables over seeds, the failed jobs with their error, the environment and the wall time per
stage. Written into ``<study folder>/report/`` by ``lmc study report DIR`` and at the end of
``lmc study run``."""

from __future__ import annotations

import html
import json
import math
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from lmc.interpolation.barrier import NORMALIZED_MIN_LOSS
from lmc.io import atomic_write
from lmc.studies.running.store import git_commit, read_plan, read_study_copy, study_folder

REPORT_DIR = "report"
_NO_FIGURE = "No figure (none declared under figures: in the study file, or no job done)."
_SUMMARY_NOTE = (
    "One table per stage, rows grouped by metric, the stage's coordinates as columns. n: finite "
    "values in the mean; ci: 95 % t-interval; shown where a stage has any: n_nonfinite (NaN/inf "
    "values excluded), n_failed / n_missing (jobs of the cell not done). Every row and column: "
    "tables/summary.csv."
)
_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:.8em;overflow-x:auto;font-size:.85em}
.tablebox{max-width:100%;overflow-x:auto}
figure{margin:1.2em 0}figure svg{max-width:100%;height:auto}
figcaption{font-size:.9em;color:#444}.bad{color:#a40000}.note{color:#555;font-size:.9em}
"""


@dataclass
class Report:
    """What :func:`write_report` wrote."""

    html: Path
    markdown: Path
    figures: list[Any] = field(default_factory=list)
    tables: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _fmt(value: Any) -> str:
    """A table cell: numbers to 4 significant digits, non-finite values as such."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return str(value)


def _html_table(frame: pd.DataFrame, name: str) -> str:
    head = "".join(f"<th class='l'>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        cells = []
        for value in row:
            text = html.escape(_fmt(value))
            cls = " class='l'" if not isinstance(value, (int, float)) else ""
            cells.append(f"<td{cls}>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (  # a wide table scrolls inside its box, the page keeps the window's width
        f"<div class='tablebox'><table data-name='{html.escape(name)}' data-rows='{len(frame)}'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _md_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_(none)_\n"

    def cell(v: Any) -> str:
        return _fmt(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(str(c) for c in frame.columns) + " |"]
    lines.append("|" + "---|" * len(frame.columns))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join(lines) + "\n"


def _environment(study_file: str | None) -> dict[str, str]:
    from lmc.results import environment_versions

    env = {k: str(v) for k, v in environment_versions().items()}
    env["python"] = platform.python_version()
    env["platform"] = platform.platform()
    try:
        import torch

        env["device"] = (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        ) + f" ({torch.get_num_threads()} CPU threads)"
    except Exception:  # pragma: no cover - torch missing or broken
        pass
    if study_file:
        commit = git_commit(Path(study_file).parent)
        if commit:
            env["git commit"] = commit
    env["report written"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return env


def _stage_times(jobs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for stage, group in jobs.groupby("stage", sort=False):
        counts = group.status.value_counts()
        started = pd.to_datetime(group.started, errors="coerce", utc=True).min()
        finished = pd.to_datetime(group.finished, errors="coerce", utc=True).max()
        wall = (finished - started).total_seconds() if pd.notna(started) else math.nan
        rows.append(
            {
                "stage": stage,
                "jobs": len(group),
                "done": int(counts.get("done", 0)),
                "failed": int(counts.get("failed", 0)),
                "not done": int(len(group) - counts.get("done", 0) - counts.get("failed", 0)),
                "job seconds (sum)": float(group.seconds.sum(skipna=True)),
                "wall seconds": wall,
            }
        )
    return pd.DataFrame(rows)


def _grid(plan: list[dict[str, Any]]) -> pd.DataFrame:
    rows: dict[tuple[str, str], list[str]] = {}
    for job in plan:
        for key, value in job["coordinates"].items():
            values = rows.setdefault((job["stage"], key), [])
            text = json.dumps(value, default=str)
            if text not in values:
                values.append(text)
    return pd.DataFrame(
        [{"stage": s, "key": k, "values": ", ".join(v)} for (s, k), v in rows.items()]
    )


def _figure_specs(text: str) -> tuple[Any, ...]:
    from lmc.studies.reporting.aggregate import stage_keys
    from lmc.studies.reporting.figure_spec import parse_figures

    data = yaml.safe_load(text) or {}
    return parse_figures(data["figures"], stage_keys(data)) if data.get("figures") else ()


def _svg(path: Path) -> str:
    text = path.read_text()
    text = re.sub(r"<\?xml[^>]*\?>", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>", "", text)
    return text.strip()


def shown_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary a person reads (``tables/summary.csv`` keeps every row): without metrics that
    are undefined in every job (:func:`undefined_left_out`), wall times (``*_seconds``: the
    report has its own table of them), and a stage's logged ``interp/*`` copies where its run
    records give the same numbers (the last point of a path, ``interp/alpha``, is no summary)."""
    summary = undefined_left_out(summary)
    if summary.empty:
        return summary
    metric = summary.metric.astype(str)
    recorded = summary.assign(_plain=~metric.str.startswith("interp/"))
    has_record = recorded.groupby("stage", sort=False)._plain.transform("any")
    drop = metric.str.endswith("_seconds") | (metric.str.startswith("interp/") & has_record)
    return summary[~drop].reset_index(drop=True)


#: the counts a person needs only when some cell has one (the CSV keeps them all)
_COUNTS = ("n_nonfinite", "n_failed", "n_missing")


def summary_sections(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The shown summary as one table per stage, laid out to fit a laptop screen: rows grouped
    by metric, the stage's own coordinates as columns (the keys its jobs vary; a key none of
    them has is left out), and the counts of excluded, failed or missing values only where
    that stage has any."""
    from lmc.studies.reporting.aggregate import STAT_COLUMNS

    if summary.empty:
        return []
    stats = [c for c in ("metric", *STAT_COLUMNS, *_COUNTS) if c in summary]
    sections = []
    for stage, part in summary.groupby("stage", sort=False):
        coords = [c for c in part.columns if c not in (*stats, "stage")]
        coords = [c for c in coords if part[c].notna().any()]
        shown = [c for c in stats if c not in _COUNTS or (part[c] > 0).any()]
        order = {m: i for i, m in enumerate(dict.fromkeys(part.metric))}
        table = part.assign(_m=part.metric.map(order)).sort_values(["_m", *coords], kind="stable")
        table = table[["metric", *coords, *[c for c in shown if c != "metric"]]]
        sections.append((str(stage), table.reset_index(drop=True)))
    return sections


def undefined_left_out(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary without the metrics that no job of their stage gives a finite value (the
    accuracy of a regression, a barrier normalised by a zero chord): undefined by design, not a
    divergence to flag. A metric finite in some jobs and not in others keeps its rows."""
    if summary.empty or "n_nonfinite" not in summary:
        return summary
    finite = summary.groupby(["stage", "metric"], sort=False).n.transform("sum")
    return summary[finite > 0].reset_index(drop=True)


def write_report(root: str | Path, out: str | Path | None = None) -> Report:
    """Write the report of the study folder ``root`` into ``out`` (default ``root/report``).

    Raises:
        StudyError: ``root`` is no study folder (naming what is missing), or a figure names a
            metric no done job of its stage has (listing the available ones), before anything
            is drawn or written.
    """
    from lmc.studies.reporting import aggregate
    from lmc.studies.reporting.figures import render_figures

    root = study_folder(root)
    out = Path(out) if out is not None else root / REPORT_DIR
    plan_doc = read_plan(root)
    plan = plan_doc["jobs"]
    text = read_study_copy(root)
    name = plan_doc.get("study") or root.name
    specs = _figure_specs(text)
    frames = aggregate.study_tables(root)  # every job record and run summary read once
    jobs = frames["jobs"]
    done = int((jobs.status == "done").sum())
    notes: list[str] = []
    figures: list[Any] = []
    if done == 0:
        notes.append(f"no job of the study is done ({len(jobs)} planned): no figure to draw")
    elif specs:
        figures = render_figures(  # checks metrics first
            specs, None, out / "figures", tidy=frames["results"], series=frames["series"]
        )
    from lmc.studies.running.replicates import pilot_replicates

    pilot = pilot_replicates(root)
    claims = _claims(text, plan, frames["results"], pilot) if done else pd.DataFrame()
    tables = aggregate.write_tables(root, out / "tables", frames)
    if len(claims):
        tables["claims"] = out / "tables" / "claims.csv"
        atomic_write(tables["claims"], lambda f: claims.to_csv(f, index=False), mode="w")
    summary = shown_summary(frames["summary"])
    failed = jobs[jobs.status == "failed"][["stage", "job", "error"]]
    failed = failed.assign(log=[f"jobs/{s}/{j}/job.log" for s, j in zip(failed.stage, failed.job)])
    times = _stage_times(jobs)
    env = _environment(plan_doc.get("file"))
    env_frame = pd.DataFrame({"": list(env), "value": list(env.values())})
    if not failed.empty:
        notes.append(f"{len(failed)} job(s) failed: see the table of failed jobs")
    nonfinite = summary[summary.n_nonfinite > 0] if "n_nonfinite" in summary else summary
    remarks: list[str] = []
    if len(nonfinite):
        # a normalised barrier is undefined (NaN) by design where the endpoints' mean loss is
        # near 0: a remark, not a warning
        undefined = nonfinite.metric.str.contains("loss_normalized", regex=False)
        for part, out_list, what in (
            (nonfinite[~undefined], notes, "non-finite value(s) (NaN or inf) of"),
            (
                nonfinite[undefined],
                remarks,
                "normalised barrier(s) are undefined (NaN: the endpoints' mean loss is below "
                f"{NORMALIZED_MIN_LOSS:g}, where B / mean L would be noise) in",
            ),
        ):
            if len(part):
                names = sorted(set(part.metric))
                shown = ", ".join(names[:8]) + (
                    f" and {len(names) - 8} more" if len(names) > 8 else ""
                )
                out_list.append(
                    f"{int(part.n_nonfinite.sum())} {what} {shown}; they are excluded from the "
                    "means and counted per cell in n_nonfinite"
                )
    status_line = (
        f"{len(jobs)} jobs: {done} done, {int((jobs.status == 'failed').sum())} failed, "
        f"{len(jobs) - done - int((jobs.status == 'failed').sum())} not done"
    )
    content = _Content(
        name,
        status_line,
        notes,
        text,
        _grid(plan),
        figures,
        summary,
        failed,
        times,
        env_frame,
        claims,
        remarks,
    )
    _write_html(out / "report.html", content, tables)
    _write_md(out / "report.md", content, out)
    return Report(out / "report.html", out / "report.md", figures, tables, notes)


@dataclass
class _Content:
    """What both the HTML and the Markdown report show."""

    name: str
    status_line: str
    notes: list[str]
    study_text: str
    grid: pd.DataFrame
    figures: list[Any]
    summary: pd.DataFrame
    failed: pd.DataFrame
    times: pd.DataFrame
    env: pd.DataFrame
    claims: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: what the reader should know but need not worry about (values undefined by design)
    remarks: list[str] = field(default_factory=list)


_CLAIMS_NOTE = (
    "Each claim of the study file evaluated over its independent replicates: estimate (a - b, "
    "log a - log b on the log scale, or a slope) with its 95 % t-interval; reproduced: the "
    "interval excludes 0 on the paper's side (and does not lie below the paper's effect, where "
    "one is stated and reachable); contradicted: it lies on the other side, or below the "
    "paper's effect; inconclusive: otherwise (n_needed: the independent replicates that would "
    "resolve it at 80 % power). An equivalent claim is two one-sided tests within its margin. "
    "design: whether replicates shared models (then only the disjoint ones count)."
)
_CLAIM_COLUMNS = ["name", "verdict", "source", "claim", "paper", "test", "expect", "scale"]
_CLAIM_COLUMNS += ["estimate", "ci_low", "ci_high", "n", "effect", "n_needed", "design"]
_CLAIM_COLUMNS += ["lmc_setting", "detail"]


def _claims(
    text: str, plan: list[dict[str, Any]], tidy: pd.DataFrame, pilot: list[Any] | None = None
) -> pd.DataFrame:
    """The study file's claims evaluated on the results (:mod:`lmc.studies.claims.verdicts`)."""
    from lmc.studies.claims.verdicts import evaluate_study_claims

    rows = [r.as_dict() for r in evaluate_study_claims(text, plan, tidy, pilot)]
    return pd.DataFrame(rows)[_CLAIM_COLUMNS] if rows else pd.DataFrame()


def _caption(fig: Any) -> str:
    spec = fig.spec
    text = f"{spec.title or spec.name}: {', '.join(spec.y)}"
    if spec.x:
        text += f" vs {spec.x}"
    text += f" ({spec.kind}, stage {spec.stage}; mean over seeds, 95 % CI)"
    if fig.fit:
        text += "; fit " + ", ".join(f"{k} = {v:.4g}" for k, v in fig.fit.items())
    return text


def _write_html(path: Path, c: _Content, tables: dict[str, Path]) -> None:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(c.name)}: lmc study report</title><style>{_CSS}</style></head>",
        f"<body><h1>Study {html.escape(c.name)}</h1><p>{html.escape(c.status_line)}</p>",
    ]
    if len(c.claims):  # the verdicts first: what the study is for
        parts.append(f"<h2>Claims</h2><p class='note'>{_CLAIMS_NOTE}</p>")
        parts.append(_html_table(c.claims, "claims"))
    parts += [f"<p class='bad'>{html.escape(n)}</p>" for n in c.notes]
    parts += [f"<p class='note'>{html.escape(n)}</p>" for n in c.remarks]
    parts.append("<h2>Figures</h2>")
    if not c.figures:
        parts.append(f"<p class='note'>{_NO_FIGURE}</p>")
    for fig in c.figures:
        parts.append(
            f"<figure data-name='{html.escape(fig.spec.name)}'>{_svg(fig.svg)}"
            f"<figcaption>{html.escape(_caption(fig))}</figcaption></figure>"
        )
    parts.append(f"<h2>Summary over seeds</h2><p class='note'>{_SUMMARY_NOTE}</p>")
    for stage, table in summary_sections(c.summary):
        parts.append(f"<h3>Stage {html.escape(stage)}</h3>")
        parts.append(_html_table(table, f"summary:{stage}"))
    if c.summary.empty:
        parts.append("<p>No metric yet.</p>")
    parts.append("<h2>Failed jobs</h2>")
    parts.append(_html_table(c.failed, "failed") if not c.failed.empty else "<p>None.</p>")
    parts.append("<h2>Wall time per stage</h2>" + _html_table(c.times, "stages"))
    parts.append("<h2>Grid</h2>" + _html_table(c.grid, "grid"))
    parts.append(f"<h2>Study file</h2><pre>{html.escape(c.study_text)}</pre>")
    parts.append("<h2>Environment</h2>" + _html_table(c.env, "environment"))
    files = ", ".join(f"tables/{p.name}" for p in tables.values())
    parts.append(f"<p class='note'>Data: {html.escape(files)}.</p></body></html>")
    atomic_write(path, lambda f: f.write("\n".join(parts)), mode="w")


def _write_md(path: Path, c: _Content, out: Path) -> None:
    lines = [f"# Study {c.name}", "", c.status_line, ""]
    lines += [f"**{n}**\n" for n in c.notes]
    lines += [f"{n}\n" for n in c.remarks]
    if len(c.claims):
        lines += ["## Claims\n", _CLAIMS_NOTE + "\n", _md_table(c.claims)]
    lines.append("## Figures\n")
    for fig in c.figures:
        rel = fig.png.relative_to(out) if fig.png.is_relative_to(out) else fig.png
        lines.append(
            f"![{fig.spec.name}]({rel})\n\n{_caption(fig)} (PDF: "
            f"{rel.with_suffix('.pdf')}, data: {rel.with_suffix('.csv')})\n"
        )
    if not c.figures:
        lines.append(f"_{_NO_FIGURE}_\n")
    lines += ["## Summary over seeds\n", _SUMMARY_NOTE + "\n"]
    for stage, table in summary_sections(c.summary):
        lines += [f"### Stage {stage}\n", _md_table(table)]
    if c.summary.empty:
        lines.append("_(none)_\n")
    lines += ["## Failed jobs\n", _md_table(c.failed) if not c.failed.empty else "None.\n"]
    lines += ["## Wall time per stage\n", _md_table(c.times)]
    lines += ["## Grid\n", _md_table(c.grid)]
    lines += ["## Study file\n", "```yaml", c.study_text.rstrip(), "```", ""]
    lines += ["## Environment\n", _md_table(c.env)]
    atomic_write(path, lambda f: f.write("\n".join(lines)), mode="w")
