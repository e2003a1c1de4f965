"""benchmarks/gpu.py and the CPU proxy of its training figure (issue 30): what can be checked
without a GPU — the parsing of the parts' output, the refusal without CUDA, and the tiny-MLP
step overhead that benchmarks/training.py measures on the CPU."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import gpu
from tests.helpers import copy_shared_mnist


def test_a_part_reports_the_key_values_of_its_last_line_that_has_any():
    text = "noise\nwm_a=1.5 wm_b=nan\ntotal 3 s\n"
    assert gpu.last_line_values(text) == {"wm_a": "1.5", "wm_b": "nan"}
    assert gpu.last_line_values("nothing here\n") == {}


def test_test_counts_come_from_the_junit_xml(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="9" failures="2" '
        'errors="1" skipped="3"></testsuite></testsuites>'
    )
    assert gpu.junit_counts(xml) == {
        "gpu_tests_failed": "3",
        "gpu_tests_passed": "3",
        "gpu_tests_skipped": "3",
    }
    assert gpu.junit_counts(tmp_path / "missing.xml")["gpu_tests_failed"] == "nan"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_the_check_stops_and_says_where_it_runs():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        gpu.main(["--only", "wm"])


def test_the_cpu_proxy_prints_lmc_and_the_plain_loop_per_step(tmp_path, monkeypatch, capsys):
    from benchmarks import training

    monkeypatch.setenv("LMC_DATA_DIR", str(copy_shared_mnist(tmp_path)))
    argv = ["training.py", "--only", "tiny", "--epochs", "2", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    training.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    values = {k: float(v) for k, v in gpu.last_line_values(last).items()}
    assert set(values) == {
        "lmc_epoch_s_tiny",
        "plain_device_epoch_s_tiny",
        "step_overhead_tiny_us_lmc",
        "step_overhead_tiny_us_plain",
        "train_throughput_tiny_vs_device_loop",
    }
    # 108 steps an epoch (55,000 images at batch 512): the per-step figures are the epochs'
    steps = -(-55000 // 512)
    assert values["step_overhead_tiny_us_lmc"] == pytest.approx(
        1e6 * values["lmc_epoch_s_tiny"] / steps, rel=1e-3
    )
    assert all(v > 0 for v in values.values())


def test_the_population_profile_splits_the_run_into_its_phases(tmp_path, monkeypatch, capsys):
    from benchmarks import population_profile

    monkeypatch.setenv("LMC_DATA_DIR", str(copy_shared_mnist(tmp_path)))
    population_profile.main_cli(["--members", "2", "--profile-steps", "2", "--no-warm-up"])
    out = capsys.readouterr().out
    assert "aten::" in out  # the profiler's tables
    values = gpu.last_line_values(out.strip().splitlines()[-1])
    assert values["device"] == "cpu" and values["members"] == "2"
    phases = ["build_s", "instantiate_s", "data_s", "to_device_s", "train_s", "evaluate_s"]
    phases += ["write_s", "replay_s", "other_s", "profile_s"]
    seconds = {k: float(values[k]) for k in ["total_s", *phases, "step_ms"]}
    assert all(seconds[k] > 0 for k in phases[:-3] + ["step_ms"])
    # exclusive phases: they add up to the run's wall time
    assert sum(seconds[k] for k in phases) == pytest.approx(seconds["total_s"], abs=0.01)
    assert seconds["other_s"] >= 0


def test_the_paper_study_part_runs_a_study_and_returns_its_evidence(tmp_path, monkeypatch, capsys):
    """The ``paper_study`` part on a tiny study (a population of 2 MLPs, a barrier between them):
    the study runs to the end, its evidence is exported, and the table and provenance come back
    in the output folder with the study's time and jobs on the last line."""
    import json

    import yaml

    from lmc.studies.claims.evidence import recompute

    data = copy_shared_mnist(tmp_path)
    monkeypatch.setenv("LMC_DATA_DIR", str(data))
    configs = gpu.ROOT / "configs"
    study = {
        "name": "tiny_paper",
        "train": {
            "config": [str(configs / "mnist/mlp.yaml"), str(configs / "loggers/csv.yaml")],
            "grid": {"seed_everything": [0, 1]},
            "population": True,
            "args": [
                "--trainer.max_epochs=1",
                "--trainer.accelerator=cpu",
                "--model.init_args.net.init_args.width=16",
                "--data.init_args.limit_train=512",
                "--data.init_args.alignment_size=256",
            ],
        },
        "evaluate": [
            {
                "name": "barrier",
                "kind": "barrier",
                "config": [
                    str(configs / "mnist/mlp_barrier.yaml"),
                    str(configs / "loggers/csv.yaml"),
                ],
                "pairs": {"vary": "seed_everything", "reference": "consecutive"},
                "args": [
                    "--model.init_args.net.init_args.width=16",
                    "--model.init_args.evaluation.num_alphas=3",
                    "--data.init_args.alignment_size=256",
                    "--model.init_args.evaluation.splits=[test]",
                    "--trainer.accelerator=cpu",
                ],
            }
        ],
        "claims": [
            {
                "name": "matching_lowers_barrier",
                "claim": "x",
                "source": "none",
                "test": "difference",
                "stage": "barrier",
                "a": {"metric": "barrier_loss_matched"},
                "b": {"metric": "barrier_loss_naive"},
                "expect": "less",
            }
        ],
    }
    file = tmp_path / "tiny_paper.yaml"
    file.write_text(yaml.safe_dump(study))
    out, evidence = tmp_path / "out", tmp_path / "evidence"
    values = gpu.paper_study(
        "tiny_paper", out, workers=1, file=file, evidence=evidence, work=tmp_path / "studies"
    )
    assert float(values["paper_study_tiny_paper_s"]) > 0
    assert values["paper_study_tiny_paper_jobs_done"] == "1"  # the jobs its claims read
    assert sorted(p.name for p in out.iterdir()) == ["tiny_paper.csv", "tiny_paper.json"]
    provenance = json.loads((out / "tiny_paper.json").read_text())
    assert provenance["study"] == "tiny_paper" and provenance["device"].startswith("cpu")
    (result,) = recompute(evidence / "paper" / "tiny_paper.csv", file)
    assert result.as_dict()["name"] == "matching_lowers_barrier"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert gpu.last_line_values(last)["paper_study_tiny_paper_jobs_done"] == "1"


