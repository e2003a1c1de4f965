"""Where a study's jobs run: in the study's own process, in a pool of warm local worker
processes, or through submitit (SLURM, or its local executor). Each returns, per submitted job,
a handle with ``done()`` and ``result()`` (the job's record); the scheduler in
:mod:`lmc.studies.running.run` decides what to submit when."""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Protocol

from lmc.studies.running.execute import Runner, execute_job
from lmc.studies.running.plan import Job
from lmc.studies.spec.schema import StudyError

EXECUTORS = ("local", "submitit")


class Handle(Protocol):
    def done(self) -> bool: ...

    def result(self) -> dict[str, Any]: ...


class Executor(Protocol):
    @property
    def capacity(self) -> int | None:
        """How many jobs may run at once (``None``: as many as are ready; the cluster queues
        them)."""
        ...

    def submit(self, root: Path, job: Job, inputs: list[Job], extra_args: list[str]) -> Handle: ...

    def close(self) -> None: ...

    def terminate(self) -> None:
        """Stop every running job now (an interrupted study writes nothing after)."""
        ...


class _Finished:
    def __init__(self, record: dict[str, Any]) -> None:
        self._record = record

    def done(self) -> bool:
        return True

    def result(self) -> dict[str, Any]:
        return self._record


class InProcess:
    """Each job runs in the study's process when submitted (``--workers 1``)."""

    capacity = 1

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner

    def submit(self, root: Path, job: Job, inputs: list[Job], extra_args: list[str]) -> Handle:
        return _Finished(execute_job(root, job, inputs, extra_args, runner=self.runner))

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass  # the interrupt already stopped the job running in this process


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies, so a killed study leaves no
    worker running a job on its own."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's pipes end the workers instead
        pass


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc``; ``None`` elsewhere or when it is
    gone), so a pid the system reused is not taken for the study."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _study_alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or its pid now another user's
        return False
    return started is None or _start_time(pid) == started


def _watch_study(pid: int, started: str | None, every: float = 0.5) -> None:
    """End this worker as soon as the study process ``pid`` is gone. A worker's parent is the
    fork server, which every worker keeps alive, so neither the parent-death signal nor the
    pool's pipes reach it while a job runs: without this, a study killed by SIGTERM or SIGKILL
    (its process alone, not its group) left its workers finishing their jobs into its folder."""

    def watch() -> None:
        while _study_alive(pid, started):
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="lmc-study-watch", daemon=True).start()


def _warm_worker(slots: Any, threads: int, gpus: int, study: tuple[int, str | None]) -> None:
    """Start a worker: its own GPU (round-robin when GPUs exist), ``threads`` CPU threads, and
    ``lmc``'s CLI imported once, so each job it runs costs only its own work. It ends when the
    study process ``study`` (pid, start time) does."""
    _die_with_parent()
    _watch_study(*study)
    index = slots.get()
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
    import torch

    torch.set_num_threads(threads)
    import lmc.engine.app  # noqa: F401  (lightning, torchmetrics, torchvision: seconds, paid once)


def _gpu_count() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # pragma: no cover - a broken CUDA setup: run on CPU
        return 0


