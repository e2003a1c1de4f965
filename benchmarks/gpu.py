"""The GPU check (issue 30): the ``gpu`` tests and every GPU figure, in one run of at most
~8 minutes on one H100/H200 — the first thing to run on a GPU.

Each part runs as its own process under a time cap (``--caps`` scales them), its output kept
in ``<out>/<part>.log``; a part that fails or runs out of time leaves its keys ``nan`` and
says so, and the others still run. The parts:

* ``tests``: ``pytest -m gpu`` (every test with a CUDA variant; ``gpu_tests_failed`` counts
  failures and errors, ``gpu_tests_passed`` the passes; the junit XML is kept).
* ``syncs``: host-device synchronisations per training step of ``lmc fit`` (MNIST MLP),
  counted with ``torch.cuda.set_sync_debug_mode`` (``train_syncs_per_step``; each names its
  Python line in the log). A sync stops the CPU from queueing the next step's kernels.
* ``train_mlp``: ``benchmarks/training.py --only mlp``: ``lmc fit`` against the plain
  DataLoader loop (``train_throughput_mlp``) and the plain device-resident loop
  (``train_throughput_mlp_vs_device_loop``), and ``lmc fit`` with the captured step
  (``configs/speed/capture.yaml``: ``train_throughput_mlp_captured`` against the same loops).
* ``train_resnet20``: the same for ResNet-20 x1 on a fake CIFAR-10 of 20k images.
* ``population``: 64 MNIST MLPs as one ``--population`` run against 64 sequential runs, 5
  epochs each (``population_speedup_64``; 16 of the sequential runs timed and scaled by 4), and
  the same at 1 epoch, whose differences give the 4 extra epochs' training alone, without
  either side's start-up (``population_epoch_speedup_64``; issue 48 item 3).
* ``population_profile``: ``benchmarks/population_profile.py``: where that population run's
  time goes (building the members, training, evaluating, writing them; the step's profile in
  the log).
* ``wm``: ``benchmarks/weight_matching.py --only-trained --device cuda``: repeated matching of
  trained ResNet-20 x16 (``wm_repeat_speedup_resnet20x16_trained``, 3 calls) and the cold call on
  trained VGG-11 x4 (``wm_vgg11x4_trained_cold_s``; its repeated calls are left out: plain
  matching of VGG-11 x4 takes minutes a call, and the part hit its cap on the H200), then that
  cold call twice more, with the LAPs' concurrency cap and with the cap before 11-27d side by
  side (an info line).
* ``stemm``: ``benchmarks/ste_mm.py --epoch-only --device cuda``: one STE-MM epoch of 3 MNIST
  MLPs (``stemm_epoch_s``).
* ``lap_device`` (issue 48): ``benchmarks/lap_device.py``: 4 LAPs of n = 2048 by the batched
  device auction finished on the host, against the host kernel one by one
  (``lap_device_speedup_2048x4``).
* ``paper_study`` (issue 48): ``configs/studies/paper/000_training_mnist.yaml`` end to end
  (``lmc study run``, 4 workers on the one GPU, the study capped at 480 s), its evidence
  exported (``lmc.studies.claims.evidence.export_evidence``) and its per-job table and provenance
  copied to the output folder, to be committed under ``docs/reproductions/results/paper/``
  (``paper_study_000_training_mnist_s``, nan unless it finished, and ``..._jobs_done``: the jobs its
  claims read).
  Set ``LMC_COMMIT`` to the commit the copy was made from: that machine gets no ``.git``.
  Run it alone (``--only paper_study``): with the other parts it exceeds one 10-minute call.

Run on the GPU machine (``../shared/gpu/README.md``)::

    . .whl/device-env.sh && python benchmarks/gpu.py --out $OUT

The last line is ``device=<name> gpu_tests_failed=... train_throughput_mlp=... ...``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable

#: part -> (command, cap in seconds, {key printed by the part: key on gpu.py's last line})
PARTS: dict[str, tuple[list[str], int, dict[str, str]]] = {
    "tests": ([], 160, {}),
    "syncs": (
        [PY, "benchmarks/gpu.py", "--count-syncs"],
        35,
        {"train_syncs_per_step": "train_syncs_per_step"},
    ),
    "train_mlp": (
        [PY, "benchmarks/training.py", "--accelerator", "gpu", "--only", "mlp"]
        + ["--epochs", "3", "--repeats", "2"],
        110,
        {
            "train_throughput_mlp": "train_throughput_mlp",
            "train_throughput_mlp_vs_device_loop": "train_throughput_mlp_vs_device_loop",
            "train_throughput_mlp_dataloader": "train_throughput_mlp_dataloader",
            "lmc_epoch_s_mlp": "lmc_epoch_s_mlp",
            "train_throughput_mlp_captured": "train_throughput_mlp_captured",
            "train_throughput_mlp_captured_vs_device_loop": (
                "train_throughput_mlp_captured_vs_device_loop"
            ),
            "lmc_captured_epoch_s_mlp": "lmc_captured_epoch_s_mlp",
            "lean_step_speedup_mlp": "lean_step_speedup_mlp",
            "plain_device_epoch_s_mlp": "plain_device_epoch_s_mlp",
        },
    ),
    "train_resnet20": (
        [PY, "benchmarks/training.py", "--accelerator", "gpu", "--only", "resnet20"]
        + ["--epochs", "3", "--repeats", "1", "--cifar-n", "20000"],
        40,
        {"train_throughput_resnet20": "train_throughput_resnet20"},
    ),
    "population": (
        [PY, "benchmarks/training.py", "--accelerator", "gpu", "--only", "mlp_population"]
        + ["--members", "64", "--mlp-population-epochs", "5", "--sequential-sample", "16"]
        + ["--population-baseline-epochs", "1"],
        180,
        {
            "many_models_speedup_mlp": "population_speedup_64",
            "many_models_epoch_speedup_mlp": "population_epoch_speedup_64",
            "max_abs_diff_mlp": "population_max_abs_diff_64",
        },
    ),
    "population_profile": (
        [PY, "benchmarks/population_profile.py", "--device", "cuda", "--members", "64"]
        + ["--cprofile", "40"],
        120,
        {
            "total_s": "population_64_total_s",
            "build_s": "population_64_build_s",
            "instantiate_s": "population_64_instantiate_s",
            "data_s": "population_64_data_s",
            "to_device_s": "population_64_to_device_s",
            "train_s": "population_64_train_s",
            "step_ms": "population_64_step_ms",
            "evaluate_s": "population_64_evaluate_s",
            "write_s": "population_64_write_s",
            "replay_s": "population_64_replay_s",
        },
    ),
    "wm": (
        [PY, "benchmarks/weight_matching.py", "--only-trained", "--device", "cuda"]
        + ["--calls", "3", "--vgg-calls", "0", "--profile-call"]
        + ["--compare-lap-cells", str(3 * 1024 * 1024)],  # the cap before 11-27d, side by side
        180,
        {
            "wm_repeat_speedup_resnet20x16_trained": "wm_repeat_speedup_resnet20x16_trained",
            "wm_vgg11x4_trained_cold_s": "wm_vgg11x4_trained_cold_s",
            "wm_repeat_speedup_vgg11x4_trained": "wm_repeat_speedup_vgg11x4_trained",
        },
    ),
    "stemm": (
        [PY, "benchmarks/ste_mm.py", "--epoch-only", "--device", "cuda"]
        + ["--models", "3", "--endpoint-epochs", "1", "--threads", "8"],
        60,
        {"stemm_epoch_s": "stemm_epoch_s"},
    ),
    "lap_device": (
        [PY, "benchmarks/lap_device.py", "--device", "cuda", "--n", "2048", "--batch", "4"],
        90,
        {
            "lap_host_s": "lap_host_s_2048x4",
            "lap_auction_finish_s": "lap_auction_finish_s_2048x4",
            "lap_device_speedup": "lap_device_speedup_2048x4",
        },
    ),
    "paper_study": (
        [PY, "benchmarks/gpu.py", "--paper-study", "000_training_mnist"],
        540,
        {
            "paper_study_000_training_mnist_s": "paper_study_000_training_mnist_s",
            "paper_study_000_training_mnist_jobs_done": "paper_study_000_training_mnist_jobs_done",
        },
    ),
}
#: ``paper_study``'s study runs under this cap (s), its evidence exported after, within the part's
PAPER_STUDY_CAP = 480


def last_line_values(text: str) -> dict[str, str]:
    """The ``key=value`` pairs of the last line of ``text`` that has any."""
    for line in reversed(text.strip().splitlines()):
        pairs = re.findall(r"(\S+)=(\S+)", line)
        if pairs:
            return dict(pairs)
    return {}


def run_part(name: str, out: Path, scale: float) -> dict[str, str]:
    """Run one part under its cap; its output goes to ``out/<name>.log``."""
    cmd, cap, keys = PARTS[name]
    if name == "tests":
        cmd = [PY, "-m", "pytest", "-m", "gpu", "-q", "-rfE", "-p", "no:cacheprovider"]
        cmd += [f"--junitxml={out / 'junit.xml'}", "tests"]
    if name == "paper_study":
        cmd = [*cmd, "--out", str(out)]
    cap = int(cap * scale)
    t0 = time.perf_counter()
    log = out / f"{name}.log"
    with log.open("w") as f:
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=cap, check=False
            )
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"stopped at its cap of {cap} s"
    took = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    if name == "tests":
        values = junit_counts(out / "junit.xml")
    else:
        found = last_line_values(text)
        values = {mine: found.get(theirs, "nan") for theirs, mine in keys.items()}
    print(f"[{name}] {status} in {took:.0f} s: " + " ".join(f"{k}={v}" for k, v in values.items()))
    if status != "ok":
        print("\n".join("    " + s for s in text.strip().splitlines()[-15:]), flush=True)
    return values


def junit_counts(path: Path) -> dict[str, str]:
    """``gpu_tests_failed`` (failures + errors) and ``gpu_tests_passed`` from pytest's XML."""
    if not path.exists():
        return {"gpu_tests_failed": "nan", "gpu_tests_passed": "nan"}
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = n["failures"] + n["errors"]
    return {
        "gpu_tests_failed": str(failed),
        "gpu_tests_passed": str(n["tests"] - failed - n["skipped"]),
        "gpu_tests_skipped": str(n["skipped"]),
    }


