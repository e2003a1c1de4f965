"""``lmc study plan FILE`` / ``run FILE --dir DIR`` / ``status DIR``: parse, call
:mod:`lmc.studies`, print."""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmc study", description="Plan, run and follow a study (a grid of lmc runs)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="check the study file and list its jobs; nothing runs")
    p.add_argument("file")
    r = sub.add_parser("run", help="run the study's jobs that are not done yet")
    r.add_argument("file")
    r.add_argument("--dir", required=True, help="the study folder (made if missing)")
    r.add_argument("--fail-fast", action="store_true", help="stop at the first failed job")
    r.add_argument(
        "--force", action="store_true", help="run in a folder made by a study of another name"
    )
    r.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local worker processes, each running many jobs (default: the study file's "
        "executor.workers, else 1 = in this process); one GPU each where GPUs exist",
    )
    r.add_argument(
        "--executor",
        default="local",
        help="local (this machine) or submitit (SLURM or submitit's local executor, with the "
        "study file's executor.submitit options; pip install -e '.[slurm]')",
    )
    r.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run only shard I of N (for machines without a scheduler); copy the shard "
        "folders together for the whole study",
    )
    s = sub.add_parser("status", help="done / failed / pending jobs per stage")
    s.add_argument("dir")
    return parser


def study_main(args: list[str], raise_errors: bool = False) -> None:
    """Run ``lmc study <args>``. A study error is one line and exit code 1, or, with
    ``raise_errors`` (in-process callers, ``LMC_DEBUG=1``), the exception."""
    from lmc.studies import StudyError

    ns = _parser().parse_args(args)
    try:
        _dispatch(ns, raise_errors)
    except StudyError as err:
        if raise_errors or os.environ.get("LMC_DEBUG"):
            raise
        sys.stderr.write(f"lmc study: error: {err}\n")
        raise SystemExit(1) from None


def _dispatch(ns: argparse.Namespace, in_process: bool) -> None:
    from lmc.studies import load_and_plan, run_study, status

    if ns.command == "plan":
        study, jobs = load_and_plan(ns.file)
        print(f"study {study.name}: {len(jobs)} jobs")
        for job in jobs:
            coords = " ".join(f"{k}={v}" for k, v in job.coordinates.items())
            inputs = f" <- {', '.join(job.inputs)}" if job.inputs else ""
            print(f"{job.stage:10s} {job.id}  {coords}{inputs}")
            print(f"    lmc {' '.join(job.args)}")
    elif ns.command == "run":
        summary = run_study(
            ns.file,
            ns.dir,
            fail_fast=ns.fail_fast,
            force=ns.force,
            workers=ns.workers,
            executor=ns.executor,
            shard_spec=ns.shard,
            progress_bar=sys.stderr.isatty(),
        )
        print(
            f"ran {len(summary.ran)}, skipped {len(summary.skipped)} done, failed "
            f"{len(summary.failed)}, resumed {len(summary.resumed)} in "
            f"{summary.seconds / 60:.1f} min; lmc study status {ns.dir}"
        )
        if summary.failed and not in_process:
            raise SystemExit(1)  # the console sees failed jobs in the exit status
    else:
        for stage, counts in status(ns.dir).items():
            print(f"{stage:10s} " + "  ".join(f"{k} {v}" for k, v in counts.items()))
