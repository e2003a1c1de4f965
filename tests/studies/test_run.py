"""Running a tiny study: all jobs finish, reruns skip done jobs, a killed job is redone, a
failing job is recorded, the lock and the study name guard the folder, results are one table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmc.cli import main
from lmc.studies import StudyError, StudyStore, run_study, status
from lmc.studies.reporting.results import results
from tests.helpers import run_dirs
from tests.studies.conftest import TINY_DATA, WIDTH, copy_run, merge_stage, tiny_study, write_study


def _records(out):
    return {p.parent.name: json.loads(p.read_text()) for p in out.rglob("job.json")}


def test_run_finishes_every_job_and_status_says_so(tiny_run, capsys):
    _, out = tiny_run
    assert status(out) == {
        "train": {"done": 4, "failed": 0, "running": 0, "pending": 0},
        "barrier": {"done": 2, "failed": 0, "running": 0, "pending": 0},
    }
    records = _records(out)
    assert len(records) == 6 and all(r["status"] == "done" for r in records.values())
    assert all((out / r["run_dir"] / "config.yaml").is_file() for r in records.values())
    main(["study", "status", str(out)])
    assert "train      done 4  failed 0  running 0  pending 0" in capsys.readouterr().out


def test_rerun_skips_every_done_job(tiny_run, tmp_path):
    path, _ = tiny_run
    out = copy_run(tiny_run, tmp_path)
    before = run_dirs(out)
    ran = []
    summary = run_study(path, out, runner=ran.append, log=lambda _: None)
    assert not ran and len(summary.skipped) == 6
    assert run_dirs(out) == before


def test_killed_jobs_are_redone_and_only_they(tiny_run, tmp_path):
    path, _ = tiny_run
    out = copy_run(tiny_run, tmp_path)
    store = StudyStore(out)
    train = [j for j in store.plan() if j["stage"] == "train"]
    resumable, fresh = train[0], train[1]
    # killed after its last checkpoint: resumes from it; killed before any: starts over
    (store.job_dir(resumable) / "job.json").unlink()
    (store.job_dir(fresh) / "job.json").unlink()
    old_run = store.run_dir(fresh)
    (old_run / "checkpoints" / "last.ckpt").unlink()
    (old_run / "left_by_the_killed_attempt").touch()
    before = _records(out)
    rows = (store.run_dir(resumable) / "metrics.csv").read_text()
    redone = {resumable["id"], fresh["id"]}
    # the barrier jobs that used a redone training run are redone too (their inputs changed)
    dependent = {j["id"] for j in store.plan() if redone & set(j.get("inputs", []))}
    summary = run_study(path, out, log=lambda _: None)
    assert sorted(summary.ran) == sorted(redone | dependent) and dependent
    assert summary.resumed == [resumable["id"]]
    after = _records(out)
    untouched = {k: v for k, v in before.items() if k not in redone | dependent}
    assert untouched and all(after[k] == v for k, v in untouched.items())
    assert after[resumable["id"]]["resumed"] and not after[fresh["id"]]["resumed"]
    # the resumed job keeps every row its killed attempt logged (issue 46)
    assert (store.run_dir(resumable) / "metrics.csv").read_text() == rows
    rerun = store.run_dir(fresh)  # the partial folder was removed, then the job ran anew
    assert not (rerun / "left_by_the_killed_attempt").exists()
    assert (rerun / "checkpoints" / "last.ckpt").is_file()


def test_a_failing_job_is_recorded_and_the_others_run(tmp_path):
    path = write_study(tmp_path, tiny_study())

    def runner(args):
        if args[0] == "fit" and "--seed_everything=1" in args and f"--{WIDTH}=8" in args:
            raise RuntimeError("boom")
        main(args)

    summary = run_study(path, tmp_path / "out", runner=runner, log=lambda _: None)
    assert len(summary.ran) == 4 and len(summary.failed) == 2  # the job and its barrier
    records = _records(tmp_path / "out")
    failed = [r for r in records.values() if r["status"] == "failed"]
    train = next(r for r in failed if r["stage"] == "train")
    assert train["error"] == "RuntimeError: boom" and "boom" in train["log_tail"]
    barrier = next(r for r in failed if r["stage"] == "barrier")
    assert train["id"] in barrier["error"]
    assert status(tmp_path / "out")["train"] == {"done": 3, "failed": 1, "running": 0, "pending": 0}


def test_the_lock_refuses_a_second_run(tmp_path):
    path = write_study(tmp_path, tiny_study())
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text(str(os.getpid()))  # a live process holds it
    with pytest.raises(StudyError, match=f"being run by process {os.getpid()}"):
        run_study(path, out, runner=lambda a: None, log=lambda _: None)
    assert not (out / "jobs").exists()
    # a lock whose process is gone is stale and taken over
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / ".lock").write_text(str(dead.pid))
    with StudyStore(out).lock():
        assert (out / ".lock").read_text() == str(os.getpid())
        assert StudyStore(out).holder() == os.getpid()
    assert not (out / ".lock").exists()
    # nor does a killed process that nobody reaped yet (a zombie)
    killed = subprocess.Popen(["sleep", "60"])
    os.kill(killed.pid, signal.SIGKILL)
    time.sleep(0.5)
    (out / ".lock").write_text(str(killed.pid))
    with StudyStore(out).lock():
        assert StudyStore(out).holder() == os.getpid()
    killed.wait()


def test_a_folder_of_another_study_is_refused_unless_forced(tiny_run, tmp_path):
    out = copy_run(tiny_run, tmp_path)
    other = write_study(tmp_path, tiny_study(name="other"))
    with pytest.raises(StudyError, match="holds the study 'tiny', not 'other'.*--force"):
        run_study(other, out, runner=lambda a: None, log=lambda _: None)
    summary = run_study(other, out, force=True, runner=lambda a: None, log=lambda _: None)
    assert len(summary.skipped) == 6  # same jobs, already done


def test_results_table(tiny_run):
    _, out = tiny_run
    table = results(out)
    assert list(table.columns) == [
        "stage",
        "job",
        WIDTH,
        "seed_everything",
        "endpoints",
        "metric",
        "value",
    ]
    assert not table.duplicated(["job", "metric"]).any()
    train = table[table.stage == "train"]
    assert train.job.nunique() == 4 and {"train/loss", "test/loss"} <= set(train.metric)
    barrier = table[(table.stage == "barrier") & (table.metric == "barrier_loss_matched")]
    assert sorted(barrier[WIDTH]) == [4, 8] and list(barrier.seed_everything) == [1, 1]
    assert barrier.value.notna().all()


def test_an_edited_study_runs_only_its_new_jobs(tiny_run, tmp_path):
    out = copy_run(tiny_run, tmp_path)
    more = tiny_study(grid={WIDTH: [4, 8], "seed_everything": [0, 1, 2]})
    ran = []
    summary = run_study(write_study(tmp_path, more), out, runner=ran.append, log=lambda _: None)
    assert len(summary.skipped) == 6
    started = [(a[0], a[a.index("--seed_everything=2")] if a[0] == "fit" else "") for a in ran]
    assert started == [("fit", "--seed_everything=2")] * 2  # barriers wait for their inputs
    assert len(summary.failed) == 4  # fake runner: no run folders, so nothing new is done


def test_damaged_records_are_reported_then_redone_not_fatal(tiny_run, tmp_path, capsys):
    """A truncated summary.json and a truncated checkpoint in a finished study (issue 31 item 5):
    status and the tables name them, the report is still written with them failed, and the
    next run sets them aside and redoes them (and the barrier that read the retrained model),
    to the same numbers."""
    from lmc.studies.reporting.aggregate import job_table
    from lmc.studies.reporting.report import write_report

    path, _ = tiny_run
    out = copy_run(tiny_run, tmp_path)
    store = StudyStore(out)
    plan = store.plan()
    before = results(out)
    barrier = next(j for j in plan if j["stage"] == "barrier" and j["coordinates"][WIDTH] == 8)
    train = next(j for j in plan if j["stage"] == "train" and j["coordinates"][WIDTH] == 4)
    summary = store.run_dir(barrier) / "summary.json"
    summary.write_text(summary.read_text()[:100])
    ckpt = sorted((store.run_dir(train) / "checkpoints").glob("*.ckpt"))[0]
    ckpt.write_bytes(ckpt.read_bytes()[:1000])

    assert status(out)["barrier"]["damaged"] == 1 and status(out)["train"]["damaged"] == 1
    main(["study", "status", str(out)])
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("damaged:")]
    assert len(lines) == 2 and "is not strict JSON" in " ".join(lines)
    assert any("is not a whole checkpoint" in x for x in lines)
    jobs = job_table(out).set_index("job")
    for job in (barrier, train):
        assert jobs.loc[job["id"], "status"] == "failed"
        assert jobs.loc[job["id"], "error"].startswith("damaged: ")
    assert barrier["id"] not in set(results(out).job)
    report = write_report(out)  # written, the damaged jobs among the failed ones
    assert barrier["id"] in report.markdown.read_text()

    summary_run = run_study(path, out, log=lambda _: None)
    assert sorted(summary_run.ran) == sorted(
        [barrier["id"], train["id"]]
        + [j["id"] for j in plan if j["stage"] == "barrier" and j["coordinates"][WIDTH] == 4]
    )
    assert all(v == {} or "damaged" not in v for v in status(out).values())
    assert {p.name.rsplit("-", 1)[0] for p in (out / "damaged").iterdir()} == {
        barrier["id"],
        train["id"],
    }
    after = results(out)
    key = ["stage", "job", "metric"]
    merged = before.merge(after, on=key, suffixes=("_before", "_after"))
    assert len(merged) == len(before)
    metric = merged[merged.metric == "barrier_loss_matched"]
    assert (metric.value_before == metric.value_after).all()


def test_a_merge_method_registered_in_user_code_runs_from_a_study_file(tmp_path, monkeypatch):
    """Adding a merge method is one function and its registration: a study file names it in a
    merge stage's `methods`, the pre-check accepts it, the merge job runs it, and its results
    come back by name (issue 32 item 2; README "Adding a merge method")."""
    from lmc.interpolation.states import weighted_average
    from lmc.merging import MERGE_METHODS, Merged, MergeInputs

    calls = []

    def average_as_is(inputs: MergeInputs, *, tag: int = 0) -> Merged:
        calls.append((len(inputs.states), tag))  # plain averaging, by our name
        return Merged(weighted_average(inputs.states), None, {"tag": tag})

    monkeypatch.setitem(MERGE_METHODS._entries, "mine", average_as_is)
    study = tiny_study(
        grid={WIDTH: [4], "seed_everything": [0, 1]},
        evaluate=[
            merge_stage(
                "--model.init_args.methods=[naive, mine]",
                "--model.init_args.method_options={mine: {tag: 7}}",
                *TINY_DATA,
            )
        ],
    )
    summary = run_study(write_study(tmp_path, study), tmp_path / "out", log=lambda _: None)
    assert not summary.failed and calls == [(2, 7)]
    table = results(tmp_path / "out")
    merged = table[table.stage == "merge"].set_index("metric").value
    assert merged["merge/mine/n2/test/loss"] == merged["merge/naive/n2/test/loss"]  # same merge
    assert merged["merge/mine/n2/tag"] == 7  # its diagnostics, logged beside its metrics


def test_damage_is_checked_once_per_job_until_its_outputs_change(tiny_run, tmp_path, monkeypatch):
    """A report asks for every job's damage several times (jobs, results, series tables): the
    stores of one folder read each job's outputs once, and again once they change."""
    import lmc.studies.running.store as store_module

    out = copy_run(tiny_run, tmp_path)
    reads = []
    real = store_module._damage_of
    monkeypatch.setattr(
        store_module, "_damage_of", lambda run, ckpts: reads.append(run) or real(run, ckpts)
    )
    job = next(j for j in StudyStore(out).plan() if j["stage"] == "barrier")
    assert StudyStore(out).damage(job) is None and StudyStore(out).damage(job) is None
    assert len(reads) == 1
    summary = StudyStore(out).run_dir(job) / "summary.json"
    summary.write_text(summary.read_text()[:40])  # truncated after it was checked
    assert "summary.json" in (StudyStore(out).damage(job) or "") and len(reads) == 2


