"""``replicates: auto``: a pilot, then the seeds the claims need within a budget, the claims
decided by the two-stage test; bad designs refused before any job."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmc.studies import StudyError, load_study, run_study
from lmc.studies.claims import inference as inf
from lmc.studies.claims.verdicts import study_claims
from lmc.studies.reporting.results import results
from tests.studies.conftest import WIDTH, tiny_study, width_claim, write_study

AUTO = {"auto": True, "budget": 8}


def auto_study(**changes) -> dict:
    study = tiny_study(claims=[width_claim()], replicates=AUTO)
    study["train"]["grid"]["seed_everything"] = [0, 1, 2, 3]  # the pilot: two disjoint pairs
    del study["evaluate"][0]["pairs"]["reference"]  # disjoint pairs, the default
    return study | changes


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"replicates": {"auto": True}}, "replicates: auto needs a budget"),
        ({"replicates": {"auto": True, "budget": 4}}, "must be an integer above the pilot's 4"),
        (
            {"replicates": {"auto": True, "budget": 8, "key": "lr"}},
            "'lr' is not a key of the train",
        ),
        ({"replicates": {"auto": False, "budget": 8}}, "auto: true is its one mode"),
        ({"replicates": {"auto": True, "budget": 8, "pilot": 2}}, "unknown key 'pilot'"),
        ({"claims": []}, "declares none"),
        (
            {"claims": [width_claim(test="equivalent", margin=0.1, expect="equal")]},
            "claims are all equivalent or fit claims, which it cannot size",
        ),
    ],
)
def test_a_design_auto_cannot_size_is_refused_before_any_job(tmp_path, change, match):
    with pytest.raises(StudyError, match=match):
        load_study(write_study(tmp_path, auto_study(**change)))


def test_the_pilot_then_the_seeds_the_claims_need_decided_by_two_stages(tmp_path, capsys):
    equal = width_claim(name="as_flat", test="equivalent", margin=0.1, expect="equal")
    path = write_study(tmp_path, auto_study(claims=[width_claim(), equal]))
    lines: list[str] = []
    run_study(path, tmp_path / "out", log=lines.append)
    state = json.loads((tmp_path / "out" / "replicates.json").read_text())
    assert state["pilot"] == [0, 1, 2, 3] and state["budget"] == 8
    added = state["added"]
    assert added == list(range(4, 4 + len(added))) and len(added) % 2 == 0 and len(added) <= 4
    assert any(line.startswith("replicates: auto: the pilot's 4 values") for line in lines)
    assert (
        "replicates: auto: 4 values of seed_everything are the pilot; once its jobs are "
        "done, up to 4 more as the claims need (80 % power), at most 8 in all" in lines
    )
    # the second stage's jobs ran: every seed trained, a barrier per disjoint pair
    tidy = results(tmp_path / "out")
    seeds = set(tidy[tidy.stage == "train"].seed_everything)
    assert seeds == set(range(4 + len(added)))
    claim, pilot_only = study_claims(tmp_path / "out")
    # an equivalence takes no two-stage test: decided on the pilot's two pairs alone
    assert pilot_only.n == 2 and pilot_only.design.startswith("the pilot's replicates alone")
    assert any("as_flat: decided on the pilot alone (equivalent test)" in x for x in lines)
    assert added  # two pairs leave this claim far from 80 % power: the budget's 4 more seeds
    if added:  # decided by the inverse-normal combination of the stages' own t tests
        rows = tidy[tidy.metric == "barrier_loss_matched"]
        by = {(r[WIDTH], r.seed_everything): r.value for _, r in rows.iterrows()}
        d = np.array([by[(8, s)] - by[(4, s)] for s in range(1, 4 + len(added), 2)])
        first = np.array([s < 4 for s in range(1, 4 + len(added), 2)])
        expected, z = inf.two_stage_verdict(d[first], d[~first], -1)
        assert claim.verdict == expected and claim.design.startswith("two stages")
        assert f"z = {z:.3g}" in claim.design
    from lmc.cli import main

    main(["study", "status", str(tmp_path / "out")])
    assert "replicates: auto: pilot 4 values of seed_everything, 4 added (budget 8)" in (
        capsys.readouterr().out
    )
    # a second run finds everything done and decides nothing again
    again = run_study(path, tmp_path / "out", log=lambda _: None)
    assert not again.ran and json.loads((tmp_path / "out" / "replicates.json").read_text()) == state


DATA_SEED = "data.init_args.seed"


def trial_study(**replicates) -> dict:
    """Trials: one data seed (and teacher) per trial, two models each, the barrier of each
    trial's pair; the claim's replicates are the trials."""
    study = tiny_study(
        claims=[width_claim(replicate=DATA_SEED)],
        grid={WIDTH: [4, 8], DATA_SEED: [0, 0, 1, 1], "seed_everything": [0, 1, 2, 3]},
        zip=[[DATA_SEED, "seed_everything"]],
        replicates={"auto": True, "budget": 4, "key": DATA_SEED, **replicates},
    )
    study["evaluate"][0]["pairs"] = {"over": [WIDTH, DATA_SEED], "vary": "seed_everything"}
    return study


@pytest.mark.parametrize(
    ("fresh", "match"),
    [
        (None, r"retrain the first trial's models with their seeds; add fresh: \[seed_everything"),
        (["lr"], "'lr' is not a key zipped with 'data.init_args.seed'"),
        ("seed_everything", "must be a list of train grid keys"),
    ],
)
def test_a_trial_key_needs_its_models_seeds_renewed(tmp_path, fresh, match):
    changes = {} if fresh is None else {"fresh": fresh}
    with pytest.raises(StudyError, match=match):
        load_study(write_study(tmp_path, trial_study(**changes)))
    plain = auto_study(replicates={**AUTO, "fresh": ["seed_everything"]})
    with pytest.raises(StudyError, match="is not zipped with any: drop fresh"):
        load_study(write_study(tmp_path, plain))


def test_an_added_trial_copies_the_first_with_new_data_and_model_seeds(tmp_path):
    path = write_study(tmp_path, trial_study(fresh=["seed_everything"]))
    assert load_study(path).replicates.pilot == (0, 1)  # a trial's value once
    run_study(path, tmp_path / "out", log=lambda _: None)
    state = json.loads((tmp_path / "out" / "replicates.json").read_text())
    # the budget's two trials, each the first trial's two rows with new data and model seeds
    assert state["pilot"] == [0, 1] and state["added"] == [2, 3]
    assert state["append"] == {DATA_SEED: [2, 2, 3, 3], "seed_everything": [4, 5, 6, 7]}
    tidy = results(tmp_path / "out")
    trained = tidy[tidy.stage == "train"][[DATA_SEED, "seed_everything"]].drop_duplicates()
    assert sorted(map(tuple, trained.to_numpy().tolist())) == [
        (0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (2, 5), (3, 6), (3, 7)
    ]  # fmt: skip
    rows = tidy[tidy.metric == "barrier_loss_matched"]
    by = {(r[WIDTH], r[DATA_SEED]): r.value for _, r in rows.iterrows()}
    d = np.array([by[(8, t)] - by[(4, t)] for t in range(4)])
    expected, z = inf.two_stage_verdict(d[:2], d[2:], -1)
    (claim,) = study_claims(tmp_path / "out")
    assert claim.verdict == expected and claim.n == 4
    assert claim.design.startswith("two stages (replicates: auto): 2 pilot and 2 added")
