"""Run one job of a study in the current process: the same function runs in the study's own
process (``--workers 1``), in a warm local worker process, or in a submitit job on a cluster.

The job's output goes to ``job.log`` in its folder (the console keeps the study's progress),
its record ``job.json`` is written atomically after the run returned, so a killed job is never
counted as done, and a failure is recorded with its error and log tail."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lmc.studies.plan import Job, job_args
from lmc.studies.store import StudyStore

LOG_FILE = "job.log"
LOG_TAIL_LINES = 40
Runner = Callable[[list[str]], None]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def lmc_runner(args: list[str]) -> None:
    """Run ``lmc <args>`` in this process."""
    from lmc.cli import main

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


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


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
    job_dir = store.job_dir(job)
    partial = store.partial_run(job) if job.command == "fit" else None
    if partial is None:
        store.clear(job)
    job_dir.mkdir(parents=True, exist_ok=True)
    args = job_args(job, job_dir, [store.run_dir(d) for d in inputs])
    args += list(extra_args or [])
    if partial is not None:
        args.append(f"--ckpt_path={partial}")
    log = job_dir / LOG_FILE
    started, started_unix, t0 = now(), time.time(), time.perf_counter()
    argv = sys.argv
    with output_to(log):
        print(f"lmc {' '.join(args)}", flush=True)
        sys.argv = ["lmc"]  # the job's args are given in-process, not on the command line
        try:
            (runner or lmc_runner)(args)
            status, error = "done", None
        except BaseException as exc:  # a job's failure is recorded, the study goes on
            if isinstance(exc, KeyboardInterrupt):
                raise
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
    return {**job.to_json(), **payload}
