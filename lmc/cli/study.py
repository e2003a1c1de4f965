"""``lmc study plan FILE`` / ``run FILE --dir DIR`` / ``status DIR``: parse, call
:mod:`lmc.studies`, print."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any


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
    r.add_argument(
        "--no-report",
        action="store_true",
        help="do not write the report (DIR/report/report.html, report.md) at the end",
    )
    s = sub.add_parser("status", help="done / failed / running / pending jobs per stage")
    s.add_argument("dir")
    rep = sub.add_parser(
        "report",
        help="write DIR/report/report.html and report.md (figures, tables over seeds, failed "
        "jobs, environment); with --wandb, a W&B Report",
    )
    rep.add_argument("dir")
    rep.add_argument("--out", default=None, help="another folder for the report")
    rep.add_argument(
        "--wandb",
        default=None,
        metavar="ENTITY/PROJECT",
        help="also build a W&B Report of the study's runs there (pip install -e '.[reports]'); "
        "offline, its spec is written to report/wandb_report.json for a later upload",
    )
    c = sub.add_parser(
        "claims",
        help="evaluate the study file's claims on DIR's done jobs: reproduced / contradicted / "
        "inconclusive, each with its estimate and 95 %% interval",
    )
    c.add_argument("dir")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def study_main(args: list[str], raise_errors: bool = False) -> None:
    """Run ``lmc study <args>``. A study error is one line and exit code 1, or, with
    ``raise_errors`` (in-process callers, ``LMC_DEBUG=1``), the exception."""
    from lmc.studies import StudyError

    ns = _parser().parse_args(args)
    previous = signal.getsignal(signal.SIGTERM)
    if ns.command == "run" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # ends like Ctrl-C: workers stopped, one line
    try:
        _dispatch(ns, raise_errors)
    except (StudyError, OSError) as err:  # OSError: a full disk, a read-only folder (lmc.io)
        if raise_errors or os.environ.get("LMC_DEBUG"):
            raise
        message = str(err)
        if isinstance(err, OSError) and err.strerror and err.filename is None:
            # lmc.io's write errors carry the whole message (path and fix) without "[Errno n]"
            message = err.strerror
        sys.stderr.write(f"lmc study: error: {message}\n")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        if raise_errors or os.environ.get("LMC_DEBUG"):
            raise
        again = f"lmc study run {ns.file} --dir {ns.dir}" if ns.command == "run" else "it"
        sys.stderr.write(
            "lmc study: interrupted; finished jobs are kept, running ones were stopped and "
            f"recorded as interrupted: `{again}` goes on from there (resuming them from their "
            "last checkpoint)\n"
        )
        if threading.current_thread() is threading.main_thread():
            # stopped and said so: exit 130 as said, also when a second SIGINT comes in while
            # the interpreter shuts down (it reached the study as a -2 death, 1 run in ~20)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(130) from None
    finally:
        if ns.command == "run" and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _dispatch(ns: argparse.Namespace, in_process: bool) -> None:
    from lmc.studies import load_and_plan, run_study, status
    from lmc.studies.running.store import damaged_jobs
    from lmc.studies.spec.keys import readable_coordinates

    if ns.command == "plan":
        study, jobs = load_and_plan(ns.file, log=print)
        print(f"study {study.name}: {len(jobs)} jobs")
        for job in jobs:
            coords = readable_coordinates(job.coordinates)
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
        if not ns.no_report:
            _report(ns.dir, None, None, after_run=True)
        if summary.failed and not in_process:
            raise SystemExit(1)  # the console sees failed jobs in the exit status
    elif ns.command == "report":
        _report(ns.dir, ns.out, ns.wandb, after_run=False)
    elif ns.command == "claims":
        _claims(ns.dir, ns.json)
    else:
        for stage, counts in status(ns.dir).items():
            print(f"{stage:10s} " + "  ".join(f"{k} {v}" for k, v in counts.items()))
        for record, why in damaged_jobs(ns.dir):
            print(
                f"damaged: {record['stage']} {record['id']} {record['coordinates']}: {why} "
                "(`lmc study run` redoes it)"
            )
        from lmc.studies.running.replicates import read_state

        state = read_state(ns.dir)
        if state:
            print(
                f"replicates: auto: pilot {len(state['pilot'])} values of {state['key']}, "
                f"{len(state['added'])} added (budget {state['budget']})"
            )


def _report(root: str, out: str | None, wandb: str | None, after_run: bool) -> None:
    """Write the study's report; after a run, a report that cannot be written is a warning
    (the study's results are complete either way), on its own an error."""
    from lmc.studies import StudyError
    from lmc.studies.reporting.report import write_report

    try:
        report = write_report(root, out)
    except Exception as err:  # after a run, the study's results stand without a report
        if not after_run or (os.environ.get("LMC_DEBUG") and not isinstance(err, StudyError)):
            raise
        sys.stderr.write(
            f"lmc study: the report was not written: {type(err).__name__}: {err} "
            f"(lmc study report {root} retries)\n"
        )
        return
    for note in report.notes:
        print(f"note: {note}")
    print(f"report: {report.html} ({len(report.figures)} figures), {report.markdown}")
    if wandb:
        from lmc.studies.reporting.wandb_report import publish_or_save

        print(publish_or_save(root, report, wandb))


def _claims(root: str, as_json: bool) -> None:
    import json

    from lmc.studies.claims.verdicts import format_claims, study_claims

    results = study_claims(root)
    if as_json:
        print(json.dumps([r.as_dict() for r in results], indent=2, default=str))
    elif not results:
        print(f"the study in {root} declares no claims (claims: in its study file)")
    else:
        print(format_claims(results))
