"""benchmarks/study.py on the tiny study: the first `lmc study run` is SIGKILLed after one job
is done, the rerun completes it, the jobs done before the kill are untouched and those killed
mid-way are redone; its last line holds the key=value results."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from tests.helpers import REPO
from tests.studies.conftest import WIDTH, tiny_study, write_study


def _env(tmp_path) -> dict[str, str]:
    # a W&B service of this pytest process (WANDB_SERVICE*) is not the subprocesses' to share
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_SERVICE")}
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        folder = tmp_path / "wandb" / var.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[var] = str(folder)
    return {**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def test_the_study_benchmark_kills_reruns_and_reports(tmp_path):
    study = tiny_study()
    args = study["train"]["args"]
    # a few seconds per train job: the kill lands while jobs run (the benchmark also waits
    # for a job in flight before it kills)
    args[args.index("--trainer.max_epochs=1")] = "--trainer.max_epochs=100"
    study["figures"] = [
        {
            "name": "barrier_vs_width",
            "kind": "line",
            "stage": "barrier",
            "x": WIDTH,
            "y": ["barrier_loss_matched", "barrier_loss_naive"],
        }
    ]
    path = write_study(tmp_path, study)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "study.py"),
            "--study",
            str(path),
            "--dir",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--kill-after",
            "1",
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    values = dict(pair.split("=", 1) for pair in last.split())
    assert int(values["jobs"]) == 6, last
    assert int(values["resumed_jobs_redone"]) >= 1, proc.stdout
    for key in (
        "barrier_matched_small_width",
        "barrier_matched_large_width",
        "barrier_naive_small_width",
        "barrier_naive_large_width",
    ):
        assert math.isfinite(float(values[key])), last
    for key in ("study_minutes", "job_overhead_s", "startup_s"):
        assert math.isfinite(float(values[key])), last
    assert "matched barrier falls with width: " in proc.stdout
    # the report the rerun wrote at its end, with the declared figure
    assert int(values["report_figures"]) == 1, last
    html = tmp_path / "out" / "report" / "report.html"
    assert int(values["report_html_bytes"]) == html.stat().st_size > 10_000
    assert (tmp_path / "out" / "plan.json").is_file()  # a given --dir is kept
