"""Claims evaluated on synthetic results with known answers: a clear effect, a clear
contradiction, an underpowered case, trends, a fit; bad claims refused before any job."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lmc.studies import StudyError
from lmc.studies.claims.declared import parse_claims
from lmc.studies.claims.verdicts import evaluate_claims, replicates_needed, verdict

RATE = "rate"
SEEDS = [0, 1, 2, 3, 4]
# a plain study: one train stage, a grid over rate and seed
STUDY = {
    "name": "s",
    "train": {"config": "x.yaml", "grid": {RATE: [0.0, 0.1, 0.2, 0.3], "seed_everything": SEEDS}},
}
VALUES = {"train": {RATE: [0.0, 0.1, 0.2, 0.3], "seed_everything": SEEDS}}


def table(values: dict[float, list[float]], metric: str = "m") -> pd.DataFrame:
    rows = [
        {
            "stage": "train",
            "job": f"j{r}_{s}",
            RATE: r,
            "seed_everything": s,
            "metric": metric,
            "value": v,
        }
        for r, vs in values.items()
        for s, v in zip(SEEDS, vs)
    ]
    return pd.DataFrame(rows)


def claim(**kw) -> dict:
    return {
        "name": "c",
        "claim": "text",
        "source": "000 Table 1",
        "stage": "train",
        "metric": "m",
        **kw,
    }


def evaluate(raw: dict, tidy: pd.DataFrame):
    (result,) = evaluate_claims(parse_claims([raw], STUDY, VALUES), tidy)
    return result


def diff(expect: str, effect: float | None = None) -> dict:
    raw = claim(
        test="difference", a={"where": {RATE: 0.1}}, b={"where": {RATE: 0.0}}, expect=expect
    )
    if effect is not None:
        raw["effect"] = effect
    return raw


BASE = [1.0, 1.2, 0.9, 1.1, 1.05]


def test_a_clear_effect_is_reproduced_paired_over_seeds():
    # every seed lower by 0.3 +- 0.01: the paired interval is tight around -0.3
    tidy = table({0.0: BASE, 0.1: [b - 0.3 + 0.01 * (i % 2) for i, b in enumerate(BASE)]})
    r = evaluate(diff("less"), tidy)
    assert r.verdict == "reproduced" and r.n == 5
    assert r.estimate == pytest.approx(-0.3 + 0.004) and r.ci_high < 0 and r.n_needed is None
    assert "paired" in r.detail


def test_a_clear_effect_the_other_way_is_contradicted():
    tidy = table({0.0: BASE, 0.1: [b + 0.3 for b in BASE]})
    assert evaluate(diff("less"), tidy).verdict == "contradicted"


def test_an_underpowered_case_is_inconclusive_with_the_replicates_it_needs():
    # differences -0.1 +- 0.2: the interval holds 0 and the paper's effect -0.3
    d = [-0.3, 0.1, -0.25, 0.05, -0.1]
    tidy = table({0.0: BASE, 0.1: [b + x for b, x in zip(BASE, d)]})
    r = evaluate(diff("less", effect=-0.3), tidy)
    assert r.verdict == "inconclusive" and r.ci_low < -0.3 < 0 < r.ci_high
    sd = float(np.std(d, ddof=1))
    expected = replicates_needed(float(np.mean(d)), sd, -0.3)
    assert r.n_needed == expected and 5 < expected < 100
    # the number it names has 80 % power to exclude the paper's effect (the farther of 0 and
    # it from the observed mean, 0.2), one fewer has not
    from lmc.studies.claims.inference import power

    n = int(expected)
    assert power(n, 0.2, sd) >= 0.8 > power(n - 1, 0.2, sd)


def test_an_interval_around_zero_that_excludes_the_papers_effect_contradicts_it():
    d = [0.01, -0.01, 0.02, -0.02, 0.0]
    tidy = table({0.0: BASE, 0.1: [b + x for b, x in zip(BASE, d)]})
    assert evaluate(diff("less", effect=-0.3), tidy).verdict == "contradicted"
    assert evaluate(diff("less"), tidy).verdict == "inconclusive"


def test_verdict_rules():
    assert verdict(0.1, 0.2, +1, None) == "reproduced"
    assert verdict(-0.2, -0.1, +1, None) == "contradicted"
    assert verdict(-0.1, 0.2, +1, 0.15) == "inconclusive"
    assert verdict(-0.1, 0.2, +1, 0.5) == "contradicted"
    assert verdict(math.nan, math.nan, +1, None) == "inconclusive"


def test_trends_increasing_and_peaked():
    rng = np.random.default_rng(0)
    up = {r: [10 * r + 0.01 * rng.standard_normal() for _ in SEEDS] for r in VALUES["train"][RATE]}
    r = evaluate(claim(test="trend", x=RATE, expect="increasing"), table(up))
    assert r.verdict == "reproduced" and r.estimate == pytest.approx(10, abs=0.1)
    assert (
        evaluate(claim(test="trend", x=RATE, expect="decreasing"), table(up)).verdict
        == "contradicted"
    )
    peak = {
        0.0: [0.0] * 5,
        0.1: [1.0, 1.1, 0.9, 1.0, 1.05],
        0.2: [0.5, 0.6, 0.4, 0.5, 0.55],
        0.3: [0.1, 0.0, 0.05, 0.1, 0.0],
    }
    r = evaluate(claim(test="trend", x=RATE, expect="peaked"), table(peak))
    assert r.verdict == "reproduced" and r.extra["peak_x"] == 0.1
    # a monotone rise is no peak: the best interior point is below the last
    assert (
        evaluate(claim(test="trend", x=RATE, expect="peaked"), table(up)).verdict == "contradicted"
    )
    # a part of the axis: the rise after the peak's fall is no valley over 0.1-0.3 alone
    raw = claim(test="trend", x=RATE, x_values=[0.1, 0.2, 0.3], expect="decreasing")
    assert evaluate(raw, table(peak)).verdict == "reproduced"
    # the paper's peak position, where given, is used instead of the best interior mean
    r = evaluate(claim(test="trend", x=RATE, expect="peaked", peak=0.2), table(peak))
    assert r.extra["peak_x"] == 0.2 and r.verdict == "reproduced"


def test_a_metric_template_trend_over_n():
    rows = []
    for n, acc in ((2, 0.90), (4, 0.92), (8, 0.95)):
        for s in SEEDS:
            rows.append(
                {
                    "stage": "train",
                    "job": f"j{s}",
                    RATE: 0.0,
                    "seed_everything": s,
                    "metric": f"stemm/n{n}/acc",
                    "value": acc + 0.001 * s,
                }
            )
    raw = claim(
        test="trend",
        metric="stemm/n{x}/acc",
        x="n",
        x_values=[2, 4, 8],
        expect="increasing",
        where={RATE: 0.0},
    )
    r = evaluate(raw, pd.DataFrame(rows))
    assert r.verdict == "reproduced" and r.estimate > 0


def test_exponential_fit_recovers_its_slope():
    h = np.linspace(-2, 0, 20)
    rows = []
    for i, x in enumerate(h):
        for metric, v in (("H", x), ("L", math.exp(3.0 * x + 0.5) * (1 + 0.01 * (-1) ** i))):
            rows.append(
                {
                    "stage": "train",
                    "job": f"j{i}",
                    RATE: 0.0,
                    "seed_everything": 0,
                    "metric": metric,
                    "value": v,
                }
            )
    rows.append(
        {
            "stage": "train",
            "job": "zero",
            RATE: 0.0,
            "seed_everything": 0,
            "metric": "L",
            "value": 0.0,
        }
    )
    rows.append(
        {
            "stage": "train",
            "job": "zero",
            RATE: 0.0,
            "seed_everything": 0,
            "metric": "H",
            "value": -1.0,
        }
    )
    raw = {
        "name": "fit",
        "claim": "exp",
        "source": "000 Fig. 2",
        "test": "fit",
        "stage": "train",
        "x": "H",
        "y": "L",
        "expect": "increasing",
        "min_r2": 0.9,
    }
    r = evaluate(raw, pd.DataFrame(rows))
    assert r.verdict == "reproduced" and r.estimate == pytest.approx(3.0, abs=0.02)
    assert r.extra["r2"] > 0.99 and r.extra["left_out"] == 1 and r.n == 20


def test_ordering():
    tidy = table({0.0: [3.0] * 5, 0.1: [2.0, 2.1, 1.9, 2.0, 2.05], 0.2: [1.0, 1.1, 0.9, 1.0, 1.0]})
    cells = [{"where": {RATE: r}} for r in (0.0, 0.1, 0.2)]
    assert (
        evaluate(claim(test="ordering", cells=cells, expect="descending"), tidy).verdict
        == "reproduced"
    )
    assert (
        evaluate(claim(test="ordering", cells=cells, expect="ascending"), tidy).verdict
        == "contradicted"
    )


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (
            diff("less") | {"a": {"where": {"width": 3}}},
            r"'width', not a coordinate.*its keys: rate, seed_everything",
        ),
        (
            diff("less") | {"a": {"where": {RATE: 0.7}}},
            r"rate=0.7 is not a value the study runs; its values: \[0.0, 0.1",
        ),
        (diff("less") | {"a": {"where": {}}}, "must fix every coordinate.*add rate"),
        (
            diff("less") | {"stage": "merge"},
            "stage 'merge' is not a stage of the study; its stages: train",
        ),
        (diff("sideways"), "expects one of greater, less"),
        (diff("less") | {"test": "vibes"}, "unknown test 'vibes'"),
        (diff("less") | {"colour": 1}, "unknown key 'colour'"),
        (claim(test="trend", x="seed", expect="increasing"), "fixes|not a coordinate"),
    ],
)
def test_bad_claims_are_refused_naming_the_problem(raw, match):
    with pytest.raises(StudyError, match=match):
        parse_claims([raw], STUDY, VALUES)


def test_a_claim_reading_a_metric_nobody_reports_lists_what_is_there():
    with pytest.raises(StudyError, match=r"reads 'm'.*it produces: other"):
        evaluate_claims(
            parse_claims([diff("less")], STUDY, VALUES),
            table({0.0: BASE, 0.1: BASE}, metric="other"),
        )


def test_a_study_with_claims_runs_reports_and_prints_them(tmp_path, capsys):
    """The tiny teacher-student study with ``barrier: abs_chord`` and two claims: the report and
    ``lmc study claims`` give the paired difference recomputed here from the results table."""
    from lmc.cli import main
    from lmc.studies import run_study
    from lmc.studies.reporting.results import results
    from tests.studies.conftest import WIDTH, tiny_study, width_claim, write_study

    claims = [
        width_claim(),
        width_claim(
            name="abs_at_least_chord",
            claim="the abs_chord barrier is never below the chord barrier",
            source="definition",
            metric="barrier_loss_abs_chord_matched",
            a={"where": {WIDTH: 8}},
            b={"metric": "barrier_loss_chord_matched", "where": {WIDTH: 8}},
            expect="greater",
        ),
    ]
    study = tiny_study(barrier="abs_chord", claims=claims)
    study["train"]["grid"]["seed_everything"] = [0, 1, 2]
    path = write_study(tmp_path, study)
    run_study(path, tmp_path / "s", log=lambda _: None)
    tidy = results(tmp_path / "s")
    rows = tidy[tidy.metric == "barrier_loss_matched"]
    by = {(r[WIDTH], r["seed_everything"]): r["value"] for _, r in rows.iterrows()}
    d = [by[(8, s)] - by[(4, s)] for s in (1, 2)]
    rows = tidy[tidy.metric.isin(["barrier_loss_matched", "barrier_loss_abs_chord_matched"])]
    same = rows.pivot_table(index="job", columns="metric", values="value")
    assert (same.iloc[:, 0] == same.iloc[:, 1]).all()  # abs_chord is the reported barrier

    main(["study", "claims", str(tmp_path / "s"), "--json"])
    out = capsys.readouterr().out
    import json

    first, second = json.loads(out[out.index("[") :])
    # both pairs hold seed 0 (reference: 0): only the first is independent
    assert first["estimate"] == pytest.approx(d[0]) and first["n"] == 1
    assert first["design"].startswith("shared endpoints: 1 of 2 replicates kept")
    assert first["verdict"] in ("reproduced", "contradicted", "inconclusive")
    assert second["estimate"] >= 0
    main(["study", "report", str(tmp_path / "s")])
    report = tmp_path / "s" / "report"
    assert (report / "tables" / "claims.csv").is_file()
    assert "<h2>Claims</h2>" in (report / "report.html").read_text()
    main(["study", "claims", str(tmp_path / "s")])
    assert "wider_is_flatter: " in capsys.readouterr().out


def test_a_key_zipped_with_the_x_axis_varies_with_it():
    """003's learning rate is zipped with the width: a trend over the width leaves it free,
    found from the plan (the width determines it); a key crossed with the width must be fixed."""
    from lmc.studies.claims.declared import plan_ties, plan_values

    jobs = [
        {"stage": "train", "coordinates": {"w": w, "lr": lr, "act": a, "seed_everything": s}}
        for w, lr in ((2, 0.2), (4, 0.2), (8, 0.1))
        for a in ("relu", "tanh")
        for s in (0, 1)
    ]
    values, ties = plan_values(jobs), plan_ties(jobs)
    assert "lr" in ties["train"]["w"] and "act" not in ties["train"]["w"]
    study = {
        "name": "s",
        "train": {"config": "x", "grid": {"w": [2, 4, 8], "seed_everything": [0, 1]}},
    }
    raw = claim(test="trend", x="w", expect="increasing", where={"act": "relu"})
    (parsed,) = parse_claims([raw], study, values, ties)
    assert parsed.cells[0].where == {"act": "relu"}
    with pytest.raises(StudyError, match="add act"):
        parse_claims([claim(test="trend", x="w", expect="increasing")], study, values, ties)


def test_a_cell_without_results_yet_is_inconclusive_not_an_error():
    """A study still running: the claim's cells have no rows yet (an empty boolean mask must not
    select columns)."""
    tidy = table({0.0: BASE, 0.1: BASE})
    r = evaluate(diff("less"), tidy[tidy[RATE] == 0.0])
    assert r.verdict == "inconclusive" and r.n == 0
    for expect in ("increasing", "peaked"):
        r = evaluate(claim(test="trend", x=RATE, expect=expect), tidy.iloc[:0])
        assert r.verdict == "inconclusive" and r.n == 0
    r = evaluate(claim(test="trend", x=RATE, expect="peaked"), tidy[tidy[RATE] < 0.3])
    assert r.verdict == "inconclusive" and "not every x has results yet" in r.detail


def test_a_claim_without_values_says_its_jobs_are_not_done():
    """Issue 46's new bad-input check: a claim whose jobs were pending or damaged read 'no
    number of replicates resolves it', a statement about a spread there was not."""
    from lmc.studies.claims.verdicts import ClaimResult, format_claims

    empty = ClaimResult(
        "c", "003 §4", "x falls", "", "difference", "less", "inconclusive", n=0, n_needed=math.inf
    )
    text = format_claims([empty])
    assert "no values yet: its jobs are pending, failed or damaged" in text
    assert "no number of replicates" not in text
