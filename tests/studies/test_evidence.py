"""A study's evidence kept beside its verdicts: the results its claims read and their
provenance, exported from a study folder and read back; every verdict recomputed from them
equals the one computed on the folder, and an edited table or study file is refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from lmc.studies import StudyError
from lmc.studies.claims.evidence import export_evidence, read_evidence, recompute, study_hash
from lmc.studies.claims.verdicts import study_claims
from tests.studies.conftest import WIDTH, copy_run, tiny_study, width_claim, write_study

CLAIMS = [
    width_claim(),
    width_claim(
        name="wider_tests_better",
        claim="a wider student has a lower test loss",
        stage="train",
        metric="test/loss",
        scale="log",
    ),
]


@pytest.fixture
def exported(tiny_run, tmp_path):
    out = copy_run(tiny_run, tmp_path)
    # the committed file: the run's study file with claims (claims are analysis: same hash)
    committed = write_study(tmp_path / "configs", tiny_study(claims=CLAIMS), "tiny.yaml")
    (out / "study.yaml").write_text(committed.read_text())
    csv = tmp_path / "evidence" / "tiny.csv"
    provenance = export_evidence(out, csv, committed)
    return out, committed, csv, provenance


def test_verdicts_recomputed_from_the_committed_table_equal_the_folders(exported):
    out, committed, csv, provenance = exported
    record = json.loads(provenance.read_text())
    assert record["study"] == "tiny" and record["study_sha256"] == study_hash(committed.read_text())
    for key in ("lmc_commit", "date", "device", "versions", "datasets", "results_sha256"):
        assert record[key] or key == "datasets"  # synthetic data: no dataset files
    assert record["claimed_jobs"] == record["claimed_jobs_done"] == 6
    # the commit the study ran at, recorded in plan.json by the run itself
    (ran,) = record["lmc_commits_run"]
    assert ran == json.loads((out / "plan.json").read_text())["runs"][0]["lmc_commit"]
    assert ran.split("+")[0] == record["lmc_commit"].split("+")[0]
    table = pd.read_csv(csv)
    assert list(table.columns) == ["stage", "job", WIDTH, "seed_everything", "endpoints"] + [
        "metric",
        "value",
    ]
    assert set(table.metric) == {"barrier_loss_matched", "test/loss"}  # only what claims read
    again = [r.as_dict() for r in recompute(csv, committed)]
    assert again == [r.as_dict() for r in study_claims(out)]
    assert again[1]["scale"] == "log" and again[1]["n"] == 2


def test_an_edited_table_or_study_file_is_refused_naming_the_study_and_the_file(exported):
    _, committed, csv, _ = exported
    text = csv.read_text().splitlines()
    last = text[-1].rsplit(",", 1)
    text[-1] = f"{last[0]},{float(last[1]) * 0.5}"  # a forged value
    csv.write_text("\n".join(text) + "\n")
    with pytest.raises(StudyError, match=r"study 'tiny': .*tiny\.csv does not match the hash"):
        read_evidence(csv)


def test_a_study_file_whose_runs_changed_since_is_refused(exported):
    _, committed, csv, _ = exported
    data = yaml.safe_load(committed.read_text())
    data["train"]["grid"]["seed_everything"] = [0, 1, 2]
    committed.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(StudyError, match="its train/evaluate parts changed"):
        recompute(csv, committed)


def test_exporting_a_folder_that_ran_another_version_is_refused(tiny_run, tmp_path):
    out = copy_run(tiny_run, tmp_path)
    other = tiny_study(claims=CLAIMS)
    other["train"]["grid"][WIDTH] = [4, 16]
    committed = write_study(tmp_path / "configs", other, "tiny.yaml")
    with pytest.raises(StudyError, match="ran another version of"):
        export_evidence(out, tmp_path / "tiny.csv", committed)