@pytest.mark.parametrize("damage", ["plan", "study"])
def test_a_damaged_study_folder_file_is_one_line_naming_it_and_the_fix(
    tiny_run, tmp_path, capsys, damage
):
    """Issue 46: a corrupt plan.json (was a raw JSONDecodeError traceback from status and
    report) or study.yaml: one line naming the file and the command that writes it again; the
    run that command names does so and keeps the finished jobs."""
    path, _ = tiny_run
    out = copy_run(tiny_run, tmp_path)
    name = {"plan": "plan.json", "study": "study.yaml"}[damage]
    (out / name).write_text('{"jobs": [' if damage == "plan" else "name: [unclosed\n")
    from lmc.cli.study import study_main

    commands = [["report", str(out)], ["claims", str(out)]]  # status reads no study copy
    for command in commands + ([["status", str(out)]] if damage == "plan" else []):
        with pytest.raises(SystemExit) as exit_info:
            study_main(command)  # as from the console: errors as one line
        assert exit_info.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(out / name) in err[0] and "is damaged" in err[0], err
        assert f"--dir {out}" in err[0]
    force = ["--force"] if damage == "study" else []
    summary = run_study(path, out, log=lambda _: None, force=bool(force))
    assert len(summary.skipped) == 6 and not summary.ran  # nothing redone
    assert status(out)["train"]["done"] == 4


