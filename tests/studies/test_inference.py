"""The statistics of a claim's verdict against scipy and against closed-form cases: a shared
reference design, a log-scale effect, an equivalence, an unreachable effect, the replicates
needed at 80 % power."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmc.studies import StudyError
from lmc.studies.claims import inference as inf
from lmc.studies.claims.declared import parse_claims
from lmc.studies.claims.verdicts import evaluate_claims

X = [0.31, -0.12, 0.45, 0.08, 0.27, 0.19]
Y = [0.02, 0.11, -0.05, 0.2, 0.07]


def test_intervals_equal_scipys_on_the_same_numbers():
    mean = inf.mean_interval(X)
    t = stats.t.ppf(0.975, len(X) - 1) * np.std(X, ddof=1) / math.sqrt(len(X))
    assert (mean.lo, mean.hi) == pytest.approx((np.mean(X) - t, np.mean(X) + t), rel=1e-12)
    assert mean.df == len(X) - 1 and mean.spread == pytest.approx(np.std(X, ddof=1))
    ci = stats.ttest_ind(X, Y, equal_var=False).confidence_interval(0.95)
    welch = inf.welch_interval(X, Y)
    assert (welch.lo, welch.hi) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert welch.estimate == pytest.approx(np.mean(X) - np.mean(Y))
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    fit = stats.linregress(xs, X)
    slope, intercept, r2 = inf.slope_interval(xs, X)
    half = stats.t.ppf(0.975, 4) * fit.stderr
    assert (slope.lo, slope.hi) == pytest.approx((fit.slope - half, fit.slope + half))
    assert intercept == pytest.approx(fit.intercept) and r2 == pytest.approx(fit.rvalue**2)


def test_the_replicates_needed_at_80_percent_power_are_the_textbook_ones():
    # a one-sample (paired) t test, two-sided 5 %, power 80 %: n = 10 for d = 1, 34 for
    # d = 0.5 (Cohen 1988; G*Power gives the same)
    assert inf.replicates_needed(1.0, 1.0) == 10
    assert inf.replicates_needed(0.5, 1.0) == 34
    assert inf.power(10, 1.0, 1.0) >= 0.8 > inf.power(9, 1.0, 1.0)
    assert inf.replicates_needed(0.0, 1.0) == math.inf
    # a large noncentrality (a tight spread): scipy's noncentral t cdf gives NaN in the other
    # tail, which once stopped the search at n = 2 (power 0.59 there, 0.9997 at n = 3)
    assert inf.power(2, 0.00121, 0.000163) == pytest.approx(0.59, abs=0.01)
    assert inf.replicates_needed(0.00121, 0.000163) == 3
    assert math.isnan(inf.replicates_needed(1.0, 0.0))


def test_verdict_rule_is_symmetric_around_the_papers_effect():
    # the effect excluded gives contradicted on either side of 0 ...
    assert inf.verdict(-0.2, 0.05, -1, -0.3) == "contradicted"
    assert inf.verdict(-0.2, -0.05, -1, -0.3) == "contradicted"
    # ... and the interval holding it gives reproduced or inconclusive by the direction
    assert inf.verdict(-0.4, -0.05, -1, -0.3) == "reproduced"
    assert inf.verdict(-0.4, 0.05, -1, -0.3) == "inconclusive"
    assert inf.verdict(0.05, 0.2, -1, None) == "contradicted"
    assert inf.verdict(-0.5, -0.4, -1, -0.3) == "reproduced"  # beyond the paper's effect


# ------------------------------------------------------------------ claims on synthetic results

SEEDS = list(range(8))
STUDY = {"name": "s", "train": {"config": "x.yaml", "grid": {"seed_everything": SEEDS}}}
PAIR_VALUES = {"barrier": {"w": [8, 128], "seed_everything": SEEDS[1:]}}


def pairs_table(matched, naive, ends, width=128) -> pd.DataFrame:
    """Barrier rows per partner seed 1..n: ``ends`` maps a seed to its pair's two models."""
    rows = []
    for metric, values in (("barrier_loss_matched", matched), ("barrier_loss_naive", naive)):
        for seed, v in zip(SEEDS[1:], values):
            rows.append(
                {
                    "stage": "barrier",
                    "job": f"b{width}_{seed}",
                    "w": width,
                    "seed_everything": seed,
                    "endpoints": " ".join(ends(seed)),
                    "metric": metric,
                    "value": v,
                }
            )
    return pd.DataFrame(rows)


def evaluate(raw: dict, tidy: pd.DataFrame, values=None):
    base = {"name": "c", "claim": "text", "source": "003 §4", "stage": "barrier"}
    base["replicate"] = "seed_everything"
    (claim,) = parse_claims([{**base, **raw}], STUDY, values or PAIR_VALUES)
    (result,) = evaluate_claims([claim], tidy)
    return result


