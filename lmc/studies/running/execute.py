"""Run one job of a study in the current process: the same function runs in the study's own
process (``--workers 1``), in a warm local worker process, or in a submitit job on a cluster.

The job's output goes to ``job.log`` in its folder (the console keeps the study's progress),
its record ``job.json`` is written atomically after the run returned, so a killed job is never
counted as done, and a failure is recorded with its error and log tail."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lmc.studies.running.plan import MEMBER, Job, job_args
from lmc.studies.running.store import StudyStore
from lmc.studies.spec.schema import SEED_KEY

LOG_FILE = "job.log"
POPULATION_DIR = "population"  # a leader job's population run, beside its member's run folder
LOG_TAIL_LINES = 40
Runner = Callable[[list[str]], None]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def lmc_runner(args: list[str]) -> None:
    """Run ``lmc <args>`` (a ``fit`` or ``validate`` job) in this process."""
    from lmc.engine.app import main

    main(args)


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Send this process's output (Python's streams and file descriptors 1 and 2, so also
    what libraries print from C or through handlers bound to the old streams) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    saved_streams = sys.stdout, sys.stderr
    with path.open("a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            yield
        finally:
            log.flush()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)


#: the record of a job stopped by SIGINT / SIGTERM: not done, not failed; the next run
#: resumes it from its last checkpoint (or redoes it)
INTERRUPTED = "interrupted"


@contextmanager
def noting_interrupts() -> Iterator[Callable[[], bool]]:
    """While a job runs in this process: SIGINT and SIGTERM are noted and raised as
    ``KeyboardInterrupt``; yields whether one came. Lightning turns that interrupt into
    ``SystemExit(1)`` and ignores SIGINT from then on, so without this an interrupted job read
    as a failed one and the study went on with Ctrl-C disabled; the handlers before are
    restored after (undoing Lightning's). Off the main thread (no signals there) it notes
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) == 1:  # a second Ctrl-C while the job stops is not needed
            raise KeyboardInterrupt

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield lambda: bool(seen)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def member_folder(leader_dir: Path, seed: Any) -> Path:
    """The folder of member ``seed`` in the population run a leader job wrote."""
    found = sorted((leader_dir / POPULATION_DIR).glob(f"*/*/members/seed={seed}"))
    if len(found) != 1:
        raise RuntimeError(
            f"the population run in {leader_dir / POPULATION_DIR} should hold one folder "
            f"members/seed={seed}, found {len(found)}"
        )
    return found[0]


def _link_tree(member: Path, job_dir: Path) -> None:
    """Make ``member`` the run folder of the job in ``job_dir`` (``lmc/<member folder>``):
    hard links where the file system allows (no second copy of the checkpoints), else a copy."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(member, job_dir / "lmc" / member.name, copy_function=link)


def _take_member(store: StudyStore, job: Job, leader: Job) -> dict[str, Any]:
    """A population member's job: its trained member, taken from the leader's run."""
    store.clear(job)
    started, t0 = now(), time.perf_counter()
    try:
        _link_tree(
            member_folder(store.job_dir(leader), job.coordinates[SEED_KEY]), store.job_dir(job)
        )
        status, error = "done", None
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    payload: dict[str, Any] = {
        "status": status,
        "error": error,
        "log_tail": "",
        "population": leader.id,  # trained there: its time is the leader's
        "started": started,
        "finished": now(),
        "seconds": round(time.perf_counter() - t0, 3),
        "inputs_finished": input_stamps(store, [leader]),
    }
    if status == "done":
        payload["run_dir"] = str(store.run_dir(job).relative_to(store.root))
    store.write_record(job, payload)
    return {**job.to_json(), **payload}


def input_stamps(store: StudyStore, inputs: list[Job]) -> dict[str, str | None]:
    """When each input job finished: an evaluate job is redone when an input was redone."""
    return {d.id: (store.record(d) or {}).get("finished") for d in inputs}


def execute_job(
    root: str | Path,
    job: Job,
    inputs: list[Job],
    extra_args: list[str] | None = None,
    runner: Runner | None = None,
) -> dict[str, Any]:
    """Run ``job`` of the study folder ``root`` here and write its ``job.json``; return it.

    A train job whose killed attempt left a run folder with ``last.ckpt`` resumes from it
    (``--ckpt_path <run folder>``); any other leftover of an attempt is removed first.
    ``extra_args`` are appended to the job's args (e.g. ``--study`` for the W&B group).
    """
    store = StudyStore(root)
    if job.command == MEMBER:
        return _take_member(store, job, inputs[0])
    job_dir = store.job_dir(job)
    resumable = job.command == "fit" and not job.members  # a population restarts
    partial = store.partial_run(job) if resumable else None
    if partial is None:
        store.clear(job)
    job_dir.mkdir(parents=True, exist_ok=True)
    out_dir = job_dir / POPULATION_DIR if job.members else job_dir
    args = job_args(job, out_dir, [store.run_dir(d) for d in inputs])
    args += list(extra_args or [])
    if partial is not None:
        args.append(f"--ckpt_path={partial}")
    log = job_dir / LOG_FILE
    started, started_unix, t0 = now(), time.time(), time.perf_counter()
    argv = sys.argv
    with output_to(log), noting_interrupts() as interrupted:
        print(f"lmc {' '.join(args)}", flush=True)
        sys.argv = ["lmc"]  # the job's args are given in-process, not on the command line
        try:
            (runner or lmc_runner)(args)
            if job.members:  # the leader's own member becomes its run folder
                _link_tree(member_folder(job_dir, job.coordinates[SEED_KEY]), store.job_dir(job))
            status, error = "done", None
        except BaseException as exc:  # a job's failure is recorded, the study goes on
            if isinstance(exc, KeyboardInterrupt) or interrupted():
                status, error = INTERRUPTED, "interrupted (SIGINT or SIGTERM)"
                print(f"lmc study: job interrupted ({type(exc).__name__})", flush=True)
            else:
                status, error = "failed", f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
        finally:
            sys.argv = argv
    payload: dict[str, Any] = {
        "status": status,
        "error": error,
        "log_tail": _tail(log) if status == "failed" else "",
        "resolved_args": args,
        "resumed": partial is not None,
        "started": started,
        "finished": now(),
        "seconds": round(time.perf_counter() - t0, 3),
        "started_unix": started_unix,
        "finished_unix": time.time(),
        "pid": os.getpid(),
        "inputs_finished": input_stamps(store, inputs),
    }
    if status == "done":
        try:
            payload["run_dir"] = str(store.run_dir(job).relative_to(store.root))
        except Exception as exc:  # no single run folder: not usable as done
            payload.update(status="failed", error=str(exc), log_tail=_tail(log))
    store.write_record(job, payload)
    if status == INTERRUPTED:  # the study stops too
        raise KeyboardInterrupt
    return {**job.to_json(), **payload}


def record_interrupted(store: StudyStore, job: Job) -> None:
    """Record ``job``, stopped while it ran elsewhere (a worker, a submitit job), as
    interrupted, unless it finished first."""
    record = store.record(job) or {}
    if record.get("status") in ("done", INTERRUPTED):
        return
    store.write_record(
        job,
        {"status": INTERRUPTED, "error": "interrupted (the study was stopped)", "finished": now()},
    )