def _pair(tiny_run):
    """The width of the tiny study's first job and the run folders of its two seeds there."""
    store = StudyStore(tiny_run[1])
    width = store.plan()[0]["coordinates"][WIDTH]
    train = [j for j in store.plan() if j["stage"] == "train"]
    return width, [store.run_dir(j) for j in train if j["coordinates"][WIDTH] == width]


def _validate(config, checkpoints, width, root, *extra):
    """`lmc validate` of the study config ``config`` on ``checkpoints`` of the tiny study."""
    from tests.studies.conftest import CONFIGS

    main(
        [
            "validate",
            "-c",
            str(CONFIGS / "studies" / config),
            f"--model.init_args.checkpoints=[{', '.join(map(str, checkpoints))}]",
            f"--{WIDTH}={width}",
            f"--trainer.default_root_dir={root}",
            *TINY_DATA,
            *extra,
        ]
    )


def test_a_merge_that_diverged_is_noted(tiny_run, tmp_path, monkeypatch, caplog):
    """Issue 46: a NaN merged state exited 0 with no note."""
    import torch

    from lmc.merging import MERGE_METHODS, Merged

    def nan_average(inputs, **_):
        return Merged({k: torch.full_like(v, float("nan")) for k, v in inputs.states[0].items()})

    monkeypatch.setitem(MERGE_METHODS._entries, "nan_average", nan_average)
    width, runs = _pair(tiny_run)
    with caplog.at_level("INFO"):
        _validate(
            "teacher_student_merge.yaml",
            runs,
            width,
            tmp_path,
            "--model.init_args.methods=[naive, nan_average]",
        )
    assert "note: nan_average n=2: the merged model has non-finite weights" in caplog.text
    assert "note: naive" not in caplog.text


