"""Where a study's jobs run: warm local workers give the same results as the study's own
process, submitit's local executor runs the same jobs in real subprocesses, shards split the
study and copied together give the whole of it, merge stages take groups of models, and each
job is a W&B run grouped by study and typed by stage."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from lmc.cli import main
from lmc.studies import StudyError, StudyStore, load_and_plan, run_study, status
from lmc.studies.reporting.results import results
from lmc.studies.running.plan import Job, shard
from tests.helpers import read_wandb_records, wandb_run_dirs
from tests.studies.conftest import CONFIGS, TINY_DATA, WIDTH, tiny_study, write_study


def _quiet(_: str) -> None:
    pass


def _records(out):
    return [json.loads(p.read_text()) for p in sorted(out.rglob("job.json"))]


def _values(out):
    table = results(out)
    # timings differ from run to run; everything else is computed from the same seeds
    return {(r.job, r.metric): r.value for r in table.itertuples() if "seconds" not in r.metric}


def _on(accelerator: str) -> dict:
    """The tiny study with every job (training and barrier) on ``accelerator``, each seed its
    own run (on a GPU ``population: auto`` would train them as one job, not in the workers)."""
    study = tiny_study(population=False)
    on = f"--trainer.accelerator={accelerator}"
    study["train"]["args"].append(on)
    for stage in study["evaluate"]:
        stage["args"].append(on)
    return study


def test_workers_match_the_study_process_and_are_reused(request, tmp_path, accelerator):
    if accelerator == "cpu":  # the base configs' accelerator
        path, reference = request.getfixturevalue("tiny_run")
    else:  # two workers share the one GPU; the reference runs on it in this process
        path = write_study(tmp_path / accelerator, _on(accelerator))
        reference = tmp_path / "reference"
        assert not run_study(path, reference, log=_quiet).failed
    out = tmp_path / "out"
    summary = run_study(path, out, workers=2, log=_quiet)
    assert not summary.failed and len(summary.ran) == 6
    records = _records(out)
    pids = {r["pid"] for r in records}
    assert os.getpid() not in pids and len(pids) <= 2  # two warm workers ran all six jobs
    assert all(r["status"] == "done" for r in records)
    if accelerator != "cpu":  # and they ran their jobs on it
        assert all(f"--trainer.accelerator={accelerator}" in r["resolved_args"] for r in records)
    ours, theirs = _values(out), _values(reference)
    assert ours.keys() == theirs.keys()
    abs_tol = 1e-7 if accelerator == "cpu" else 1e-6  # CUDA kernels need not be bitwise
    for key, value in theirs.items():
        assert math.isclose(ours[key], value, rel_tol=1e-5, abs_tol=abs_tol) or (
            math.isnan(value) and math.isnan(ours[key])
        ), key


def test_submitit_local_executor_runs_jobs_in_subprocesses(tmp_path):
    pytest.importorskip("submitit")
    study = tiny_study(
        grid={WIDTH: [4], "seed_everything": [0, 1]},
        executor={"submitit": {"cluster": "local", "timeout_min": 10}},
    )
    path = write_study(tmp_path, study)
    out = tmp_path / "out"
    summary = run_study(path, out, executor="submitit", log=_quiet)
    assert not summary.failed and len(summary.ran) == 3
    records = _records(out)
    assert all(r["status"] == "done" for r in records)
    assert os.getpid() not in {r["pid"] for r in records}
    assert (out / "submitit").is_dir()  # submitit's own logs and pickles
    barrier = results(out).query("metric == 'barrier_loss_matched'")
    assert len(barrier) == 1 and barrier.value.notna().all()


def test_submitit_options_are_checked_before_any_job(tmp_path):
    pytest.importorskip("submitit")
    study = tiny_study(executor={"submitit": {"cluster": "local", "timeout_minutes": 10}})
    path = write_study(tmp_path, study)
    with pytest.raises(StudyError, match="executor.submitit: .*timeout_minutes"):
        run_study(path, tmp_path / "out", executor="submitit", log=_quiet)
    assert not (tmp_path / "out" / "jobs").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "0"], "--workers 0: give a whole number >= 1"),
        (["--shard", "3/2"], "--shard 3/2: give i/n with 1 <= i <= n"),
        (["--shard", "two"], "--shard two: give i/n"),
        (["--executor", "slurm"], "--executor slurm: unknown; valid: local, submitit"),
    ],
)
def test_bad_run_options_are_refused_before_any_job(tmp_path, flags, message):
    path = write_study(tmp_path, tiny_study())
    out = tmp_path / "out"
    with pytest.raises(StudyError) as err:
        main(["study", "run", str(path), "--dir", str(out), *flags])
    assert message in str(err.value)
    assert not (out / "jobs").exists()


def _job(name: str, inputs: tuple[str, ...] = ()) -> Job:
    return Job("barrier" if inputs else "train", "fit", {}, (), inputs, name)


def test_shards_keep_linked_jobs_together_and_cover_the_study():
    # two groups (a width each: two trainings and their barrier) and a lone training
    jobs = [_job("a0"), _job("a1"), _job("b0"), _job("b1"), _job("c0")]
    jobs += [_job("ab", ("a0", "a1")), _job("bb", ("b0", "b1"))]
    parts = [shard(jobs, i, 2) for i in (1, 2)]
    ids = [{j.id for j in part} for part, _ in parts]
    assert not ids[0] & ids[1] and ids[0] | ids[1] == {j.id for j in jobs}
    for part in ids:
        for job in jobs:
            if job.id in part:
                assert set(job.inputs) <= part  # every evaluate job has its trainings
    assert all(not left for _, left in parts)
    # fewer groups than shards: the trainings are dealt out, the evaluations left for later
    merged = [_job("m0"), _job("m1"), _job("m2"), _job("all", ("m0", "m1", "m2"))]
    parts = [shard(merged, i, 2) for i in (1, 2)]
    assert [len(part) for part, _ in parts] == [2, 1]
    assert all([j.id for j in left] == ["all"] for _, left in parts)


def test_shard_folders_copied_together_are_the_whole_study(tiny_run, tmp_path):
    path, _ = tiny_run
    outs = [tmp_path / "shard1", tmp_path / "shard2"]
    for i, out in enumerate(outs, 1):
        summary = run_study(path, out, shard_spec=f"{i}/2", log=_quiet)
        assert len(summary.ran) == 3 and not summary.failed and not summary.left_to_merge
    shutil.copytree(outs[1] / "jobs", outs[0] / "jobs", dirs_exist_ok=True)
    assert status(outs[0]) == {
        "train": {"done": 4, "failed": 0, "running": 0, "pending": 0},
        "barrier": {"done": 2, "failed": 0, "running": 0, "pending": 0},
    }
    ran: list[list[str]] = []
    summary = run_study(path, outs[0], runner=ran.append, log=_quiet)
    assert not ran and len(summary.skipped) == 6


def test_a_merge_stage_merges_each_group_and_jobs_are_wandb_runs(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    study = tiny_study(
        config=[str(CONFIGS / "synthetic" / "teacher_student.yaml")],  # its W&B logger
        grid={WIDTH: [4], "seed_everything": [0, 1, 2]},
        evaluate=[
            {
                "name": "merge",
                "kind": "merge",
                "config": str(CONFIGS / "studies" / "teacher_student_merge.yaml"),
                "groups": {"over": [WIDTH], "vary": "seed_everything", "values": [2, 0, 1]},
                "args": TINY_DATA,
            }
        ],
    )
    path = write_study(tmp_path, study)
    out = tmp_path / "out"
    summary = run_study(path, out, log=_quiet)
    assert not summary.failed and len(summary.ran) == 4
    _, jobs = load_and_plan(path)
    merge = next(j for j in jobs if j.stage == "merge")
    train = {j.coordinates["seed_everything"]: j.id for j in jobs if j.stage == "train"}
    assert merge.inputs == (train[2], train[0], train[1])  # in the order of `values`
    assert merge.coordinates == {WIDTH: 4, "seed_everything": [2, 0, 1]}
    store = StudyStore(out)
    record = store.record(merge)
    given = next(
        a for a in record["resolved_args"] if a.startswith("--model.init_args.checkpoints")
    )
    assert given.index(train[2]) < given.index(train[0]) < given.index(train[1])
    table = results(out)
    merged = table[(table.stage == "merge") & table.metric.str.match(r"merge/\w+/n3/test/loss$")]
    assert set(merged.metric) == {
        f"merge/{m}/n3/test/loss" for m in ("naive", "wm_ref", "mergemany")
    }
    assert merged.value.notna().all()
    # every training job is a W&B run: group = the study, job_type = the stage, coordinates in
    # its config
    runs = wandb_run_dirs(out / "jobs" / "train")
    assert len(runs) == 3
    for run in runs:
        header = next(r["run"] for r in read_wandb_records(run) if r.get("type") == "run")
        assert header["run_group"] == "tiny" and header["job_type"] == "train"
        config = next(r for r in read_wandb_records(run) if r.get("type") == "config")
        assert "coordinates" in json.dumps(config)


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> str:
    """The command line of process ``pid``; "" once it has exited (a child can end between
    listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _kill_group(proc: Any) -> None:
    """SIGKILL to a study's process group (the study, its fork server, workers), if left."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _says_interrupted(proc: Any, err: str, path: Path, out: Path) -> None:
    """The study ended as an interrupt: exit 130, last a line saying how to go on, no traceback."""
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("lmc study: interrupted;") and "Traceback" not in err, err
    assert f"lmc study run {path} --dir {out}" in lines[-1]


def _start_two_workers(tmp_path: Path, **popen: Any) -> tuple[Any, Path, Path, list[int]]:
    """`lmc study run --workers 2` of a tiny study whose jobs never end, in its own session,
    once both workers run a job: (process, study file, study folder, worker pids)."""
    import signal
    import subprocess
    import sys
    import time

    study = tiny_study(evaluate=[])
    study["train"]["args"] = [*study["train"]["args"], "--trainer.max_epochs=100000"]
    path = write_study(tmp_path, study)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lmc", "study", "run", str(path), "--dir", str(out)]
    proc = subprocess.Popen([*cmd, "--workers", "2"], start_new_session=True, **popen)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("jobs/train/*/job.log"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no job started"
            time.sleep(0.2)
        servers = [p for p in _children(proc.pid) if "forkserver" in _cmdline(p)]
        workers = [w for s in servers for w in _children(s)]
        assert len(workers) == 2, (servers, workers)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc, path, out, workers


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_killed_study_leaves_no_worker_running_its_jobs(tmp_path):
    """SIGKILL of the `lmc study run` process alone (not its group): its warm workers, children
    of the fork server that they keep alive, end within seconds instead of finishing their jobs
    into the dead study's folder."""
    import signal
    import subprocess
    import time

    proc, _, out, workers = _start_two_workers(
        tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while not all(_gone(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(w) for w in workers), "workers outlived their study"
        assert not list(out.glob("jobs/train/*/job.json"))  # no job finished after the kill
    finally:
        try:  # the fork server and any worker left: the study's own process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_study_stops_its_workers_and_says_how_to_go_on(sig, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM to `lmc study run` alone (issue 31 item 6): its workers are
    killed at once (was: they finished their jobs and wrote for 5.8 s more), the lock is
    released, and one line says how to resume, no traceback; exit status 130."""
    import signal
    import subprocess
    import time

    proc, path, out, workers = _start_two_workers(
        tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        t0 = time.monotonic()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
        assert all(_gone(w) for w in workers), "workers outlived the interrupt"
        _says_interrupted(proc, err, path, out)
        # nothing finished after: the jobs that ran are recorded as interrupted (issue 46)
        records = [json.loads(p.read_text()) for p in out.glob("jobs/train/*/job.json")]
        assert {r["status"] for r in records} <= {"interrupted"}
        assert not (out / ".lock").exists() or StudyStore(out).holder() is None
    finally:
        _kill_group(proc)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "how",
    [
        ("SIGINT", "--workers=1"),
        ("SIGTERM", "--workers=1"),
        ("SIGINT", "--workers=2"),
        ("SIGINT", "--executor=submitit"),
    ],
    ids=["ctrl-c-in-process", "sigterm-in-process", "ctrl-c-workers", "ctrl-c-submitit-local"],
)
def test_an_interrupt_stops_the_study_in_every_executor_and_the_job_is_recorded(how, tmp_path):
    """Issue 46: Ctrl-C or SIGTERM stops `lmc study run` in every executor: the running job is
    recorded as interrupted (not failed; with --workers 1 Lightning turned the interrupt into a
    failure and the study went on with the next jobs), no other job starts, exit status 130 with
    one line saying how to go on; the next run resumes the job from its last checkpoint."""
    import signal
    import subprocess
    import sys
    import time

    sig, option = how
    if "submitit" in option:
        pytest.importorskip("submitit")
    study = tiny_study(evaluate=[], executor={"submitit": {"cluster": "local"}})
    study["train"]["args"] = [*study["train"]["args"], "--trainer.max_epochs=100000"]
    path = write_study(tmp_path, study)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lmc", "study", "run", str(path), "--dir", str(out), option]
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("jobs/train/*/lmc/*/checkpoints/last.ckpt")):
            assert proc.poll() is None and time.monotonic() < deadline, "no epoch ended"
            time.sleep(0.2)
        started = {p.parent.name for p in out.glob("jobs/train/*/job.log")}
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
        _says_interrupted(proc, err, path, out)
        assert {p.parent.name for p in out.glob("jobs/train/*/job.log")} == started
        records = [json.loads(p.read_text()) for p in out.glob("jobs/train/*/job.json")]
        assert records and {r["status"] for r in records} == {"interrupted"}, records
        assert {r["id"] for r in records} == started
        store = StudyStore(out)
        # the job whose epoch ended (with submitit all four ran at once, not all that far)
        ended = {p.parents[3].name for p in out.glob("jobs/train/*/lmc/*/checkpoints/last.ckpt")}
        job = next(j for j in store.plan() if j["id"] in ended)
        assert store.partial_run(job) is not None  # resumed by the next run
        counts = status(out)["train"]
        assert counts["interrupted"] == len(started) and counts["done"] == 0
    finally:
        _kill_group(proc)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_while_the_study_is_checked_prints_one_line(tmp_path):
    """Issue 46: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the
    study was being checked and its fork server importing lmc printed the fork server's
    traceback under the study's line."""
    import signal
    import subprocess
    import sys
    import time

    path = write_study(tmp_path, tiny_study(evaluate=[]))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lmc", "study", "run", str(path), "--dir", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--workers", "2"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any("forkserver" in _cmdline(p) for p in _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "no fork server started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        time.sleep(1)  # anything the fork server would print, printed by now
        _says_interrupted(proc, err, path, out)
    finally:
        _kill_group(proc)