def test_the_device_lap_benchmark_checks_exactness_and_prints_its_ratio(capsys):
    """benchmarks/lap_device.py on the CPU at a small size: the auction's exact finish equals
    the host kernel's optimum (it asserts that itself) and the last line has the figures."""
    from benchmarks import lap_device

    values = lap_device.main(["--device", "cpu", "--n", "24", "--batch", "2"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert gpu.last_line_values(last) == values
    assert values["device"] == "cpu" and float(values["lap_device_speedup"]) > 0


def test_the_population_figure_samples_the_sequential_runs_and_separates_the_start_up(tmp_path):
    """``benchmarks/population.py``'s run: 1 of 2 sequential runs timed and doubled, its weights
    its member's, and the per-epoch ratio from the 1-epoch baseline."""
    from benchmarks import population

    base = [*population.student_args(width=4), "--trainer.accelerator=cpu"]
    out = population.run(tmp_path, 2, 2, base, "students", sample=1, baseline_epochs=1)
    assert sorted(p.name for p in tmp_path.iterdir() if "seq" in p.name) == [
        "base_seq0",
        "seq0",
        "warm_seq",
    ]  # seed 1 is not timed: its time is seed 0's
    assert out["max_abs_diff_students"] < 1e-5  # the timed run equals its member
    assert out["many_models_speedup_students"] == pytest.approx(
        out["sequential_s_students"] / out["population_s_students"]
    )
    extra = out["sequential_s_students"] - out["sequential_base_s_students"]
    pop_extra = out["population_s_students"] - out["population_base_s_students"]
    assert out["many_models_epoch_speedup_students"] == pytest.approx(extra / pop_extra)