LOWER = {
    "test": "difference",
    "a": {"metric": "barrier_loss_matched", "where": {"w": 128}},
    "b": {"metric": "barrier_loss_naive", "where": {"w": 128}},
    "expect": "less",
}


def test_a_shared_reference_design_is_analysed_on_its_disjoint_pairs():
    rng = np.random.default_rng(0)
    matched = list(0.01 + 0.001 * rng.standard_normal(7))
    naive = list(0.2 + 0.01 * rng.standard_normal(7))
    star = evaluate(LOWER, pairs_table(matched, naive, lambda s: ["t0", f"t{s}"]))
    # seed 0 is in every pair: one pair only is independent, too few for an interval
    assert star.n == 1 and star.verdict == "inconclusive"
    assert star.design.startswith("shared endpoints: 1 of 7 replicates kept")
    disjoint = evaluate(LOWER, pairs_table(matched, naive, lambda s: [f"t{s}", f"u{s}"]))
    assert disjoint.n == 7 and disjoint.verdict == "reproduced"
    assert disjoint.design == "independent replicates"
    assert disjoint.estimate == pytest.approx(np.mean(np.subtract(matched, naive)))


def test_a_thousandfold_effect_is_decided_on_the_log_scale():
    # two independent pairs, the matched barrier ~2000 times below the naive one, each within a
    # factor of 3: on the raw scale (1 degree of freedom) the interval holds 0
    matched, naive = [3e-5, 1.6e-4], [0.12, 0.21]
    tidy = pairs_table(matched, naive, lambda s: [f"t{s}", f"u{s}"])
    tidy = tidy[tidy.seed_everything <= 2]
    raw = evaluate(LOWER, tidy)
    assert raw.verdict == "inconclusive" and raw.ci_low < 0 < raw.ci_high
    log = evaluate({**LOWER, "scale": "log"}, tidy)
    d = np.log(matched) - np.log(naive)
    half = stats.t.ppf(0.975, 1) * np.std(d, ddof=1) / math.sqrt(2)
    assert log.scale == "log" and log.n == 2 and log.verdict == "reproduced"
    assert (log.estimate, log.ci_low, log.ci_high) == pytest.approx(
        (d.mean(), d.mean() - half, d.mean() + half)
    )
    assert "geometric" in log.detail


def test_an_equivalence_is_two_one_sided_tests_within_the_margin():
    base = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.15]
    same = {"test": "equivalent", "a": {"metric": "test/loss", "where": {"w": 8}}}
    same["b"] = {"metric": "test/loss", "where": {"w": 128}}

    def tidy(shift, noise):
        rows = []
        for w, add in ((8, shift), (128, 0.0)):
            for i, (s, v) in enumerate(zip(SEEDS[1:], base)):
                value = v + add + (noise * (-1) ** i if w == 8 else 0.0)
                rows.append(
                    {"stage": "barrier", "job": f"j{w}_{s}", "w": w, "seed_everything": s}
                    | {"endpoints": f"t{s}", "metric": "test/loss", "value": value}
                )
        return pd.DataFrame(rows)

    eq = evaluate({**same, "margin": 0.1}, tidy(0.01, 0.01))
    d = np.array([0.01 + 0.01 * (-1) ** i for i in range(7)])
    ci90 = stats.ttest_1samp(d, 0).confidence_interval(0.90)
    assert eq.verdict == "reproduced" and eq.expect == "equal"
    assert f"[{ci90.low:.4g}, {ci90.high:.4g}]" in eq.detail
    assert evaluate({**same, "margin": 0.1}, tidy(0.5, 0.01)).verdict == "contradicted"
    assert evaluate({**same, "margin": 0.1}, tidy(0.05, 0.3)).verdict == "inconclusive"
    # a relative margin on the log scale is a fold change: 10 % is log(1.1)
    rel = evaluate({**same, "margin": "10%", "scale": "log"}, tidy(0.01, 0.0))
    assert rel.extra["margin"] == pytest.approx(math.log(1.1)) and rel.verdict == "reproduced"