def test_a_merge_method_registered_in_user_code_runs_from_the_lmc_command(tmp_path, monkeypatch):
    """Issue 46: a user-registered merge method could not be named from `lmc` (the CLI never
    imported the user's module). $LMC_PLUGINS names it; plan and the jobs accept it."""
    from lmc.merging import MERGE_METHODS

    (tmp_path / "mylab_merges.py").write_text(
        "from lmc.merging import MERGE_METHODS, Merged\n\n\n"
        '@MERGE_METHODS.register("first_model")\n'
        "def first_model(inputs, *, scale: float = 1.0):\n"
        "    return Merged({k: v * scale for k, v in inputs.states[0].items()})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LMC_PLUGINS", "mylab_merges")
    monkeypatch.setattr(MERGE_METHODS, "_entries", dict(MERGE_METHODS._entries))
    study = tiny_study(
        grid={WIDTH: [4], "seed_everything": [0, 1]},
        evaluate=[merge_stage("--model.init_args.methods=[naive, first_model]", *TINY_DATA)],
    )
    path = write_study(tmp_path, study)
    main(["study", "run", str(path), "--dir", str(tmp_path / "out"), "--no-report"])
    table = results(tmp_path / "out")
    assert table.metric.str.startswith("first_model/n2/").any()
    monkeypatch.setenv("LMC_PLUGINS", "mylab_merges_missing")
    with pytest.raises(ImportError, match=r"\$LMC_PLUGINS: cannot import 'mylab_merges_missing'"):
        main(["study", "plan", str(path)])


