"""The docs' Reproductions table is recomputed from the studies' committed results
(docs/reproductions/results/): no number in it is typed by hand and no verdict is read back; a
forged verdict or a forged result fails the check."""

from __future__ import annotations

import json
import math
import shutil

import pytest

import benchmarks.reproductions as reproductions
from benchmarks.reproductions import CLAIMS_JSON, EVIDENCE, PAGE, page_table, render
from lmc.studies import StudyError


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
    row = render(data).splitlines()[-1]
    assert row == (
        "| 000_pruning (`configs/studies/000_pruning.yaml`) | 000 Table 1 | pruning lowers the "
        "barrier (0.10 -> 0.07) | a − b = -0.0123 [-0.05, 0.025], n = 3 (a = x; b = y) | "
        "**inconclusive** (about 14 independent replicates would resolve it at 80 % power) |"
    )
    claim.update(verdict="inconclusive", n_needed=math.inf, estimate=math.nan)
    data["studies"][0]["jobs_done"] = 7
    row = render(data).splitlines()[-1]
    assert "(7 of 10 jobs done)" in row and "= n/a [" in row
    assert "no number of replicates resolves it" in row
    claim.update(n=0, n_needed=math.nan)
    row = render(data).splitlines()[-1]
    assert "no results yet (a = x; b = y)" in row and row.endswith("| **inconclusive** |")


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
    row = render(data).splitlines()[-1]
    assert "a / b = 0.001 [0.0005, 0.002], n = 2; shared endpoints: 2 of 4" in row
    assert row.endswith(
        "**reproduced**; lmc's setting, not the paper's (1 round instead of 9): not counted |"
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
        "**inconclusive** (replicates: auto spent its budget; about 268 independent replicates "
        "would resolve it at the pooled mean)"
    )
    assert "beyond the budget of 20" in reproductions._verdict(claim)
    # counted as resolvable within the budget only where more replicates than it has would do
    study = {"studies": [{"scale": "cpu", "name": "s", "claims": [
        {**claim, "name": "a", "n_needed": 12.0, "n": 3},
        {**claim, "name": "b", "n_needed": 12.0, "n": 20},
        {**claim, "name": "c"},
    ]}]}  # fmt: skip
    assert reproductions.counts(study)["inconclusive_resolvable_within_budget"] == 1
