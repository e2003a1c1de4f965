"""The docs' Reproductions page is recomputed from the studies' committed results
(docs/reproductions/results/): no number in it is typed by hand and no verdict is read back; a
forged verdict or a forged result fails the check. The page counts the verdicts per paper, then
gives each paper its section, each study its claims table (verdict first) and its figures."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import Counter

import pytest

import benchmarks.reproductions as reproductions
from benchmarks.reproductions import CLAIMS_JSON, EVIDENCE, FIGURES, PAGE, page_table, render
from lmc.studies import StudyError

VERDICT_ROW = '| <span class="verdict '


def rows(block: str) -> list[str]:
    """The claims rows of a rendered block (their first cell a verdict)."""
    return [line for line in block.splitlines() if line.startswith(VERDICT_ROW)]


def test_every_verdict_is_recomputed_from_the_committed_results(capsys):
    reproductions.main(["--check"])  # exits 1 on any difference
    line = capsys.readouterr().out.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in line.split())
    assert int(figures["claims"]) > 0 and figures["recomputed_equal"] == figures["claims"]
    data = json.loads(CLAIMS_JSON.read_text())
    assert page_table(PAGE.read_text()) == render(data)
    for study in data["studies"]:  # each row says when, where and from what it ran
        assert study["ran"]["date"] and study["ran"]["lmc_commit"] and study["ran"]["device"]


def test_a_forged_verdict_fails_the_check(tmp_path, monkeypatch, capsys):
    data = json.loads(CLAIMS_JSON.read_text())
    claim = data["studies"][0]["claims"][0]
    claim["verdict"] = "reproduced" if claim["verdict"] != "reproduced" else "contradicted"
    claim["ci_low"], claim["ci_high"] = 0.1, 0.2  # with an interval to match
    forged = tmp_path / "claims.json"
    forged.write_text(json.dumps(data))
    monkeypatch.setattr(reproductions, "CLAIMS_JSON", forged)
    with pytest.raises(SystemExit) as exit_:
        reproductions.main(["--check"])
    assert exit_.value.code == 1
    assert "differs from the verdicts recomputed" in capsys.readouterr().out


def test_numbers_are_compared_to_a_relative_tolerance_and_everything_else_exactly():
    """Another numpy/pandas may sum in another order (the 16th digit), never more."""
    same = reproductions.same_values
    claim = {"verdict": "reproduced", "n": 6, "estimate": -0.0012520689655173012, "p": math.nan}
    assert same(claim, {**claim, "estimate": -0.0012520689655173053})
    assert not same(claim, {**claim, "estimate": -0.00125207})  # a 1e-6 change
    assert not same(claim, {**claim, "verdict": "contradicted"})
    assert not same(claim, {**claim, "n": 7})
    assert not same(claim, {**claim, "p": 0.5})
    assert not same(claim, {k: v for k, v in claim.items() if k != "n"})


def test_a_forged_result_fails_naming_the_study_and_the_file(tmp_path):
    base = tmp_path / "results"
    shutil.copytree(EVIDENCE, base)
    csv = sorted(base.glob("*/*.csv"))[0]
    lines = csv.read_text().splitlines()
    head, value = lines[1].rsplit(",", 1)
    lines[1] = f"{head},{float(value or 0) + 1.0}"
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(StudyError, match=f"study '.*': .*{csv.name} does not match the hash"):
        reproductions.recompute_all(base)


def test_a_row_shows_the_estimate_interval_replicates_and_verdict():
    claim = {
        "name": "c",
        "source": "000 Table 1",
        "claim": "pruning lowers the barrier",
        "paper": "0.10 -> 0.07",
        "test": "difference",
        "expect": "less",
        "verdict": "inconclusive",
        "estimate": -0.0123,
        "ci_low": -0.05,
        "ci_high": 0.025,
        "n": 3,
        "effect": None,
        "n_needed": 14.0,
        "detail": "a = x; b = y",
        "extra": {},
    }
    study = {"name": "000_pruning", "scale": "cpu", "file": "configs/studies/000_pruning.yaml"}
    data = {"studies": [{**study, "jobs": 10, "jobs_done": 10, "claims": [claim]}]}
    block = render(data, figures=[])
    assert rows(block) == [
        '| <span class="verdict inconclusive">inconclusive</span><br><small>about 14 '
        "independent replicates would resolve it at 80 % power</small> | pruning lowers the "
        "barrier (0.10 -> 0.07)<br><small>000 Table 1</small> | a − b = -0.0123 [-0.05, 0.025], "
        "n = 3<br><small>a = x; b = y</small> |"
    ]
    # the study's line under its heading: file and scale, then the jobs still missing
    assert "#### 000_pruning\n\n`configs/studies/000_pruning.yaml` · CPU scale\n" in block
    claim.update(verdict="inconclusive", n_needed=math.inf, estimate=math.nan)
    data["studies"][0]["jobs_done"] = 7
    block = render(data, figures=[])
    (row,) = rows(block)
    assert "· 7 of 10 jobs done\n" in block and "= n/a [" in row
    assert "no number of replicates resolves it" in row
    claim.update(n=0, n_needed=math.nan)
    (row,) = rows(render(data, figures=[]))
    assert row.startswith('| <span class="verdict inconclusive">inconclusive</span> | ')
    assert row.endswith("| no results yet<br><small>a = x; b = y</small> |")


def test_a_log_scale_row_shows_the_fold_change_the_design_and_a_setting_apart():
    claim = {
        "name": "c",
        "source": "003 §4",
        "claim": "matched below naive",
        "paper": "",
        "test": "difference",
        "expect": "less",
        "verdict": "reproduced",
        "estimate": math.log(0.001),
        "ci_low": math.log(0.0005),
        "ci_high": math.log(0.002),
        "n": 2,
        "effect": None,
        "n_needed": None,
        "detail": "d",
        "extra": {},
        "scale": "log",
        "design": "shared endpoints: 2 of 4 replicates kept, those with disjoint models (x)",
        "lmc_setting": "1 round instead of 9",
    }
    study = {"name": "s", "scale": "cpu", "file": "f.yaml", "jobs": 1, "jobs_done": 1}
    data = {"studies": [{**study, "claims": [claim]}]}
    (row,) = rows(render(data, figures=[]))
    assert "a / b = 0.001 [0.0005, 0.002], n = 2<br><small>shared endpoints: 2 of 4" in row
    assert row.startswith(
        '| <span class="verdict reproduced">reproduced</span><br><small>lmc\'s setting, not the '
        "paper's (1 round instead of 9): not counted</small> | "
    )
    figures = reproductions.counts(data)
    assert figures["reproduced"] == 0 and figures["lmc_setting"] == 1


def test_a_row_says_which_lmc_ran_it_and_why_it_is_still_open():
    ran = {"lmc_commit": "f" * 40, "lmc_commits_run": ["unrecorded", "a" * 40 + "+uncommitted"]}
    assert reproductions._commits(ran) == "ran at lmc unrecorded, aaaaaaa+uncommitted"
    assert reproductions._commits({"lmc_commit": "b" * 40}) == "kept at lmc bbbbbbb"
    claim = {"verdict": "inconclusive", "n": 28, "n_needed": 268.0}
    spent = {**claim, "design": "two stages (replicates: auto): 8 pilot and 20 added"}
    assert reproductions._verdict(spent) == (
        '<span class="verdict inconclusive">inconclusive</span><br><small>replicates: auto '
        "spent its budget; about 268 independent replicates would resolve it at the pooled "
        "mean</small>"
    )
    assert "beyond the budget of 20" in reproductions._verdict(claim)
    # counted as resolvable within the budget only where more replicates than it has would do
    study = {"studies": [{"scale": "cpu", "name": "s", "claims": [
        {**claim, "name": "a", "n_needed": 12.0, "n": 3},
        {**claim, "name": "b", "n_needed": 12.0, "n": 20},
        {**claim, "name": "c"},
    ]}]}  # fmt: skip
    assert reproductions.counts(study)["inconclusive_resolvable_within_budget"] == 1


def test_the_page_counts_the_verdicts_per_paper_then_gives_each_paper_its_section():
    data = json.loads(CLAIMS_JSON.read_text())
    block = render(data)
    lines = block.splitlines()
    assert lines[0] == "### Verdicts by paper"  # before any detail
    table = lines[lines.index("") + 1 : lines.index("", lines.index("") + 1)]
    assert table[0].startswith("| Paper | ") and "lmc's setting" in table[0]
    per_paper = {
        re.sub(r"\[(.*)\]\(.*\)", r"\1", cells[0]): [int(c) for c in cells[1:]]
        for cells in (row.strip("| ").split(" | ") for row in table[2:])
    }
    assert list(per_paper) == ["000", "002", "003", "004", "ZipIt!", "all"]
    totals = reproductions.counts(data)
    assert per_paper["all"] == [
        totals[k] for k in ("reproduced", "contradicted", "inconclusive", "lmc_setting")
    ]
    assert [sum(v[i] for k, v in per_paper.items() if k != "all") for i in range(4)] == (
        per_paper["all"]
    )
    sections = [line for line in lines if line.startswith("### ")][1:]
    assert [s.split(":")[0] for s in sections] == ["### 000", "### 002", "### 003", "### 004"] + [
        "### ZipIt!"
    ]
    # each study under its paper's heading, with its claims table, as many rows as claims
    assert len(rows(block)) == sum(len(s["claims"]) for s in data["studies"])
    for study in data["studies"]:
        paper = "ZipIt!" if study["name"].startswith("zipit") else study["name"][:3]
        heading = f"#### {study['name']}" + (" (paper scale)" if study["scale"] == "paper" else "")
        assert heading in lines
        above = [s for s in sections if lines.index(s) < lines.index(heading)][-1]
        assert above.startswith(f"### {paper}")


def test_each_paper_section_gives_the_reference_of_the_references_page():
    references = (PAGE.parent / "references.md").read_text()
    block = page_table(PAGE.read_text())
    for paper in reproductions.PAPERS.values():
        assert paper["reference"] in references
        assert paper.get("code", "") in references
        line = f"[Reference](references.md#{paper['anchor']}): {paper['reference']}"
        assert line + (f" Code: <{paper['code']}>" if paper.get("code") else "") in block


def test_every_committed_figure_is_shown_on_the_page_exactly_once():
    images = re.findall(
        r"!\[((?:\\.|[^\]\\])*)\]\((reproductions/[^)\s]+\.png)\)", PAGE.read_text()
    )
    shown = Counter(png for _, png in images)
    committed = {f"reproductions/{p.name}" for p in FIGURES.glob("*.png")}
    assert committed and set(shown) == committed
    assert all(n == 1 for n in shown.values()), shown
    assert all(alt.strip() for alt, _ in images)  # each with its alt text


def test_a_figure_is_shown_under_the_study_that_declares_it():
    data = json.loads(CLAIMS_JSON.read_text())
    found, unmatched = reproductions.match_figures(
        data,
        [
            "reproductions/004_stemm_acc_vs_n.png",  # 004_merge_n's stemm_acc_vs_n
            "reproductions/000_pruning_entropy_vs_rate.png",  # 000_pruning, not 000_pruning_vgg
            "reproductions/002_robust_aligned_along_t.png",  # 002_robust_curves
            "reproductions/000_nothing_declares_this.png",
        ],
    )
    assert [png for png, _ in found[("004_merge_n", "cpu")]] == [
        "reproductions/004_stemm_acc_vs_n.png"
    ]
    assert ("000_pruning", "cpu") in found and ("000_pruning_vgg", "cpu") not in found
    assert ("002_robust_curves", "cpu") in found
    assert unmatched == ["reproductions/000_nothing_declares_this.png"]
    block = render(data, figures=["reproductions/004_stemm_acc_vs_n.png"])
    study = block.split("#### 004_merge_n", 1)[1].split("####", 1)[0]
    assert "](reproductions/004_stemm_acc_vs_n.png)](reproductions/004_stemm_acc_vs_n.png)" in study