def count_syncs(steps: int = 60) -> None:
    """Host-device synchronisations per training step of ``lmc fit`` on the MNIST MLP: steps
    after the first epoch's warm-up run under ``set_sync_debug_mode("warn")``; every warning
    is traced to the innermost ``lmc``/``lightning``/``torchmetrics`` line that caused it."""
    import cProfile
    import pstats
    import traceback
    import warnings
    from collections import Counter

    import lightning as L
    import torch

    from benchmarks.training import _cli

    sites: Counter[str] = Counter()
    profile = cProfile.Profile()

    class Count(L.Callback):
        def __init__(self) -> None:
            self.steps = 0
            self.on = False

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.current_epoch == 1 and not self.on and not self.steps:
                torch.cuda.synchronize()
                self.on = True
                torch.cuda.set_sync_debug_mode("warn")
                profile.enable()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.on:
                self.steps += 1
                if self.steps >= steps:
                    profile.disable()
                    torch.cuda.set_sync_debug_mode(0)
                    trainer.should_stop = True
                    self.on = False

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchronizing" not in str(message).lower():
            return
        frames = [
            f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno} {fr.name}"
            for fr in traceback.extract_stack()[:-1]
            if "/lmc/" in fr.filename or "lightning" in fr.filename or "torchmetrics" in fr.filename
        ]
        sites[frames[-1] if frames else f"{filename}:{lineno}"] += 1

    with tempfile.TemporaryDirectory() as tmp:
        cli = _cli(
            ["-c", "configs/mnist/mlp.yaml", "-c", "configs/loggers/csv.yaml"]
            + ["--trainer.accelerator=gpu", "--trainer.max_epochs=3"]
            + ["--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"]
            + [f"--trainer.default_root_dir={tmp}"]
        )
        counter = Count()
        cli.trainer.callbacks.append(counter)
        warnings.showwarning = record
        warnings.simplefilter("always")
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        torch.cuda.set_sync_debug_mode(0)
    for site, n in sites.most_common():
        print(f"{n:5d}  {site}")
    print(f"where the CPU time of {counter.steps} steps goes (progress bar on, as users run):")
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    print(f"train_syncs_per_step={sum(sites.values()) / max(counter.steps, 1):.3f}")


