"""The docs' Reproductions table is generated from the studies' claim results
(docs/reproductions/claims.json): no number in it is typed by hand."""

from __future__ import annotations

import json
import math

from benchmarks.reproductions import CLAIMS_JSON, PAGE, page_table, render


def test_the_docs_table_is_the_rendering_of_the_claim_results():
    data = json.loads(CLAIMS_JSON.read_text())
    assert data["schema"] == "lmc.reproductions" and data["studies"]
    assert page_table(PAGE.read_text()) == render(data), (
        "docs/reproductions.md's table differs from docs/reproductions/claims.json: "
        "run `python benchmarks/reproductions.py` to regenerate it"
    )
    verdicts = {c["verdict"] for s in data["studies"] for c in s["claims"]}
    assert verdicts <= {"reproduced", "contradicted", "inconclusive"}


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
        "**inconclusive** (about 14 replicates would resolve it) |"
    )
    claim.update(verdict="inconclusive", n_needed=math.inf, estimate=math.nan)
    data["studies"][0]["jobs_done"] = 7
    row = render(data).splitlines()[-1]
    assert "(7 of 10 jobs done)" in row and "= n/a [" in row
    assert "no number of replicates resolves it" in row
    claim.update(n=0, n_needed=math.nan)
    row = render(data).splitlines()[-1]
    assert "no results yet (a = x; b = y)" in row and row.endswith("| **inconclusive** |")


def test_merging_replaces_the_studies_evaluated_again_and_keeps_the_others_in_order():
    from benchmarks.reproductions import merge

    def study(name, scale, verdict):
        return {"name": name, "scale": scale, "claims": [{"verdict": verdict}]}

    old = {
        "schema": "lmc.reproductions",
        "version": 1,
        "studies": [study("000_init_scale", "cpu", "reproduced"), study("003_width", "paper", "x")],
    }
    new = {
        "schema": "lmc.reproductions",
        "version": 1,
        "studies": [study("003_overlap", "paper", "new"), study("003_width", "paper", "again")],
    }
    merged = merge(old, new)
    assert [(s["scale"], s["name"], s["claims"][0]["verdict"]) for s in merged["studies"]] == [
        ("cpu", "000_init_scale", "reproduced"),
        ("paper", "003_width", "again"),
        ("paper", "003_overlap", "new"),
    ]