def test_an_unreachable_effect_is_left_out_and_a_relative_one_is_in_the_studys_units():
    values = {"barrier": {"lr": [0.0, 0.001], "seed_everything": SEEDS[1:]}}
    rows = []
    rng = np.random.default_rng(1)
    for lr, mean in ((0.0, 0.087), (0.001, 0.09)):
        for s in SEEDS[1:]:
            rows.append(
                {"stage": "barrier", "job": f"j{lr}_{s}", "lr": lr, "seed_everything": s}
                | {"metric": "barrier_loss_matched", "value": mean + 0.05 * rng.standard_normal()}
            )
    tidy = pd.DataFrame(rows)
    claim = {
        "test": "difference",
        "metric": "barrier_loss_matched",
        "a": {"where": {"lr": 0.001}},
        "b": {"where": {"lr": 0.0}},
        "expect": "less",
        "effect": -0.102,  # the paper's fall is larger than the study's starting barrier
    }
    r = evaluate(claim, tidy, values)
    assert r.ci_low < 0 < r.ci_high and r.verdict == "inconclusive"
    assert "out of reach" in r.detail and r.effect is None
    # "falls by at least 60 %" is -0.6 times b's mean here: reachable, and excluded
    rel = evaluate({**claim, "effect": "-60%"}, tidy, values)
    b_mean = tidy[tidy.lr == 0.0].value.mean()
    assert rel.effect == pytest.approx(-0.6 * b_mean) and rel.verdict == "contradicted"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            {"test": "trend", "x": "w", "expect": "decreasing", "scale": "log"}
            | {"metric": "entropy/layers.0"},
            "reads 'entropy/layers.0' on scale: log",
        ),
        ({"scale": "cubic"}, "scale 'cubic'; valid scales: raw, log"),
        ({"scale": "log", "effect": -0.1}, "on scale: log the effect is a fold change"),
        ({"effect": "-150%"}, "not a relative change above -100 %"),
        ({"margin": 0.1}, "`margin` belongs to an equivalent claim"),
        ({"test": "equivalent", "expect": "equal"}, "needs a `margin`"),
        ({"test": "trend", "x": "w", "expect": "decreasing", "effect": "-10%"}, "relative effect"),
    ],
)
def test_bad_scales_effects_and_margins_are_refused_before_any_job(extra, match):
    values = {"barrier": {"w": [8, 16, 128], "seed_everything": SEEDS[1:]}}
    raw = {**LOWER, "metric": "barrier_loss_matched", **extra}
    if raw["test"] == "trend":
        raw.pop("a"), raw.pop("b")
    base = {"name": "c", "claim": "text", "source": "003 §4", "stage": "barrier"}
    base["replicate"] = "seed_everything"
    with pytest.raises(StudyError, match=match.replace("(", r"\(").replace("[", r"\[")):
        parse_claims([{**base, **raw}], STUDY, values)


def test_a_power_law_exponent_is_the_log_log_slope_and_a_bound_on_it_decides():
    widths = [16, 32, 64, 128]
    values = {"barrier": {"w": widths, "seed_everything": SEEDS[1:]}}
    rng = np.random.default_rng(3)
    rows = [
        {"stage": "barrier", "job": f"j{w}_{s}", "w": w, "seed_everything": s}
        | {
            "metric": "barrier_loss_matched",
            "value": w**-1.5 * math.exp(0.1 * rng.standard_normal()),
        }
        for w in widths
        for s in SEEDS[1:]
    ]
    rate = {
        "test": "trend",
        "metric": "barrier_loss_matched",
        "x": "w",
        "expect": "decreasing",
        "scale": "log",
        "xscale": "log",
    }
    r = evaluate(rate, pd.DataFrame(rows), values)
    assert r.estimate == pytest.approx(-1.5, abs=0.1) and r.verdict == "reproduced"
    assert "over log x" in r.detail
    # "at least as fast as w^-1/2": reproduced; "at least as fast as w^-3": contradicted
    assert evaluate({**rate, "effect": -0.5}, pd.DataFrame(rows), values).verdict == "reproduced"
    assert evaluate({**rate, "effect": -3.0}, pd.DataFrame(rows), values).verdict == "contradicted"


def test_the_two_stage_design_combines_its_stages_by_the_inverse_normal_method():
    pilot, second = [0.4, 0.9, 0.1, 0.7, 0.5], [0.3, 0.8, 0.6, 0.2]
    p1 = stats.ttest_1samp(pilot, 0, alternative="greater").pvalue
    p2 = stats.ttest_1samp(second, 0, alternative="greater").pvalue
    z = (stats.norm.isf(p1) + stats.norm.isf(p2)) / math.sqrt(2)
    verdict, combined = inf.two_stage_verdict(pilot, second, +1)
    assert combined == pytest.approx(z) and verdict == "reproduced"
    assert inf.two_stage_verdict(pilot, second, -1)[0] == "contradicted"
    # the second stage: what 80 % power at the pilot's mean and spread needs, within the budget
    noisy = [0.5, -0.3, 0.2, -0.1, 0.4]
    first = inf.mean_interval(noisy)
    need = inf.replicates_needed(abs(first.estimate), first.spread)
    assert inf.stage_replicates(noisy, 1000) == need - 5
    assert inf.stage_replicates(noisy, 12) == 7  # capped: 12 in all
    assert inf.stage_replicates(pilot, 20) == 2  # resolved already: the least a stage can be
    assert inf.stage_replicates(pilot, 5) == 0
