"""A study's report: one self-contained HTML file and a Markdown twin with the declared
figures, the summary over seeds, failed jobs and the environment; opened in a real browser
(headless Chromium) where one is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lmc.cli import main
from lmc.studies import StudyError
from lmc.studies.reporting.report import shown_summary, summary_sections, write_report
from tests.studies.conftest import WIDTH, copy_run

FIGURES = [
    {
        "name": "barrier_vs_width",
        "kind": "line",
        "stage": "barrier",
        "x": WIDTH,
        "y": ["barrier_loss_matched", "barrier_loss_naive"],
        "xlabel": "student width (neurons)",
        "ylabel": "loss barrier",
        "references": [{"x": 4, "y": 0.0, "label": "003: none at the teacher width"}],
    },
    {
        "name": "matched_path",
        "kind": "curve",
        "stage": "barrier",
        "series": "matched",
        "y": ["test/loss"],
    },  # fmt: skip
    {
        "name": "train_loss",
        "kind": "heatmap",
        "stage": "train",
        "x": WIDTH,
        "rows": "seed_everything",
        "y": ["train/loss"],
    },  # fmt: skip
]


def with_figures(tiny_run, tmp_path, figures=FIGURES) -> Path:
    """A copy of the tiny study's folder whose study file declares ``figures``."""
    out = copy_run(tiny_run, tmp_path)
    study = yaml.safe_load((out / "study.yaml").read_text())
    study["figures"] = figures
    (out / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    return out


def _set_failed(out: Path, stage: str, error: str = "RuntimeError: boom") -> int:
    n = 0
    for path in (out / "jobs" / stage).glob("*/job.json"):
        record = json.loads(path.read_text())
        record.update(status="failed", error=error)
        path.write_text(json.dumps(record))
        n += 1
    return n


def test_report_has_every_figure_table_and_the_study(tiny_run, tmp_path):
    out = with_figures(tiny_run, tmp_path)
    report = write_report(out)
    assert report.html == out / "report" / "report.html"
    text = report.html.read_text()
    assert len(report.figures) == 3 and text.count("<svg") == 3
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert "src=" not in text.replace("<svg", "")  # nothing loaded from elsewhere
    assert yaml.safe_load((out / "study.yaml").read_text())["name"] == "tiny"
    assert "name: tiny" in text  # the study file, verbatim
    # the summary over seeds: one table per stage, rows grouped by metric, the stage's own
    # coordinates as columns, no column that is empty there (issue 31 item 7)
    tables = dict(re.findall(r"<table data-name='summary:(\w+)' data-rows='(\d+)'", text))
    assert set(tables) == {"train", "barrier"} and all(int(n) > 0 for n in tables.values())
    barrier = text.split("data-name='summary:barrier'")[1].split("</thead>")[0]
    heads = re.findall(r"<th class='l'>([^<]+)</th>", barrier)
    assert heads[:3] == ["metric", "model.init_args.net.init_args.width", "n"], heads
    assert "stage" not in heads and "n_failed" not in heads and "seed_everything" not in heads
    csv = pd.read_csv(out / "report" / "tables" / "summary.csv")
    metrics = list(dict(summary_sections(shown_summary(csv)))["barrier"].metric)
    runs = [m for i, m in enumerate(metrics) if i == 0 or metrics[i - 1] != m]
    assert len(runs) == len(set(metrics)) > 1  # each metric's rows together
    assert "<h2>Failed jobs</h2>\n<p>None.</p>" in text
    md = report.markdown.read_text()
    for fig in report.figures:
        assert f"]({fig.png.relative_to(out / 'report')})" in md and fig.png.stat().st_size > 0
        assert fig.pdf.read_bytes().startswith(b"%PDF")
    assert "```yaml\nname: tiny" in md
    assert (out / "report" / "tables" / "summary.csv").is_file()
    # a regression's accuracy is undefined in every job: left out, not flagged (issue 31)
    assert "barrier_acc_matched" in (out / "report" / "tables" / "summary.csv").read_text()
    assert "barrier_acc_matched" not in md and "barrier_loss_matched" in md
    assert not any("non-finite" in note for note in report.notes)
    # logged copies and wall times stay in the CSV, out of the table a person reads
    csv = (out / "report" / "tables" / "summary.csv").read_text()
    assert "interp/alpha" in csv and "matching_seconds" in csv
    summary_md = md.split("## Summary over seeds")[1].split("\n## ")[0]
    assert "interp/" not in summary_md and "_seconds" not in summary_md
    assert "barrier_loss_matched" in summary_md and "test/loss" in summary_md


def test_failed_jobs_are_reported_with_their_error(tiny_run, tmp_path):
    out = with_figures(tiny_run, tmp_path, figures=FIGURES[:1])
    _set_failed(out, "barrier", "RuntimeError: the barrier job broke")
    report = write_report(out)
    text = report.html.read_text()
    assert "the barrier job broke" in text and "2 job(s) failed" in text
    # no done barrier job: the barrier figure has no metric to draw -> it is named, not guessed
    # (the figure's stage has no done job)


def test_a_study_with_every_job_failed_still_gets_a_report(tiny_run, tmp_path):
    out = with_figures(tiny_run, tmp_path)
    assert _set_failed(out, "train") + _set_failed(out, "barrier") == 6
    report = write_report(out)
    text = report.html.read_text()
    assert "no job of the study is done (6 planned)" in text and not report.figures
    assert text.count("boom") == 6


def test_an_unknown_metric_is_named_before_anything_is_written(tiny_run, tmp_path):
    bad = [{**FIGURES[0], "y": ["barrier_los_matched"]}]
    out = with_figures(tiny_run, tmp_path, figures=bad)
    with pytest.raises(StudyError, match="barrier_los_matched.*barrier_loss_matched"):
        write_report(out)
    assert not (out / "report").exists()


def test_a_folder_that_is_no_study_is_refused(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(StudyError, match="no study folder: it has no study.yaml"):
        main(["study", "report", str(tmp_path)])


def test_lmc_study_report_command(tiny_run, tmp_path, capsys):
    out = with_figures(tiny_run, tmp_path)
    main(["study", "report", str(out), "--out", str(tmp_path / "elsewhere")])
    printed = capsys.readouterr().out
    assert f"report: {tmp_path / 'elsewhere' / 'report.html'} (3 figures)" in printed


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium here (apt-get install chromium); the browser test needs it")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    return path


@pytest.mark.browser
def test_report_renders_in_a_real_browser(tiny_run, tmp_path):
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    out = with_figures(tiny_run, tmp_path)
    report = write_report(out)
    page_url = report.html.resolve().as_uri()
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=chromium,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        try:
            page = context.new_page()
            page.set_viewport_size({"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_url, wait_until="load", timeout=60_000)
            boxes = [svg.bounding_box() for svg in page.query_selector_all("figure svg")]
            rows = page.eval_on_selector(
                "table[data-name='summary:barrier']", "t => t.tBodies[0].rows.length"
            )
            declared = int(page.get_attribute("table[data-name='summary:barrier']", "data-rows"))
            grid_rows = page.eval_on_selector(
                "table[data-name='grid']", "t => t.tBodies[0].rows.length"
            )
            # issue 31: wide tables were cut at 1280 px; now the page keeps the window's width
            # and a table wider than its box scrolls inside it
            page.eval_on_selector(  # a cell far wider than the window, as 003_width's were
                "table[data-name='summary:barrier'] td",
                "td => { td.textContent = 'x'.repeat(600) }",
            )
            page_width = page.evaluate("document.documentElement.scrollWidth")
            boxes_fit = page.eval_on_selector_all(
                "div.tablebox", "bs => bs.every(b => b.getBoundingClientRect().right <= 1280)"
            )
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            context.close()
    assert not errors, errors
    assert set(requests) == {page_url}, requests  # nothing leaves the file
    assert len(boxes) == 3 and all(b and b["width"] > 50 and b["height"] > 50 for b in boxes)
    assert rows == declared > 0
    assert grid_rows == 4  # train: width, seed; barrier: width, seed
    assert shot.stat().st_size > 10_000
    assert page_width <= 1280 and boxes_fit
    if os.environ.get("LMC_ARTIFACTS"):
        shutil.copy(shot, Path(os.environ["LMC_ARTIFACTS"]) / "report_screenshot.png")


def test_a_read_only_study_folder_is_one_line(tiny_run, tmp_path, monkeypatch, capsys):
    """Issue 31: `lmc study report` on a read-only folder ended in a 35-line traceback."""
    import errno
    import tempfile

    out = copy_run(tiny_run, tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.delenv("LMC_DEBUG", raising=False)
    from lmc.cli.study import study_main

    with pytest.raises(SystemExit) as exit_:
        study_main(["report", str(out)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lmc study: error: cannot write ")
    assert "is read-only" in err[0]


def test_the_report_opens_with_the_verdicts_and_undefined_normalised_barriers_are_a_remark(
    tiny_run, tmp_path
):
    from tests.studies.conftest import tiny_study, width_claim

    out = copy_run(tiny_run, tmp_path)
    (out / "study.yaml").write_text(yaml.safe_dump(tiny_study(claims=[width_claim()])))
    # one barrier job as 003_width's: endpoints at loss ~0, so the normalised barrier is
    # undefined (null in summary.json, listed in nonfinite); another's barrier diverged
    records = sorted((out / "jobs" / "barrier").glob("*/lmc/*/summary.json"))
    assert len(records) == 2
    for path, key in zip(records, ("barrier_loss_normalized_matched", "barrier_loss_matched")):
        record = json.loads(path.read_text())
        record["summary"][key] = None
        record["nonfinite"] = [*record.get("nonfinite", []), f"/summary/{key}"]
        path.write_text(json.dumps(record))
    report = write_report(out)
    text = report.html.read_text()
    bad = re.findall(r"<p class='bad'>([^<]+)</p>", text)
    assert len(bad) == 1 and "barrier_loss_matched" in bad[0] and "normalized" not in bad[0]
    assert report.notes == [bad[0].replace("&#x27;", "'")]
    assert text.index("<h2>Claims</h2>") < text.index("<p class='bad'>")
    assert "1 normalised barrier(s) are undefined" in text  # said once, calmly
    assert "class='note'>1 normalised barrier(s)" in text
