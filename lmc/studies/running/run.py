"""Run a study: check it, plan it, then schedule its jobs on an executor (this process, warm
local workers, or submitit): a job starts once the jobs it reads are settled, done jobs are
skipped (an evaluate job only while its inputs are the runs it used), a failed job is recorded
and the others go on (unless fail_fast), and progress (done / running / failed, elapsed, ETA)
is shown as jobs end."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmc.studies.claims.declared import check_claim_metrics, check_figure_metrics
from lmc.studies.running.auto_population import resolve_population
from lmc.studies.running.execute import Runner, input_stamps, now, record_interrupted
from lmc.studies.running.executors import Handle, make_executor
from lmc.studies.running.plan import Job, parse_shard, plan, shard
from lmc.studies.running.store import StudyStore
from lmc.studies.spec.check import check_job_configs, check_jobs, check_study
from lmc.studies.spec.keys import readable_coordinates
from lmc.studies.spec.load import load_study
from lmc.studies.spec.schema import Study, StudyError

POLL_SECONDS = 0.05
#: a plan this large is announced, and its checks show their progress
LARGE_PLAN = 10_000


@dataclass
class RunSummary:
    """What one ``run_study`` call did."""

    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    #: evaluate jobs this shard leaves to a run over the shard folders copied together
    left_to_merge: list[str] = field(default_factory=list)
    seconds: float = 0.0


def load_and_plan(
    path: str | Path, log: Callable[[str], None] | None = None
) -> tuple[Study, list[Job]]:
    """Read, check and plan the study file at ``path`` (no job runs)."""
    study = load_study(path)
    return study, checked_plan(study, log=log)


def checked_plan(
    study: Study,
    previous: list[dict[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    runs_here: bool = True,
) -> list[Job]:
    """The study's jobs, after every check that needs no job to run (:func:`check_study` on
    the configs, :func:`lmc.studies.spec.check.check_jobs` and
    :func:`lmc.studies.spec.check.check_job_configs` on the planned jobs, the claims' metrics
    against what each stage's jobs will report; ``runs_here``: the jobs run on this machine,
    whose devices then decide what can run); ``train.population:
    auto`` is decided here (``previous``: the plan already in the study's folder), and ``log``
    gets the line that says how."""
    resolved = check_study(study)
    study, line = resolve_population(study, resolved["train"], previous)
    if line and log is not None:
        log(line)
    jobs = plan(study, resolved)
    if len(jobs) > LARGE_PLAN and log is not None:
        log(
            f"note: the study plans {len(jobs)} jobs; each distinct job configuration is parsed "
            "and checked before any runs, which takes a while (progress below). A smaller grid, "
            "or shards (--shard I/N), if this is more than you meant"
        )
    if study.replicates is not None and log is not None:
        spec = study.replicates
        log(
            f"replicates: auto: {len(spec.pilot)} values of {spec.key} are the pilot; once its "
            f"jobs are done, up to {spec.budget - len(spec.pilot)} more as the claims need "
            "(80 % power), at most "
            f"{spec.budget} in all"
        )
    check_jobs(jobs, resolved)
    produced = check_job_configs(
        jobs, resolved, log if len(jobs) > LARGE_PLAN else None, runs_here=runs_here
    )
    if study.claims:  # against what each stage's jobs will report
        check_claim_metrics(study.claims, produced)
        if log is not None:
            from lmc.studies.claims.verdicts import sharing_warnings

            for line in sharing_warnings(study.claims, [job.to_json() for job in jobs]):
                log(line)
    check_figure_metrics(study.figures, produced)
    return jobs


def _stale(store: StudyStore, job: Job, by_id: dict[str, Job]) -> bool:
    """A done evaluate job whose input train jobs finished again since it ran."""
    if not job.inputs:
        return False
    used = (store.record(job) or {}).get("inputs_finished")
    return used != input_stamps(store, [by_id[d] for d in job.inputs])


def _study_arg(study: Study, job: Job) -> str:
    """``--study`` of a job: its study, stage, id and coordinates, which the CLI gives the
    W&B logger as group, job_type and config."""
    info = {"name": study.name, "stage": job.stage, "job": job.id, "coordinates": job.coordinates}
    return f"--study={json.dumps(info, default=str)}"


class _Progress:
    """Counts, elapsed time and ETA, as a tqdm bar on a terminal and in each job's line."""

    def __init__(self, total: int, name: str, log: Callable[[str], None], bar: bool) -> None:
        self.total, self.log, self.t0 = total, log, time.perf_counter()
        self.done = self.failed = self.running = 0
        self.ran = 0
        self.bar = None
        if bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=name, unit="job", file=sys.stderr, leave=True)

    def counts(self) -> str:
        elapsed = time.perf_counter() - self.t0
        left = self.total - self.done - self.failed
        eta = elapsed / self.ran * left if self.ran else None  # at the rate so far
        eta_text = f"{eta / 60:.1f} min" if eta is not None else "?"
        return (
            f"done {self.done}/{self.total}, running {self.running}, failed {self.failed}, "
            f"{elapsed / 60:.1f} min, eta {eta_text}"
        )

    def settle(self, line: str | None, ok: bool, ran: bool) -> None:
        self.done += ok
        self.failed += not ok
        self.ran += ran
        if self.bar is not None:
            self.bar.set_postfix_str(f"running {self.running}, failed {self.failed}")
            self.bar.update(1)
        if line is not None:
            text = f"{line} [{self.counts()}]"
            if self.bar is not None:
                self.bar.write(text, file=sys.stderr)
            else:
                self.log(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_study(
    path: str | Path,
    root: str | Path,
    fail_fast: bool = False,
    force: bool = False,
    runner: Runner | None = None,
    log: Callable[[str], None] = print,
    workers: int | None = None,
    executor: str = "local",
    shard_spec: str | None = None,
    progress_bar: bool = False,
) -> RunSummary:
    """Run the study file ``path`` in the folder ``root``.

    Every check (keys, types, grid keys against the base configs, selections, workers, shard,
    executor options) runs before any job.

    Args:
        runner: run ``lmc <args>`` some other way (tests); jobs then run in this process.
        workers: local worker processes (default: the study file's ``executor.workers``, else
            1 = in this process).
        executor: ``local`` or ``submitit`` (the study file's ``executor.submitit`` options).
        shard_spec: ``"i/n"``: run only shard ``i`` of ``n`` (:func:`lmc.studies.running.plan.shard`).
        progress_bar: a live tqdm bar (the CLI shows one on a terminal).

    Raises:
        StudyError: bad study file or options, a folder of another study (without ``force``),
            or a folder another live process runs.
    """
    t_start = time.perf_counter()
    if Path(root).exists() and not Path(root).is_dir():
        raise StudyError(f"--dir {root} is a file: give the study's folder (made if missing)")
    from lmc.studies.running.replicates import added_values, read_state, second_stage

    study = load_study(path)
    if study.replicates is not None and Path(root).is_dir():  # its second stage, once decided
        study = load_study(path, added_values(root))
    store = StudyStore(root)
    workers = study.executor.workers if workers is None else workers
    summary = RunSummary()
    shard_of = parse_shard(shard_spec) if shard_spec is not None else None
    made = not store.root.exists()
    try:
        with store.lock():
            # the workers warm up while the study is checked against its configs
            pool = make_executor(executor, workers, store.root, study.executor.submitit, runner)
            try:
                jobs = checked_plan(
                    study, store.previous_plan(study), log, runs_here=executor == "local"
                )
                selected, left = shard(jobs, *shard_of) if shard_of else (jobs, [])
                summary.left_to_merge = [j.id for j in left]
                store.init(study, jobs, force=force)
                _schedule(study, jobs, selected, store, pool, summary, fail_fast, log, progress_bar)
            except BaseException:  # Ctrl-C, SIGTERM (lmc.cli.study), an error: stop the jobs
                pool.terminate()
                raise
            finally:
                pool.close()
    except BaseException:
        if made and not (store.root / "plan.json").exists():  # refused before any plan:
            shutil.rmtree(store.root, ignore_errors=True)  # no empty --dir left behind
        raise
    if left:
        log(
            f"this shard leaves {len(left)} evaluate job(s) whose trainings other shards run: "
            "copy the shard folders together and run `lmc study run` over it once more"
        )
    if (
        study.replicates is not None
        and shard_of is None
        and not summary.failed
        and read_state(store.root) is None
    ):  # the pilot is done: decide the second stage, then run it
        if second_stage(study, store.root, log):
            more = run_study(
                path, root, fail_fast, force, runner, log, workers, executor, None, progress_bar
            )
            for name in ("ran", "skipped", "failed", "resumed"):
                getattr(summary, name).extend(getattr(more, name))
    summary.seconds = time.perf_counter() - t_start
    return summary


def _schedule(
    study: Study,
    jobs: list[Job],
    selected: list[Job],
    store: StudyStore,
    pool: Any,
    summary: RunSummary,
    fail_fast: bool,
    log: Callable[[str], None],
    progress_bar: bool,
) -> None:
    by_id = {j.id: j for j in jobs}
    index = {j.id: i for i, j in enumerate(jobs, 1)}
    waiting = list(selected)
    running: dict[str, Handle] = {}
    progress = _Progress(len(selected), study.name, log, progress_bar)

    def name(job: Job) -> str:
        coords = readable_coordinates(job.coordinates)
        return f"[{index[job.id]}/{len(jobs)}] {job.stage} {job.id}" + (
            f" {coords}" if coords else ""
        )

    def fail(job: Job, error: str) -> None:
        store.clear(job)
        store.write_record(job, {"status": "failed", "error": error, "log_tail": ""})
        summary.failed.append(job.id)
        progress.settle(f"{name(job)}: failed ({error})", ok=False, ran=False)

    stop = False
    try:
        while waiting or running:
            changed = False
            for job in list(waiting):
                if stop:
                    break
                open_ids = {j.id for j in waiting} | set(running)
                if any(d in open_ids for d in job.inputs):
                    continue  # an input is still to run in this study run
                changed = True
                if store.is_done(job) and not _stale(store, job, by_id):
                    why = store.damage(job)
                    if why is None:
                        waiting.remove(job)
                        summary.skipped.append(job.id)
                        progress.settle(None, ok=True, ran=False)
                        continue
                    moved = store.set_aside(job)  # kept for a look; the job is redone
                    log(f"{name(job)}: damaged ({why}); set aside in {moved}, redoing it")
                missing = [d for d in job.inputs if not store.is_done(by_id[d])]
                if missing:
                    waiting.remove(job)
                    fail(job, f"needs train job(s) {', '.join(missing)}, which did not finish")
                    stop = fail_fast
                    continue
                if pool.capacity is not None and len(running) >= pool.capacity:
                    changed = False  # not started after all
                    break
                waiting.remove(job)
                inputs = [by_id[d] for d in job.inputs]
                if job.command == "fit" and not job.members and store.partial_run(job):
                    summary.resumed.append(job.id)
                progress.running += 1
                running[job.id] = pool.submit(store.root, job, inputs, [_study_arg(study, job)])
            if stop:
                waiting.clear()
            ended = [jid for jid, handle in running.items() if handle.done()]
            if not ended:
                if not running and waiting and not changed:
                    raise RuntimeError(f"no job can start: {[j.id for j in waiting]}")
                time.sleep(POLL_SECONDS)
                continue
            for jid in ended:
                job, handle = by_id[jid], running.pop(jid)
                progress.running -= 1
                try:
                    record = handle.result()
                except Exception as exc:  # the worker process itself died or was lost
                    record = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
                    store.write_record(
                        job, {**record, "log_tail": "", "finished": now(), "worker_lost": True}
                    )
                ok = record.get("status") == "done"
                (summary.ran if ok else summary.failed).append(jid)
                detail = "done" if ok else f"failed ({record.get('error')})"
                if record.get("seconds"):
                    detail += f" in {record['seconds']:.1f} s"
                progress.settle(f"{name(job)}: {detail}", ok=ok, ran=True)
                if not ok and fail_fast:
                    stop = True
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: stop the running jobs, say which they were
        pool.terminate()
        for jid in running:
            record_interrupted(store, by_id[jid])
        raise
    finally:
        progress.close()
