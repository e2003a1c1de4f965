"""Where one ``lmc fit --population`` run spends its time (issue 30 item 6): the phases of a
population of ``--members`` MNIST MLPs (configs/mnist/mlp.yaml) trained ``--epochs`` epochs
through the CLI, and a profile of its training steps.

Phases (wall time, the device synchronised at each end; each exclusive of the phases it calls):
building the members (``PopulationFit``: ``instantiate`` their configs or call their classes,
read the training ``data`` and check the first member, stack them and move them ``to_device``,
``build`` the rest), training (``train_population``), the
evaluations (validation each epoch, test after fit), writing the members (checkpoints, configs)
and replaying their metrics to their own loggers; ``other`` is the rest of the CLI run. Then
``--profile-steps`` more training steps of the same population under ``torch.profiler``: the
top operators by device and by host time (printed), and the step's wall time. With
``--cprofile N``, a third run under cProfile prints the N functions of most host time.

Run ``python benchmarks/population_profile.py`` (``--device cuda`` on a GPU machine: the CPU
default is for a smoke test). The last line is ``device=... members=... total_s=...
build_s=... instantiate_s=... data_s=... to_device_s=... train_s=... evaluate_s=... write_s=...
replay_s=... other_s=... step_ms=... profile_s=...`` (the phases, ``other`` and the profiled steps add up to the total).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lmc.population.build as build  # noqa: E402
import lmc.population.fit as fit  # noqa: E402
from benchmarks._endpoints import require_data  # noqa: E402
from lmc.cli import main  # noqa: E402

PHASES = {
    "build": 0.0,  # the rest of building: checks, the first member's data module, stacking
    "instantiate": 0.0,  # the members' configs instantiated (their tasks)
    "data": 0.0,  # the training data read into memory and the first member checked
    "to_device": 0.0,  # stacked members, optimizer and data moved to the device
    "train": 0.0,
    "evaluate": 0.0,
    "write": 0.0,
    "replay": 0.0,
}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


_STACK: list[float] = []  # time spent in nested phases, one entry per open phase


def _timed(name: str, fn):  # type: ignore[no-untyped-def]
    """``fn`` timed into ``PHASES[name]``, exclusive of the phases it calls (the validation
    and the members' writing run inside the training's epoch ends)."""

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        _sync()
        t0 = time.perf_counter()
        _STACK.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            took = time.perf_counter() - t0
            PHASES[name] += took - _STACK.pop()
            if _STACK:
                _STACK[-1] += took

    return wrapper


def _profile(population, optimizer, x, y, batch_size: int, steps: int) -> float:  # type: ignore[no-untyped-def]
    """``steps`` more training steps under the profiler; prints its tables, returns ms a step."""
    from torch.profiler import ProfilerActivity, profile

    n = len(x)
    gen = torch.Generator().manual_seed(0)
    order = torch.stack([torch.randperm(n, generator=gen) for _ in range(population.size)])
    batches = list(order.to(x.device).split(batch_size, dim=1))[:steps]
    activities = [ProfilerActivity.CPU]
    if x.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def step(idx):  # type: ignore[no-untyped-def]
        losses = population.losses(x[idx], y[idx])
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()

    for idx in batches[:3]:  # warm-up
        step(idx)
    _sync()
    t0 = time.perf_counter()
    for idx in batches:
        step(idx)
    _sync()
    ms = (time.perf_counter() - t0) / len(batches) * 1e3
    with profile(activities=activities) as prof:
        for idx in batches:
            step(idx)
        _sync()
    device_key = "self_cuda_time_total" if x.device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=device_key, row_limit=15))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return ms


def main_cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument(
        "--cprofile", type=int, default=0, help="then a run under cProfile: its top N functions"
    )
    parser.add_argument(
        "--no-warm-up", action="store_true", help="skip the untimed first run (smoke tests)"
    )
    args = parser.parse_args(argv)
    require_data("MNIST", "benchmarks/population_profile.py")
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    step_ms = float("nan")
    real_train = fit.train_population

    def train(population, optimizer, scheduler, interval, x, y, orders, epochs, batch_size, *rest):  # type: ignore[no-untyped-def]
        nonlocal step_ms
        steps = _timed("train", real_train)(
            population, optimizer, scheduler, interval, x, y, orders, epochs, batch_size, *rest
        )
        if args.profile_steps:
            t0 = time.perf_counter()
            step_ms = _profile(population, optimizer, x, y, batch_size, args.profile_steps)
            PHASES["profile"] = PHASES.get("profile", 0.0) + time.perf_counter() - t0
        return steps

    fit.train_population = train
    cls = fit.PopulationFit
    cls.__init__ = _timed("build", cls.__init__)  # type: ignore[method-assign]
    cls._instantiate = _timed("instantiate", cls._instantiate)  # type: ignore[method-assign]
    cls._task = _timed("instantiate", cls._task)  # type: ignore[method-assign]
    direct = build.DirectBuild
    direct.__call__ = _timed("instantiate", direct.__call__)  # type: ignore[method-assign]
    cls._check_first = _timed("data", cls._check_first)  # type: ignore[method-assign]
    cls._setup = _timed("to_device", cls._setup)  # type: ignore[method-assign]
    cls._evaluate = _timed("evaluate", cls._evaluate)  # type: ignore[method-assign]
    cls._write_members = _timed("write", cls._write_members)  # type: ignore[method-assign]
    cls._log_members = _timed("replay", cls._log_members)  # type: ignore[method-assign]
    seeds = ", ".join(map(str, range(args.members)))
    with tempfile.TemporaryDirectory() as tmp:

        def run(folder: str, epochs: int) -> float:
            t0 = time.perf_counter()
            main(
                ["fit", "-c", str(ROOT / "configs/mnist/mlp.yaml")]
                + ["-c", str(ROOT / "configs/loggers/csv.yaml")]
                + [f"--trainer.max_epochs={epochs}", f"--trainer.accelerator={accelerator}"]
                + ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
                + [f"--trainer.default_root_dir={tmp}/{folder}", f"--population=[{seeds}]"]
            )
            return time.perf_counter() - t0

        profile_steps, args.profile_steps = args.profile_steps, 0
        if not args.no_warm_up:
            run("warm", 1)  # lazy imports, kernels, the data's first read: untimed
        for k in PHASES:
            PHASES[k] = 0.0
        args.profile_steps = profile_steps
        total = run("timed", args.epochs)
        timed = dict(PHASES)
        if args.cprofile:  # a third run under cProfile: where the host's time goes
            profile_steps, args.profile_steps = args.profile_steps, 0
            profile = cProfile.Profile()
            profile.enable()
            run("cprofiled", args.epochs)
            profile.disable()
            args.profile_steps = profile_steps
            print("the same run under cProfile (the host's time, by function):")
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(
                args.cprofile
            )
            PHASES.clear()
            PHASES.update(timed)
    # the profile ran inside the train phase: take it out of the run's figures
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    profile_s = PHASES.pop("profile", 0.0)
    other = total - sum(PHASES.values()) - profile_s
    print(
        f"device={name.replace(' ', '_')} members={args.members} epochs={args.epochs} "
        f"total_s={total:.3f} "
        + " ".join(f"{k}_s={v:.3f}" for k, v in PHASES.items())
        + f" other_s={other:.3f} step_ms={step_ms:.3f} profile_s={profile_s:.3f}"
    )


if __name__ == "__main__":
    main_cli()
