"""The calibration benchmark's quick mode: on synthetic results with a known truth the claim
engine's wrong verdicts stay at the 5 % its intervals promise, and a claim planned for 80 %
power resolves at that rate (benchmarks/calibration.py; the full run uses 4,000 simulations)."""

from __future__ import annotations

from benchmarks.calibration import mc_se, rates

SIMS = 200


def test_error_rates_on_null_data_and_power_at_the_planned_replicates():
    got = rates(SIMS, seed=0)
    # a bound of the nominal rate plus three Monte-Carlo standard errors: a miscalibrated engine
    # (e.g. a 90 % interval, or all of a shared reference's pairs counted) is far beyond it
    bound = 0.05 + 3 * mc_se(0.05, SIMS)
    assert got["false_verdict_rate_null"] <= bound
    assert got["false_verdict_rate_log"] <= bound
    assert got["false_verdict_rate_shared"] <= bound
    assert got["false_equivalence_rate"] <= bound
    assert got["false_verdict_rate_auto"] <= bound  # the adaptive two-stage design
    assert got["resolved_rate_auto"] >= 0.80 - 3 * mc_se(0.80, SIMS)
    assert got["resolved_rate_at_power"] >= 0.80 - 3 * mc_se(0.80, SIMS)
    # the naive analysis of the shared-reference pairs (as if independent) is not calibrated:
    # what the engine's disjoint-pairs analysis guards against
    assert got["false_verdict_rate_shared_naive"] > 0.5