class LocalPool:
    """``workers`` warm worker processes that run many jobs each; one GPU per worker when GPUs
    exist, else the CPU cores shared out.

    Workers are forked from a fork server that imported ``lmc``'s CLI once (started here, so it
    warms up while the study is checked), so they start clean (no threads or CUDA state of the
    study's process) and warm (each job costs only its own work)."""

    def __init__(self, workers: int) -> None:
        if "forkserver" in mp.get_all_start_methods():
            context: BaseContext = mp.get_context("forkserver")
            context.set_forkserver_preload(["lmc.engine.app"])
            from multiprocessing import forkserver, resource_tracker

            # The fork server (and the workers it forks) must not see a Ctrl-C: one while it
            # imported lmc printed its traceback under the study's line; the study stops the
            # workers, and a job notes the interrupt itself (execute.noting_interrupts). So
            # SIGINT is blocked here while it starts: it inherits the mask, keeps the signal
            # pending and ignores it once it runs (multiprocessing.forkserver.main), and a
            # Ctrl-C in this window stays pending here and is raised once unblocked. The
            # resource tracker starts first: its start unblocks SIGINT in this thread (CPython
            # masks it around that start and unmasks it after), which reopened the window
            # when it ran inside it (a Ctrl-C then was lost, about 1 study in 10).
            resource_tracker.ensure_running()
            main = threading.current_thread() is threading.main_thread()
            if main:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                forkserver.ensure_running()
            finally:
                if main:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        else:  # pragma: no cover - Windows: spawn, each worker imports lmc once
            context = mp.get_context("spawn")
        self.capacity = workers
        self._context, self._gpus = context, _gpu_count()
        self._threads = max(1, (os.cpu_count() or 1) // workers)
        self._pool = self._start()

    def _start(self) -> cf.ProcessPoolExecutor:
        slots = self._context.Queue()  # worker i takes index i: its GPU
        for i in range(self.capacity):
            slots.put(i)
        return cf.ProcessPoolExecutor(
            self.capacity,
            mp_context=self._context,
            initializer=_warm_worker,
            initargs=(slots, self._threads, self._gpus, (os.getpid(), _start_time(os.getpid()))),
        )

    def submit(self, root: Path, job: Job, inputs: list[Job], extra_args: list[str]) -> Handle:
        try:
            return self._pool.submit(execute_job, root, job, inputs, extra_args)
        except cf.process.BrokenProcessPool:  # a worker died (e.g. out of memory): new pool
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._start()
            return self._pool.submit(execute_job, root, job, inputs, extra_args)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def terminate(self) -> None:
        """Kill the workers (their running jobs leave partial folders, which the next run
        resumes or redoes) and drop the queued jobs."""
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        # let the pool's manager thread finish closing its pipes now: the interpreter's exit
        # hook wakes it through one of them, and a wake racing the close printed an OSError
        # ("Bad file descriptor") after the interrupt's message
        manager = getattr(self._pool, "_executor_manager_thread", None)
        if manager is not None:
            manager.join(timeout=5)


class Submitit:
    """One submitit job per study job (SLURM with ``cluster: slurm`` or by default where
    ``sbatch`` exists; ``cluster: local`` runs real subprocesses on this machine, as CI does).
    Options are those of the study file's ``executor.submitit`` besides ``cluster``: any
    ``AutoExecutor.update_parameters`` keyword, e.g. ``slurm_partition``, ``timeout_min``,
    ``gpus_per_node``, ``slurm_array_parallelism``."""

    capacity = None

    def __init__(self, folder: Path, options: dict[str, Any]) -> None:
        try:
            import submitit
        except ImportError:
            raise StudyError(
                '--executor submitit needs submitit: pip install -e ".[slurm]"'
            ) from None
        self._submitted: list[_SubmititHandle] = []
        options = dict(options)
        cluster = options.pop("cluster", None)
        try:
            self._executor = submitit.AutoExecutor(folder=folder / "submitit", cluster=cluster)
            self._executor.update_parameters(**options)
        except Exception as err:  # submitit's NameError / ValueError / assertion on an option
            raise StudyError(f"executor.submitit: {err}".rstrip()) from None

    def submit(self, root: Path, job: Job, inputs: list[Job], extra_args: list[str]) -> Handle:
        self._executor.update_parameters(name=f"{job.stage}-{job.id}")
        handle = _SubmititHandle(self._executor.submit(execute_job, root, job, inputs, extra_args))
        self._submitted.append(handle)
        return handle

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        """Stop the jobs submitted and not finished, once each: on SLURM ``scancel`` (its
        SIGTERM is the job's interrupt); with submitit's local executor, SIGINT to each job's
        own process, then a wait of up to 10 s for it to record itself as interrupted (a
        SIGINT to submitit's controller instead left it printing two tracebacks into the
        study's console after the study had stopped)."""
        pending, self._submitted = [h for h in self._submitted if not h.done()], []
        for handle in pending:
            tasks = _local_tasks(handle._job)
            try:
                if tasks:
                    for pid in tasks:
                        os.kill(pid, signal.SIGINT)
                else:
                    handle._job.cancel(check=False)
            except Exception:  # noqa: BLE001 - best effort: already gone, no scheduler
                pass
        deadline = time.monotonic() + 10
        while any(not h.done() for h in pending) and time.monotonic() < deadline:
            time.sleep(0.05)
        for handle in pending:
            if not handle.done():
                try:
                    handle._job.cancel(check=False)
                except Exception:  # noqa: BLE001
                    pass


def _local_tasks(job: Any) -> list[int]:
    """The processes a submitit local job's controller started (Linux ``/proc``); none for a
    SLURM job or elsewhere."""
    process = getattr(job, "_process", None)
    pid = getattr(process, "pid", None)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(p) for p in children.read_text().split()] if pid else []
    except (OSError, ValueError):
        return []


class _SubmititHandle:
    def __init__(self, job: Any) -> None:
        self._job = job

    def done(self) -> bool:
        return self._job.done()

    def result(self) -> dict[str, Any]:
        return self._job.result()


def make_executor(
    name: str, workers: int, root: Path, submitit_options: dict[str, Any], runner: Runner | None
) -> Executor:
    """The executor ``name`` (``local`` or ``submitit``).

    Raises:
        StudyError: an unknown name, ``workers < 1``, or submitit missing or refusing an option.
    """
    if name not in EXECUTORS:
        raise StudyError(f"--executor {name}: unknown; valid: {', '.join(EXECUTORS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise StudyError(
            f"--workers {workers}: give a whole number >= 1 (1 runs jobs in this process)"
        )
    if name == "submitit":
        return Submitit(root, submitit_options)
    if workers == 1 or runner is not None:
        return InProcess(runner)
    return LocalPool(workers)