def test_a_barrier_by_hand_on_other_data_than_its_models_learned_warns(tiny_run, tmp_path):
    """Issue 46: `lmc validate` between students of one teacher on another teacher's data gave
    numbers without a word; it may be the point (a shifted test set), so it warns."""
    width, runs = _pair(tiny_run)
    with pytest.warns(UserWarning, match=r"data\.init_args\.teacher_width: 6 here, 4 in training"):
        _validate(
            "teacher_student_barrier.yaml",
            runs,
            width,
            tmp_path,
            "--data.init_args.teacher_width=6",
            "--model.init_args.evaluation.num_alphas=3",
        )


def test_a_barrier_with_a_diverged_endpoint_says_so(tiny_run, tmp_path, caplog):
    """Issue 46's new bad-input check: an endpoint whose training diverged (weights ~1e25, loss
    inf) gave 'loss nan naive -> nan matched' and exit 0 without a word."""
    import torch

    width, runs = _pair(tiny_run)
    ckpt = torch.load(runs[0] / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["state_dict"] = {k: v * 1e25 for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "diverged.ckpt")
    with caplog.at_level("INFO"):
        _validate(
            "teacher_student_barrier.yaml",
            [tmp_path / "diverged.ckpt", runs[1]],
            width,
            tmp_path,
            "--model.init_args.evaluation.num_alphas=3",
        )
    assert "note: an endpoint's loss is not finite (a run that diverged?)" in caplog.text


def test_a_trained_merge_method_registered_in_user_code_runs_from_a_study(tmp_path, monkeypatch):
    """Issue 49: adding a method that trains touches its own file only. The docs' example
    (docs/how-to/learned_average.py), named in $LMC_PLUGINS, is planned, trained by `lmc fit`
    (TrainedMergeTask) in a study's merge stage beside `naive`, and reported per n."""
    from lmc.merging import MERGE_METHODS

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "docs" / "how-to"))
    monkeypatch.delitem(sys.modules, "learned_average", raising=False)  # registers on import
    monkeypatch.setattr("lmc.registry._loaded", set())
    monkeypatch.setenv("LMC_PLUGINS", "learned_average")
    monkeypatch.setattr(MERGE_METHODS, "_entries", dict(MERGE_METHODS._entries))
    stage = merge_stage(
        "--model.class_path=lmc.tasks.TrainedMergeTask",
        "--model.init_args.methods=[learned_average, naive]",
        "--model.init_args.method_options={learned_average: {temperature: 0.5}}",
        "--trainer.max_epochs=3",
        *TINY_DATA,
    )
    stage["command"] = "fit"
    study = tiny_study(grid={WIDTH: [4], "seed_everything": [0, 1]}, evaluate=[stage])
    path = write_study(tmp_path, study)
    main(["study", "run", str(path), "--dir", str(tmp_path / "out"), "--no-report"])
    table = results(tmp_path / "out")
    learned = table[table.metric.str.startswith("learned_average/n2/")]
    assert {"learned_average/n2/test/loss", "learned_average/n2/weight_max"} <= set(learned.metric)
    assert table.metric.str.startswith("naive/n2/").any()
    with pytest.raises(Exception, match="merge method 'learned_average' takes temperature"):
        bad = dict(
            stage,
            args=[*stage["args"], "--model.init_args.method_options={learned_average: {tau: 1}}"],
        )
        main(["study", "plan", str(write_study(tmp_path / "bad", tiny_study(evaluate=[bad])))])
