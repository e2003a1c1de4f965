"""Many models at once (issue #16 item 3): one ``--population`` run vs sequential ``lmc fit``.

Trains the 003 student (``configs/synthetic/teacher_student.yaml``, width 32, SGD lr 0.1, CSV
logger, no progress bar) for ``--epochs`` epochs with ``--members`` seeds twice, in this process
(imports are paid once, which is the fair baseline for ``lmc``):

* sequentially: one ``lmc.cli.main(["fit", ..., "--seed_everything", s])`` per seed;
* as one population: ``lmc.cli.main(["fit", ..., "--population", "[s1, ..., sN]"])``.

Both go through the CLI end to end (parse, build, train, validate every epoch, test after fit,
write config and checkpoints). One 1-epoch warm-up of each kind runs first, untimed. Measured:
``many_models_speedup_students`` = sequential wall time / population wall time, and
``max_abs_diff`` = the largest absolute difference between a member's final weights and those
of its sequential twin (they should agree to float round-off).

Run ``python benchmarks/population.py`` (about 1-2 minutes on 2 CPU cores at the defaults;
``--epochs``, ``--members``, ``--dir DIR`` to keep the runs). The last line is
``many_models_speedup_students=<..> sequential_s=<..> population_s=<..> members=<..>
epochs=<..> max_abs_diff=<..>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmc.cli import main  # noqa: E402
from lmc.io import load_checkpoint, resolve_checkpoint  # noqa: E402

CONFIG = ROOT / "configs" / "synthetic" / "teacher_student.yaml"
CSV = ROOT / "configs" / "loggers" / "csv.yaml"


def student_args(width: int = 32, lr: float = 0.1) -> list[str]:
    """The 003 student's config and overrides (``run``'s ``base``)."""
    return [
        "-c",
        str(CONFIG),
        f"--model.init_args.net.init_args.width={width}",
        f"--model.init_args.optimizer.init_args.lr={lr}",
    ]


def _args(root: Path, epochs: int, base: list[str], *extra: str) -> list[str]:
    return [
        "fit",
        *base,
        "-c",
        str(CSV),
        f"--trainer.max_epochs={epochs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        *extra,
    ]


def _timed(args: list[str]) -> float:
    start = time.perf_counter()
    main(args)
    return time.perf_counter() - start


def run(
    folder: Path,
    members: int,
    epochs: int,
    base: list[str],
    key: str = "students",
    sample: int | None = None,
    baseline_epochs: int = 0,
) -> dict[str, float]:
    """Time ``members`` sequential ``lmc fit <base>`` runs against one population of them.

    ``sample``: time only that many of the sequential runs (evenly spaced seeds) and scale
    their sum by ``members / sample`` (every sequential run does the same work; their weights
    are compared with their members). ``baseline_epochs``: time both again at that many epochs
    and report ``many_models_epoch_speedup_<key>``, the ratio of the differences: the training
    of the extra epochs alone, without either side's start-up (building, data, writing).
    """
    seeds = list(range(members))
    timed = seeds if not sample or sample >= members else seeds[:: members // sample][:sample]
    scale = members / len(timed)
    population = f"--population=[{', '.join(map(str, seeds))}]"
    # warm-up: lazy imports and first-call costs of both paths, untimed
    main(_args(folder / "warm_seq", 1, base, "--seed_everything=0"))
    main(_args(folder / "warm_pop", 1, base, population))

    def both(tag: str, n_epochs: int) -> tuple[float, float]:
        seq = sum(
            _timed(_args(folder / f"{tag}seq{s}", n_epochs, base, f"--seed_everything={s}"))
            for s in timed
        )
        return seq * scale, _timed(_args(folder / f"{tag}pop", n_epochs, base, population))

    sequential, pop_seconds = both("", epochs)
    members_dir = folder / "pop" / "lmc" / "version_0" / "members"
    diff = 0.0
    for s in timed:
        mine = load_checkpoint(resolve_checkpoint(members_dir / f"seed={s}"))["state_dict"]
        twin_dir = folder / f"seq{s}" / "lmc" / "version_0"
        twin = load_checkpoint(resolve_checkpoint(twin_dir))["state_dict"]
        diff = max(diff, *(float((mine[k] - v).abs().max()) for k, v in twin.items()))
    out = {
        f"many_models_speedup_{key}": sequential / pop_seconds,
        f"sequential_s_{key}": sequential,
        f"population_s_{key}": pop_seconds,
        f"max_abs_diff_{key}": diff,
    }
    if baseline_epochs:
        seq0, pop0 = both("base_", baseline_epochs)
        out[f"many_models_epoch_speedup_{key}"] = (sequential - seq0) / (pop_seconds - pop0)
        out[f"sequential_base_s_{key}"] = seq0
        out[f"population_base_s_{key}"] = pop0
    return out


def main_cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        r = run(folder, args.members, args.epochs, student_args(args.width, args.lr))
    print(
        f"{args.members} sequential `lmc fit` runs: {r['sequential_s_students']:.1f} s; one "
        f"population: {r['population_s_students']:.1f} s"
    )
    print(
        f"many_models_speedup_students={r['many_models_speedup_students']:.1f} "
        f"sequential_s={r['sequential_s_students']:.1f} "
        f"population_s={r['population_s_students']:.2f} members={args.members} "
        f"epochs={args.epochs} max_abs_diff={r['max_abs_diff_students']:.2e}"
    )


if __name__ == "__main__":
    main_cli()