def paper_study(
    name: str,
    out: Path,
    workers: int,
    cap: int = PAPER_STUDY_CAP,
    file: Path | None = None,
    evidence: Path | None = None,
    work: Path | None = None,
) -> dict[str, str]:
    """Run the paper-scale study ``name`` (``configs/studies/paper/<name>.yaml``, or ``file``)
    end to end under ``cap`` seconds (``lmc study run``, ``workers`` jobs at once on the one
    GPU), export its evidence under ``evidence`` (default ``docs/reproductions/results``) and
    copy the per-job table and its provenance to ``out``: committed under
    ``docs/reproductions/results/paper/``, they put the study's claims in the Reproductions
    table. The study folder goes under ``work`` (default a new temporary folder; never under
    ``out``, whose files come back from the GPU machine). A study stopped at the cap exports
    the jobs it finished. Prints and returns
    ``paper_study_<name>_s`` (nan unless it finished) and ``paper_study_<name>_jobs_done``."""
    import json
    import shutil

    from benchmarks.reproductions import EVIDENCE, evidence_csv, study_file
    from lmc.studies.claims.evidence import export_evidence

    file = file or ROOT / study_file("paper", name)
    label = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else file.name
    folder = Path(work or tempfile.mkdtemp(prefix="lmc-paper-")) / "paper" / name
    cmd = [PY, "-m", "lmc", "study", "run", str(file), "--dir", str(folder)]
    cmd += ["--workers", str(workers)]
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=cap, check=False)
        status = "finished" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        status = f"stopped at {cap} s"
    took = time.perf_counter() - t0
    print(f"study {status} in {took:.0f} s", flush=True)
    subprocess.run([PY, "-m", "lmc", "study", "status", str(folder)], cwd=ROOT, check=False)
    csv = evidence_csv("paper", name, evidence or EVIDENCE)
    done = "nan"
    if (folder / "plan.json").is_file():
        provenance = export_evidence(folder, csv, file, label)
        done = str(json.loads(provenance.read_text()).get("claimed_jobs_done", "nan"))
        out.mkdir(parents=True, exist_ok=True)
        for path in (csv, provenance):
            shutil.copy(path, out / path.name)
    values = {
        f"paper_study_{name}_s": f"{took:.1f}" if status == "finished" else "nan",
        f"paper_study_{name}_jobs_done": done,
    }
    print(" ".join(f"{k}={v}" for k, v in values.items()) + f" workers={workers}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="logs (default: $OUT or a tmp)")
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--caps", type=float, default=1.0, help="scale every part's time cap")
    parser.add_argument("--count-syncs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--paper-study", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--study-workers", type=int, default=4, help="paper_study's workers")
    args = parser.parse_args(argv)
    if args.count_syncs:
        count_syncs()
        return
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="lmc-gpu-"))
    if args.paper_study:
        paper_study(args.paper_study, out, args.study_workers)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device (see ../shared/gpu/README.md)")
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; logs in {out}", flush=True)
    t0 = time.perf_counter()
    values: dict[str, str] = {}
    for name in args.only:
        values.update(run_part(name, out, args.caps))
    print(f"total {time.perf_counter() - t0:.0f} s on {device}")
    print(f"device={device.replace(' ', '_')} " + " ".join(f"{k}={v}" for k, v in values.items()))


if __name__ == "__main__":
    main()
