"""The claim engine's error rates on synthetic results with a known truth (issue #47): every
simulated study goes through :func:`lmc.studies.claims.declared.parse_claims` and
:func:`lmc.studies.claims.verdicts.evaluate_claims`, as a study's results do.

Designs, each simulated ``--sims`` times (5 disjoint pairs unless said):

* ``null``: a paired difference with no effect: a ``reproduced`` or ``contradicted`` verdict is
  wrong (the rate should be at most 5 %: a two-sided 95 % interval);
* ``null_log``: the same on the log scale, values log-normal;
* ``null_shared``: no effect, but the pairs share one reference model whose own error enters
  every pair (``reference: 0``): analysed as the engine does (on the pairs with disjoint
  models), and, for comparison, naively over all pairs (``false_verdict_rate_shared_naive``,
  which the shared error inflates);
* ``power``: a true effect of one standard deviation per replicate at the replicates
  :func:`lmc.studies.claims.inference.replicates_needed` plans for 80 % power (10): the rate of
  ``reproduced`` should be at least 80 %;
* ``equivalence_null``: the true difference at the margin (not equivalent): a ``reproduced``
  (equivalent) verdict is wrong, at most 5 %;
* ``auto``: the adaptive two-stage design ``replicates: auto`` is built on
  (:func:`lmc.studies.claims.inference.two_stage_verdict`): a pilot of 5 replicates, then as many
  as 80 % power at the pilot's mean and spread needs, within a budget of 20 in all, the
  stages combined by the inverse-normal method. On null data its wrong verdicts
  (``false_verdict_rate_auto``) stay at 5 %; a naive t test over both stages
  (``false_verdict_rate_auto_naive``) does not; ``resolved_rate_auto`` is its power at a
  true effect of one standard deviation.

Each rate is printed with its Monte-Carlo standard error ``sqrt(p (1 - p) / sims)``. The last
line: ``false_verdict_rate_null=… resolved_rate_at_power=… false_verdict_rate_shared=…
false_verdict_rate_shared_naive=… false_verdict_rate_log=… false_equivalence_rate=…
false_verdict_rate_auto=… false_verdict_rate_auto_naive=… resolved_rate_auto=…
mc_se_at_5pct=… sims=… device=cpu``. ``--quick`` (400 simulations) runs in a minute; the
default test suite runs 200 (``tests/studies/test_calibration.py``). A study with
``replicates: auto`` runs this design (:mod:`lmc.studies.running.replicates`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmc.studies.claims import inference  # noqa: E402
from lmc.studies.claims.declared import parse_claims  # noqa: E402
from lmc.studies.claims.verdicts import ClaimResult, evaluate_claims  # noqa: E402

STUDY = {"name": "calibration", "train": {"config": "x.yaml", "grid": {"seed_everything": [0]}}}
PAIRS = 5
#: replicates: auto's budget (replicates in all, pilot included)
BUDGET = 20


def _claim(test: str = "difference", **extra) -> dict:
    raw = {
        "name": "c",
        "claim": "a differs from b",
        "source": "simulation",
        "stage": "barrier",
        "metric": "barrier_loss",
        "replicate": "seed_everything",
        "test": test,
        "a": {"where": {"cell": "a"}},
        "b": {"where": {"cell": "b"}},
        **extra,
    }
    if test == "difference":
        raw.setdefault("expect", "less")
    return raw


def _table(a, b, ends) -> pd.DataFrame:
    rows = []
    for cell, values in (("a", a), ("b", b)):
        for i, v in enumerate(values):
            rows.append(
                {
                    "stage": "barrier",
                    "job": f"{cell}{i}",
                    "cell": cell,
                    "seed_everything": i + 1,
                    "endpoints": " ".join(ends(cell, i)),
                    "metric": "barrier_loss",
                    "value": float(v),
                }
            )
    return pd.DataFrame(rows)


def _evaluate(raw: dict, table: pd.DataFrame, n: int) -> ClaimResult:
    values = {"barrier": {"cell": ["a", "b"], "seed_everything": list(range(1, n + 1))}}
    (claim,) = parse_claims([raw], STUDY, values)
    (result,) = evaluate_claims([claim], table)
    return result


def disjoint(cell: str, i: int) -> list[str]:
    """Pair ``i`` of a cell: two models of its own (a's pair i and b's pair i share nothing
    either: different training runs)."""
    return [f"{cell}{2 * i}", f"{cell}{2 * i + 1}"]


def rates(sims: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    wrong = {"null": 0, "log": 0, "shared": 0, "shared_naive": 0, "equivalence": 0}
    resolved = 0
    n_power = 10  # inference.replicates_needed(1.0, 1.0): 80 % power at one sd
    for _ in range(sims):
        # null, raw scale: a and b drawn alike, per-pair noise
        base = rng.normal(1.0, 0.2, PAIRS)
        a, b = base + rng.normal(0, 0.1, PAIRS), base + rng.normal(0, 0.1, PAIRS)
        r = _evaluate(_claim(), _table(a, b, disjoint), PAIRS)
        wrong["null"] += r.verdict != "inconclusive"
        # null, log scale: log-normal barriers spanning orders of magnitude
        base = rng.normal(-5.0, 2.0, PAIRS)
        a = np.exp(base + rng.normal(0, 0.5, PAIRS))
        b = np.exp(base + rng.normal(0, 0.5, PAIRS))
        r = _evaluate(_claim(scale="log"), _table(a, b, disjoint), PAIRS)
        wrong["log"] += r.verdict != "inconclusive"
        # null with a shared reference: the reference model's own error (sd 0.3) enters every
        # pair of a cell alike, the partners' (sd 0.05) each pair
        ref_a, ref_b = rng.normal(0, 0.3), rng.normal(0, 0.3)
        a = 1.0 + ref_a + rng.normal(0, 0.05, PAIRS)
        b = 1.0 + ref_b + rng.normal(0, 0.05, PAIRS)

        def star(cell: str, i: int) -> list[str]:
            return [f"{cell}ref", f"{cell}{i}"]

        r = _evaluate(_claim(), _table(a, b, star), PAIRS)
        wrong["shared"] += r.verdict != "inconclusive"
        naive = _evaluate(_claim(), _table(a, b, disjoint), PAIRS)  # as if independent
        wrong["shared_naive"] += naive.verdict != "inconclusive"
        # power: a true fall of one sd of the paired difference, at 10 pairs
        base = rng.normal(1.0, 0.2, n_power)
        b = base + rng.normal(0, 1 / math.sqrt(2), n_power)
        a = base - 1.0 + rng.normal(0, 1 / math.sqrt(2), n_power)
        r = _evaluate(_claim(), _table(a, b, disjoint), n_power)
        resolved += r.verdict == "reproduced"
        # equivalence at the margin: the true difference is 0.1, the margin 0.1
        base = rng.normal(1.0, 0.2, PAIRS)
        a, b = base + 0.1 + rng.normal(0, 0.05, PAIRS), base + rng.normal(0, 0.05, PAIRS)
        r = _evaluate(_claim("equivalent", margin=0.1), _table(a, b, disjoint), PAIRS)
        wrong["equivalence"] += r.verdict == "reproduced"
    auto = {"wrong": 0, "naive": 0, "resolved": 0}
    for _ in range(sims):
        # the adaptive design on a null claim and on a true effect of one sd, as replicates'
        # values (differences) straight away: what the claim sees once its cells are paired
        pilot = rng.normal(0.0, 1.0, PAIRS)
        second = rng.normal(0.0, 1.0, inference.stage_replicates(pilot, BUDGET))
        auto["wrong"] += inference.two_stage_verdict(pilot, second, -1)[0] != "inconclusive"
        both = inference.mean_interval(np.concatenate([pilot, second]))
        auto["naive"] += inference.verdict(both.lo, both.hi, -1) != "inconclusive"
        pilot = rng.normal(-1.0, 1.0, PAIRS)
        second = rng.normal(-1.0, 1.0, inference.stage_replicates(pilot, BUDGET))
        auto["resolved"] += inference.two_stage_verdict(pilot, second, -1)[0] == "reproduced"
    return {
        "false_verdict_rate_null": wrong["null"] / sims,
        "resolved_rate_at_power": resolved / sims,
        "false_verdict_rate_shared": wrong["shared"] / sims,
        "false_verdict_rate_shared_naive": wrong["shared_naive"] / sims,
        "false_verdict_rate_log": wrong["log"] / sims,
        "false_equivalence_rate": wrong["equivalence"] / sims,
        "false_verdict_rate_auto": auto["wrong"] / sims,
        "false_verdict_rate_auto_naive": auto["naive"] / sims,
        "resolved_rate_auto": auto["resolved"] / sims,
    }


def mc_se(p: float, sims: int) -> float:
    """The Monte-Carlo standard error of a rate ``p`` over ``sims`` simulations."""
    return math.sqrt(p * (1 - p) / sims)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="400 simulations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sims = 400 if args.quick else args.sims
    figures = rates(sims, args.seed)
    for key, value in figures.items():
        print(f"{key}: {value:.4f} ± {mc_se(value, sims):.4f} (Monte-Carlo se)")
    line = {k: f"{v:.4f}" for k, v in figures.items()}
    line |= {"mc_se_at_5pct": f"{mc_se(0.05, sims):.4f}", "sims": str(sims), "device": "cpu"}
    print(" ".join(f"{k}={v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
