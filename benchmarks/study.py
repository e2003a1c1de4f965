"""Study runner drill and cost (issue #14): run a study, kill it like a power loss, rerun it.

Starts ``lmc study run STUDY --dir DIR --workers N`` in its own process group from an empty
folder, polls the study folder every 0.2 s and, once ``--kill-after`` jobs are done (their
``job.json`` says ``done``) and a job is in flight, sends SIGKILL to the whole process group
(study process, fork server, workers) and checks that none of it survives. Then reruns the same
command to completion and checks that

* every planned job is done;
* every job done before the kill kept its ``job.json`` byte for byte (never redone);
* the jobs killed mid-way (a job folder without a done ``job.json`` at the kill) are done now:
  the rerun redid them (``resumed_jobs_redone``; a train job resumes from its ``last.ckpt``
  when the killed attempt had written one).

Measured: ``study_minutes`` (wall time of the killed run plus the rerun), and for the rerun's
jobs (``started_unix`` after the rerun started) ``job_overhead_s`` = (workers x (last finish -
first start) - their summed own run ``seconds``) / jobs, the worker time per job not spent in a
job's own run (hand-over, scheduling, idle workers at the end of the study), and ``startup_s``
= first job start - rerun start (process start, checking the study against its configs, worker
warm-up: paid once per ``lmc study run``). Reported, not asserted: the mean over seeds of the
evaluate stage's ``barrier_loss_matched`` and ``barrier_loss_naive`` at the smallest and the
largest width (003: the matched barrier should fall with width).

Run ``python benchmarks/study.py`` (the 003 width study, 18 trainings of 100 epochs and 12
barriers on the CPU; ``--study FILE``, ``--dir DIR`` to keep the folder, ``--workers N``). The
last line is ``study_minutes=<..> jobs=<..> job_overhead_s=<..> startup_s=<..>
resumed_jobs_redone=<..> barrier_matched_small_width=<..> barrier_matched_large_width=<..>
barrier_naive_small_width=<..> barrier_naive_large_width=<..> report_html_bytes=<..>
report_figures=<..>`` (the report the rerun wrote at its end). Exit code 0 when the checks
hold.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmc.studies import load_study, plan  # noqa: E402
from lmc.studies.running.store import JOB_FILE, StudyStore  # noqa: E402

STUDY = ROOT / "configs" / "studies" / "003_width.yaml"
WIDTH_KEY = "model.init_args.net.init_args.width"
METRICS = ("barrier_loss_matched", "barrier_loss_naive")
POLL_S = 0.2
#: once enough jobs are done, how long to wait for one in flight before killing anyway
KILL_WAIT_S = 30.0
LOG_TAIL_LINES = 40


def _snapshot(root: Path) -> tuple[dict[str, str], list[str]]:
    """``({"<stage>/<id>": job.json text} of the done jobs, ["<stage>/<id>"] of the job folders
    without a done job.json})`` of the study folder ``root``."""
    done: dict[str, str] = {}
    unfinished: list[str] = []
    for folder in sorted((root / "jobs").glob("*/*/")):
        name = f"{folder.parent.name}/{folder.name}"
        try:
            text = (folder / JOB_FILE).read_text()
            ok = json.loads(text).get("status") == "done"
        except (OSError, ValueError):  # none yet (running or killed); never a torn one: atomic
            ok = False
        if ok:
            done[name] = text
        else:
            unfinished.append(name)
    return done, unfinished


def _live_members(pgid: int) -> list[int]:
    """Processes of the group ``pgid`` that are not zombies (Linux ``/proc``; elsewhere every
    member that ``killpg(pgid, 0)`` reaches counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    proc = Path("/proc")
    if not proc.is_dir():
        return [pgid]
    live = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def _kill_group(proc: subprocess.Popen) -> list[int]:
    """SIGKILL the process group of ``proc`` (its own: ``start_new_session``), reap ``proc``
    and return the group's processes still alive a few seconds later (none expected)."""
    pgid = proc.pid
    os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    for _ in range(50):
        left = _live_members(pgid)
        if not left:
            return []
        time.sleep(0.1)
    return left


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` if it still runs (the benchmark was interrupted)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _fail(message: str, log: Path | None = None) -> None:
    print(f"FAILED: {message}", flush=True)
    if log is not None:
        print(f"--- last lines of {log} ---\n{_tail(log)}", flush=True)
    raise SystemExit(1)


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _rerun_timing(store: StudyStore, jobs: list[dict], since: float, workers: int) -> tuple:
    """``(jobs, job_overhead_s, startup_s)`` of the jobs that started after ``since``."""
    records = [r for r in (store.record(j) for j in jobs) if r]
    ran = [r for r in records if float(r.get("started_unix") or 0.0) >= since]
    if not ran:
        return 0, math.nan, math.nan
    first = min(float(r["started_unix"]) for r in ran)
    end = max(float(r["finished_unix"]) for r in ran)
    own = sum(float(r["seconds"]) for r in ran)
    return len(ran), (workers * (end - first) - own) / len(ran), first - since


def _barriers(root: Path, stages: set[str], width_key: str) -> dict[float, dict[str, float]]:
    """Per width, the mean over the evaluate rows (seed pairs) of each barrier metric."""
    from lmc.studies.reporting.results import results

    table = results(root)
    if width_key not in table.columns:
        grid = [c for c in table.columns if c not in ("stage", "job", "metric", "value")]
        _fail(f"--width-key {width_key} is no grid key of the study (grid keys: {grid})")
    rows = table[table["stage"].isin(stages) & table["metric"].isin(METRICS)]
    means = rows.groupby([width_key, "metric"])["value"].agg(lambda v: v.mean(skipna=False))
    counts = rows.groupby(width_key)["job"].nunique()
    out: dict[float, dict[str, float]] = {}
    for (width, metric), value in means.items():
        out.setdefault(width, {"pairs": int(counts[width])})[metric] = float(value)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=STUDY, help="the study file")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the study folder: missing or empty (default: a temporary folder, removed after "
        "a run whose checks hold)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--kill-after",
        type=int,
        default=None,
        help="kill the first run once this many jobs are done (default: half the train jobs)",
    )
    parser.add_argument(
        "--width-key", default=WIDTH_KEY, help="the grid key the barriers are compared over"
    )
    args = parser.parse_args(argv)

    study_path = args.study.resolve()
    if not study_path.is_file():
        parser.error(f"--study {args.study}: no such file")
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: give a whole number >= 1")
    jobs = plan(load_study(study_path))  # the job count only: the runs check the study itself
    n_train = sum(j.stage == "train" for j in jobs)
    kill_after = max(1, n_train // 2) if args.kill_after is None else args.kill_after
    if not 1 <= kill_after < len(jobs):
        parser.error(
            f"--kill-after {kill_after}: give 1 to {len(jobs) - 1} (the study has {len(jobs)} jobs)"
        )
    temp = None
    if args.dir is None:
        temp = Path(tempfile.mkdtemp(prefix="lmc-study-bench-"))
        root, logs = temp / "study", temp
    else:
        root = args.dir.resolve()
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            parser.error(
                f"--dir {args.dir}: exists and is not an empty folder; the benchmark starts "
                "from an empty study folder (give a new or empty one)"
            )
        logs = root.parent
    root.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    log1, log2 = logs / f"{root.name}.run1.log", logs / f"{root.name}.run2.log"
    command = [
        sys.executable,
        "-m",
        "lmc",
        "study",
        "run",
        str(study_path),
        "--dir",
        str(root),
        "--workers",
        str(args.workers),
    ]
    print(
        f"study {study_path} ({len(jobs)} jobs, {n_train} train), folder {root}, "
        f"{args.workers} workers, kill after {kill_after} done job(s); logs {log1}, {log2}",
        flush=True,
    )

    # first run, killed like a power loss
    t0 = time.time()
    proc = _start(command, log1)
    ready_since = None
    killed = False
    try:
        while proc.poll() is None:
            done, unfinished = _snapshot(root)
            if len(done) >= kill_after:
                ready_since = ready_since or time.monotonic()
                if unfinished or time.monotonic() - ready_since > KILL_WAIT_S:
                    survivors = _kill_group(proc)
                    killed = True
                    if survivors:
                        _fail(f"processes {survivors} of the killed study survived the SIGKILL")
                    break
            time.sleep(POLL_S)
    except BaseException:  # e.g. Ctrl-C: leave no study running in its own session
        _stop(proc)
        raise
    first_wall = time.time() - t0
    done_before, unfinished_before = _snapshot(root)
    if killed:
        print(
            f"run 1: killed after {first_wall:.1f} s with {len(done_before)} job(s) done and "
            f"{len(unfinished_before)} in flight {unfinished_before}; no process of its group "
            "survived",
            flush=True,
        )
    elif proc.returncode != 0:
        _fail(f"the first run exited with {proc.returncode} before the kill", log1)
    else:
        print(f"note: the first run ended by itself after {first_wall:.1f} s, before the kill")

    # rerun to completion
    t_rerun = time.time()
    rerun = _start(command, log2)
    try:
        rerun.wait()
    except BaseException:
        _stop(rerun)
        raise
    rerun_wall = time.time() - t_rerun
    if rerun.returncode != 0:
        _fail(f"the rerun exited with {rerun.returncode}", log2)
    print(f"run 2: finished in {rerun_wall:.1f} s", flush=True)

    # checks
    store = StudyStore(root)
    planned = store.plan()
    if len(planned) != len(jobs):
        _fail(f"the study folder plans {len(planned)} jobs, the study file {len(jobs)}")
    not_done = [f"{j['stage']}/{j['id']}" for j in planned if not store.is_done(j)]
    if not_done:
        _fail(f"jobs not done after the rerun: {not_done}", log2)
    done_after, _ = _snapshot(root)
    changed = [name for name, text in done_before.items() if done_after.get(name) != text]
    if changed:
        _fail(f"jobs done before the kill were redone or overwritten: {changed}")
    redone = [name for name in unfinished_before if name in done_after]
    from_ckpt = [n for n in redone if json.loads(done_after[n]).get("resumed")]
    if killed and unfinished_before and not redone:
        _fail(f"none of the jobs killed mid-way ({unfinished_before}) is done after the rerun")
    if not unfinished_before:
        print("note: no job was in flight at the kill, so the rerun redid none")
    print(
        f"checks hold: all {len(planned)} jobs done, {len(done_before)} done before the kill "
        f"untouched, {len(redone)} killed mid-way redone ({len(from_ckpt)} resumed from "
        "last.ckpt)",
        flush=True,
    )
    n_ran, overhead, startup = _rerun_timing(store, planned, t_rerun, args.workers)
    print(f"rerun: {n_ran} job(s) ran, {overhead:.2f} s overhead per job, {startup:.1f} s startup")

    # results
    stages = {j["stage"] for j in planned if j["stage"] != "train"}
    by_width = _barriers(root, stages, args.width_key)
    if not by_width:
        _fail(f"no {' / '.join(METRICS)} rows of the evaluate stage(s) {sorted(stages)}")
    print(f"{args.width_key:>40s}  pairs  {'matched':>10s}  {'naive':>10s}  (mean over pairs)")
    for width in sorted(by_width):
        row = by_width[width]
        matched, naive = row.get(METRICS[0], math.nan), row.get(METRICS[1], math.nan)
        print(f"{width!s:>40s}  {row['pairs']:5d}  {matched:10.4g}  {naive:10.4g}")
    small, large = by_width[min(by_width)], by_width[max(by_width)]
    values = {
        f"barrier_{kind}_{size}_width": row.get(f"barrier_loss_{kind}", math.nan)
        for kind in ("matched", "naive")
        for size, row in (("small", small), ("large", large))
    }
    falls = values["barrier_matched_large_width"] < values["barrier_matched_small_width"]
    print(
        f"matched barrier falls with width: {'yes' if falls else 'no'} "
        f"({values['barrier_matched_small_width']:.4g} at {min(by_width)}, "
        f"{values['barrier_matched_large_width']:.4g} at {max(by_width)})"
    )
    # the report `lmc study run` wrote at the end of the rerun
    html = root / "report" / "report.html"
    if not html.is_file():
        _fail(f"the rerun wrote no report ({html})", log2)
    report_bytes = html.stat().st_size
    report_figures = html.read_text().count("<figure")
    print(f"report: {html} ({report_bytes} bytes, {report_figures} figures)")
    if temp is not None:
        shutil.rmtree(temp, ignore_errors=True)
    line = {
        "study_minutes": (first_wall + rerun_wall) / 60,
        "jobs": len(planned),
        "job_overhead_s": overhead,
        "startup_s": startup,
        "resumed_jobs_redone": len(redone),
        **values,
        "report_html_bytes": report_bytes,
        "report_figures": report_figures,
    }
    print(" ".join(f"{k}={v}" if isinstance(v, int) else f"{k}={v:.4g}" for k, v in line.items()))


if __name__ == "__main__":
    main()
