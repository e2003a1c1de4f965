"""Run a study: check it, plan it, then run its jobs in order (train, then each evaluate stage),
in this process, one after the other, through the ``lmc`` CLI entry point. Done jobs are
skipped (an evaluate job only while its input train jobs are the runs it used); a failed job
is recorded with its error and the others go on (unless fail_fast)."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from lmc.studies.check import check_study
from lmc.studies.plan import Job, job_args, plan
from lmc.studies.schema import Study, load_study
from lmc.studies.store import StudyStore

LOG_TAIL_LINES = 40


@dataclass
class RunSummary:
    """What one ``run_study`` call did."""

    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)


class _Tee:
    """Write to a stream and keep a copy (the job's log tail)."""

    def __init__(self, stream: TextIO, lines: list[str]) -> None:
        self.stream, self.lines = stream, lines

    def write(self, text: str) -> int:
        self.lines.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _default_runner(args: list[str]) -> None:
    from lmc.cli import main

    main(args)


def load_and_plan(path: str | Path) -> tuple[Study, list[Job]]:
    """Read, check and plan the study file at ``path`` (no job runs)."""
    study = load_study(path)
    return study, plan(study, check_study(study))


def run_study(
    path: str | Path,
    root: str | Path,
    fail_fast: bool = False,
    force: bool = False,
    runner: Callable[[list[str]], None] = _default_runner,
    log: Callable[[str], None] = print,
) -> RunSummary:
    """Run the study file ``path`` in the folder ``root``.

    Every check (keys, types, grid keys against the base configs, pairs) runs before any job.
    A train job that a killed attempt left with ``last.ckpt`` resumes from it
    (``--ckpt_path <run folder>``); any other unfinished attempt is removed and redone.

    Raises:
        StudyError: bad study file, a folder of another study (without ``force``), or a folder
            another live process runs.
    """
    study, jobs = load_and_plan(path)
    store = StudyStore(root)
    summary = RunSummary()
    with store.lock():
        store.init(study, jobs, force=force)
        by_id = {j.id: j for j in jobs}
        for i, job in enumerate(jobs, 1):
            name = f"[{i}/{len(jobs)}] {job.stage} {job.id} {job.coordinates}"
            if store.is_done(job) and not _stale(store, job, by_id):
                summary.skipped.append(job.id)
                continue
            missing = [d for d in job.inputs if not store.is_done(by_id[d])]
            if missing:
                error = f"needs train job(s) {', '.join(missing)}, which did not finish"
                store.clear(job)
                store.write_record(job, {"status": "failed", "error": error, "log_tail": ""})
                summary.failed.append(job.id)
                log(f"{name}: failed ({error})")
                if fail_fast:
                    break
                continue
            inputs = [by_id[d] for d in job.inputs]
            ok = _run_job(store, job, inputs, runner, summary)
            log(f"{name}: {'done' if ok else 'failed'}")
            if not ok and fail_fast:
                break
    return summary


def _input_stamps(store: StudyStore, inputs: list[Job]) -> dict[str, str | None]:
    """When each input job finished: an evaluate job is redone when an input was redone."""
    return {d.id: (store.record(d) or {}).get("finished") for d in inputs}


def _stale(store: StudyStore, job: Job, by_id: dict[str, Job]) -> bool:
    """A done evaluate job whose input train jobs finished again since it ran."""
    if not job.inputs:
        return False
    used = (store.record(job) or {}).get("inputs_finished")
    return used != _input_stamps(store, [by_id[d] for d in job.inputs])


def _run_job(
    store: StudyStore,
    job: Job,
    input_jobs: list[Job],
    runner: Callable[[list[str]], None],
    summary: RunSummary,
) -> bool:
    inputs = [store.run_dir(d) for d in input_jobs]
    job_dir = store.job_dir(job)
    partial = store.partial_run(job) if job.command == "fit" else None
    if partial is None:
        store.clear(job)
    job_dir.mkdir(parents=True, exist_ok=True)
    args = job_args(job, job_dir, inputs)
    if partial is not None:
        args.append(f"--ckpt_path={partial}")
        summary.resumed.append(job.id)
    started, t0 = _now(), time.perf_counter()
    lines: list[str] = []
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(out, lines), _Tee(err, lines)
    try:
        runner(args)
        status, error = "done", None
    except Exception as exc:  # a job's failure is recorded, the study goes on
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        lines.append(traceback.format_exc())
    finally:
        sys.stdout, sys.stderr = out, err
    tail = "".join(lines).splitlines()[-LOG_TAIL_LINES:]
    payload = {
        "status": status,
        "error": error,
        "log_tail": "\n".join(tail) if status == "failed" else "",
        "resolved_args": args,
        "resumed": partial is not None,
        "started": started,
        "finished": _now(),
        "seconds": round(time.perf_counter() - t0, 3),
        "inputs_finished": _input_stamps(store, input_jobs),
    }
    if status == "done":
        try:
            payload["run_dir"] = str(store.run_dir(job).relative_to(store.root))
        except Exception as exc:  # no single run folder: not usable as done
            payload.update(status="failed", error=str(exc))
    store.write_record(job, payload)
    (summary.ran if payload["status"] == "done" else summary.failed).append(job.id)
    return payload["status"] == "done"
