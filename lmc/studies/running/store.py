"""The study folder: ``study.yaml`` (a copy of the study file), ``plan.json`` (the job list),
``jobs/<stage>/<job id>/`` (each job's ``lmc`` root, with its ``job.json``) and ``.lock``.

A job is done only when its ``job.json`` says ``done``; that file is written atomically after
the run returned, so a killed job is never counted as done."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from lmc.io import atomic_write, is_temporary
from lmc.studies.running.plan import Job
from lmc.studies.spec.schema import Study, StudyError

JOB_FILE = "job.json"
PLAN_FILE = "plan.json"
#: the lmc commit of runs made before plan.json recorded it
UNRECORDED = "unrecorded"
STUDY_FILE = "study.yaml"
LOCK_FILE = ".lock"
DAMAGED_DIR = "damaged"  # done jobs whose outputs did not read, set aside before their rerun


def read_plan(root: str | Path) -> dict[str, Any]:
    """The study folder ``root``'s ``plan.json`` (``study``, ``file``, ``runs``: each run's lmc
    commit and start, ``jobs``).

    Raises:
        StudyError: it is missing, or damaged (not JSON, no job list), in one line naming the
            file and the fix.
    """
    path = Path(root) / PLAN_FILE
    if not path.is_file():
        raise StudyError(
            f"{root} is no study folder (no {PLAN_FILE}); run `lmc study run FILE --dir DIR` first"
        )
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        doc, why = None, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    else:
        why = "it holds no job list"
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise StudyError(
            f"{path} is damaged ({why}); `lmc study run <study file> --dir {root}` writes it "
            "again (finished jobs are kept)"
        )
    return doc


def read_study_copy(root: str | Path) -> str:
    """The text of the study folder ``root``'s ``study.yaml`` (the study file as it ran).

    Raises:
        StudyError: it is damaged (not YAML, not a mapping), in one line naming the fix.
    """
    path = Path(root) / STUDY_FILE
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:
        data, why = None, str(err).splitlines()[0] if str(err) else type(err).__name__
    else:
        why = "not a mapping of the study's keys"
    if not isinstance(data, dict):
        raise StudyError(
            f"{path} (the copy of the study file) is damaged ({why}); `lmc study run <study "
            f"file> --dir {root} --force` writes it again (finished jobs are kept)"
        )
    return text


def _write_json(path: Path, payload: Any) -> None:
    atomic_write(path, lambda f: json.dump(payload, f, indent=2, default=str), mode="w")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a killed process its parent has not reaped yet, a zombie,
    does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux): trust the signal
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


#: study folder -> its jobs' damage() findings with their outputs' stat signatures
_DAMAGE: dict[Path, dict[str, tuple[tuple[Any, ...], str | None]]] = {}


class StudyStore:
    """The folder of one study run."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        # job id -> (the stat signature of its outputs, what damage() found), shared by the
        # stores of one folder in this process: a report asks for every job several times
        # (jobs, results, series); a job redone or edited since has another signature
        self._damage = _DAMAGE.setdefault(self.root, {})

    def job_dir(self, job: Job | Mapping[str, Any]) -> Path:
        stage, jid = (job.stage, job.id) if isinstance(job, Job) else (job["stage"], job["id"])
        return self.root / "jobs" / stage / jid

    def holder(self) -> int | None:
        """The id of the live process that holds the lock, if any."""
        try:
            pid = int((self.root / LOCK_FILE).read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        return pid if pid and _pid_alive(pid) else None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold ``.lock`` (it holds this process's id) while the block runs; a lock whose
        process is gone is stale and taken over.

        Raises:
            StudyError: another live process runs this study folder.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / LOCK_FILE
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = self.holder()
                if pid is not None:
                    raise StudyError(
                        f"{self.root} is being run by process {pid} (lock file {path}); wait for "
                        f"it to end or stop it. If no such run exists, delete {path}"
                    ) from None
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            break
        else:  # pragma: no cover - another process took the stale lock between our two tries
            raise StudyError(f"could not take the lock {path}; another run just started")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def init(self, study: Study, jobs: list[Job], force: bool = False) -> None:
        """Make (or reopen) the folder for ``study``: a folder made by a study of another name
        is refused unless ``force``; the study copy and the plan are (re)written."""
        copy = self.root / STUDY_FILE
        if copy.is_file() and not force:
            old = yaml.safe_load(read_study_copy(self.root)).get("name")
            if old != study.name:
                raise StudyError(
                    f"{self.root} holds the study {old!r}, not {study.name!r} "
                    f"({study.path}); give another --dir, or --force to run it there anyway"
                )
        atomic_write(copy, lambda f: f.write(study.text), mode="w")
        path = self.root / PLAN_FILE
        saved = _saved_plan(path)
        # a folder from before lmc recorded its runs: say so rather than credit this commit
        runs = saved.get("runs", [{"lmc_commit": UNRECORDED, "started": None}] if saved else [])
        # each run's lmc commit, so that results can say which code made them
        runs = [*runs, {"lmc_commit": lmc_commit(), "started": _now()}]
        _write_json(
            path,
            {
                "study": study.name,
                "file": str(study.path),
                "runs": runs,
                "jobs": [j.to_json() for j in jobs],
            },
        )

    def plan(self) -> list[dict[str, Any]]:
        """The planned jobs (:func:`read_plan`)."""
        return read_plan(self.root)["jobs"]

    def previous_plan(self, study: Study) -> list[dict[str, Any]] | None:
        """The jobs of the plan this folder holds for ``study`` (by name), or ``None``."""
        saved = _saved_plan(self.root / PLAN_FILE)
        if not saved or saved.get("study") != study.name:
            return None
        return saved.get("jobs")

    def record(self, job: Job | Mapping[str, Any]) -> dict[str, Any] | None:
        """The job's ``job.json``, or ``None`` if it has none (never run, or killed)."""
        path = self.job_dir(job) / JOB_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None

    def is_done(self, job: Job | Mapping[str, Any]) -> bool:
        rec = self.record(job)
        return rec is not None and rec.get("status") == "done"

    def write_record(self, job: Job, payload: dict[str, Any]) -> None:
        _write_json(self.job_dir(job) / JOB_FILE, {**job.to_json(), **payload})

    def run_dir(self, job: Job | Mapping[str, Any]) -> Path:
        """The job's run folder: the one folder under ``<job folder>/lmc/`` with config.yaml.

        Raises:
            StudyError: none or several.
        """
        found = sorted(p.parent for p in (self.job_dir(job) / "lmc").glob("*/config.yaml"))
        if len(found) != 1:
            raise StudyError(
                f"job {self.job_dir(job)} should hold one run folder "
                f"(lmc/<run id>/config.yaml), found {len(found)}"
            )
        return found[0]

    def partial_run(self, job: Job) -> Path | None:
        """The run folder a killed attempt left with ``checkpoints/last.ckpt``, if exactly one."""
        found = [p.parent for p in (self.job_dir(job) / "lmc").glob("*/config.yaml")]
        if len(found) == 1 and (found[0] / "checkpoints" / "last.ckpt").is_file():
            return found[0]
        return None

    def clear(self, job: Job) -> None:
        """Remove what an unfinished attempt left in the job's folder."""
        shutil.rmtree(self.job_dir(job), ignore_errors=True)

    def damage(self, job: Job | Mapping[str, Any]) -> str | None:
        """Why a done job's outputs cannot be read (its run folder, its ``summary.json``, its
        checkpoints), or ``None`` when they can (or the job is not done). Cheap: records are
        parsed, checkpoints only checked to be whole zip archives (torch's format)."""
        if not self.is_done(job):
            return None
        try:
            run = self.run_dir(job)
        except StudyError as err:
            return str(err)
        ckpts = sorted(p for p in (run / "checkpoints").glob("*.ckpt") if not is_temporary(p))
        files = [self.job_dir(job) / JOB_FILE, run / "summary.json", *ckpts]
        signature = tuple(
            (str(f), st.st_size, st.st_mtime_ns) for f in files if (st := _stat(f)) is not None
        )
        kept = self._damage.get(job_id(job))
        if kept is not None and kept[0] == signature:
            return kept[1]
        why = _damage_of(run, ckpts)
        self._damage[job_id(job)] = (signature, why)
        return why

    def set_aside(self, job: Job | Mapping[str, Any]) -> Path:
        """Move a damaged job's folder to ``<root>/damaged/<job id>-<n>`` (kept for a look, out
        of the way of the job's rerun); returns where it went."""
        folder = self.root / DAMAGED_DIR
        folder.mkdir(exist_ok=True)
        n = sum(1 for p in folder.glob(f"{job_id(job)}-*"))
        dest = folder / f"{job_id(job)}-{n + 1}"
        os.replace(self.job_dir(job), dest)
        return dest


def _damage_of(run: Path, ckpts: list[Path]) -> str | None:
    """What cannot be read of a done job's run folder: its ``summary.json`` parsed, its
    checkpoints ``ckpts`` checked to be whole zip archives (torch's format)."""
    from lmc.results import RecordError, read_record

    if (run / "summary.json").is_file():
        try:
            read_record(run)
        except RecordError as err:
            return str(err)
    for ckpt in ckpts:
        if not _whole_zip(ckpt):
            return f"{ckpt} is not a whole checkpoint (truncated or overwritten)"
    return None


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def job_id(job: Job | Mapping[str, Any]) -> str:
    return job.id if isinstance(job, Job) else str(job["id"])


def _whole_zip(path: Path) -> bool:
    """Whether ``path`` is a zip archive whose central directory reads (a truncated file's does
    not): the check of a checkpoint that costs no load."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
        return True
    except (zipfile.BadZipFile, OSError):
        return False


def study_folder(root: str | Path) -> Path:
    """``root`` resolved, once it is known to be a study folder.

    Raises:
        StudyError: it lacks ``plan.json`` or ``study.yaml`` (named).
    """
    root = Path(root).resolve()
    missing = [n for n in (PLAN_FILE, STUDY_FILE) if not (root / n).is_file()]
    if missing:
        raise StudyError(
            f"{root} is no study folder: it has no {' and no '.join(missing)} (a study folder "
            "is made by `lmc study run FILE --dir DIR`)"
        )
    return root


def status(root: str | Path) -> dict[str, dict[str, int]]:
    """Per stage, how many jobs of the study folder ``root`` are done, failed, running (begun
    while a live process holds the lock) and pending (not begun, or begun by a run that was
    stopped: the next run redoes them); ``interrupted`` (only when some are): stopped by Ctrl-C
    or SIGTERM while they ran (the next run resumes them from their last checkpoint);
    ``damaged`` (only when some are): done, but their outputs do not read
    (:meth:`StudyStore.damage`; the next run redoes them)."""
    store = StudyStore(root)
    live = store.holder() is not None
    counts: dict[str, dict[str, int]] = {}
    for job in store.plan():
        rec = store.record(job)
        state = rec.get("status") if rec else None
        if state not in ("done", "failed", "interrupted"):
            state = "running" if live and store.job_dir(job).is_dir() else "pending"
        elif state == "done" and store.damage(job):
            state = "damaged"
        stage = counts.setdefault(
            job["stage"], {"done": 0, "failed": 0, "running": 0, "pending": 0}
        )
        stage[state] = stage.get(state, 0) + 1
    return counts


def damaged_jobs(root: str | Path) -> list[tuple[dict[str, Any], str]]:
    """The done jobs of the study folder ``root`` whose outputs do not read, with why."""
    store = StudyStore(root)
    found = []
    for job in store.plan():
        why = store.damage(job)
        if why:
            found.append((job, why))
    return found


def _saved_plan(path: Path) -> dict[str, Any]:
    """The ``plan.json`` at ``path`` as saved, or ``{}`` when there is none or it is damaged
    (:func:`read_plan` is the checked read)."""
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_commit(folder: Path) -> str | None:
    """HEAD of the git checkout ``folder`` is in, or ``None`` (no git, not a checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


#: the commit a copy of a checkout without its ``.git`` runs (the GPU machine gets the working
#: tree alone): set it there to the commit the copy was made from
COMMIT_ENV = "LMC_COMMIT"


def lmc_commit() -> str:
    """HEAD of the lmc checkout this code runs from, marked when ``lmc/`` has uncommitted
    changes; without a checkout, ``$LMC_COMMIT`` (a copied working tree) or the installed
    version."""
    here = Path(__file__).resolve().parents[2]
    head = git_commit(here) if (here / "lmc").is_dir() else None
    if head is None:
        if os.environ.get(COMMIT_ENV):
            return f"{os.environ[COMMIT_ENV]} (a copy without git: ${COMMIT_ENV})"
        from importlib import metadata

        try:
            return f"lmc {metadata.version('lmc')} (no git checkout)"
        except metadata.PackageNotFoundError:
            return "unknown (no git checkout, not installed: set $LMC_COMMIT)"
    try:
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "lmc"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return head + ("+uncommitted changes in lmc/" if dirty else "")


def run_commits(root: str | Path) -> list[str] | None:
    """The lmc commits the runs of the study folder ``root`` started at (first to last, each
    once), or ``None`` for a folder whose plan records none (made before lmc recorded them)."""
    runs = _saved_plan(Path(root) / PLAN_FILE).get("runs")
    return list(dict.fromkeys(r["lmc_commit"] for r in runs)) if runs else None
