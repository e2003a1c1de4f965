"""Curve benchmark on real Fashion-MNIST (002 Table 1 on a CPU budget; SPEC C6).

Two VGG-11 x1/8 (BatchNorm) endpoints are trained once with
``configs/curves/fmnist_vgg11_endpoint.yaml`` (cached under ``benchmarks/.cache``). Between the
same two endpoints, through ``lmc validate`` / ``lmc fit``:

* ``linear``: the straight line theta_1 -> theta_2 (an untrained ``CurveTask``, no alignment);
* ``unaligned``: a quadratic Bezier curve trained from the straight line (Garipov et al.);
* ``aligned``: the same after correlation alignment of theta_2 to theta_1 (002 Alg. 1);
* ``pam``: PAM (002 App. E) from the aligned (default) or unaligned permutation: permutation
  epochs of projected SGD + BvN rounding, then the same curve training budget.

Every path is evaluated at ``--num-ts`` values of t with BatchNorm re-estimated per t on a
train subset, on the test split (``--split val`` for development runs: nothing here is tuned on
test). Prints a table and ends with the line
``min_acc_linear=<..> min_acc_unaligned=<..> min_acc_aligned=<..> min_acc_pam=<..>``.

    LMC_DATA_DIR=/path/to/writable/datasets python benchmarks/curves.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._endpoints import fmnist_vgg_checkpoints, require_data  # noqa: E402

CURVE = ROOT / "configs" / "curves" / "fmnist_vgg11.yaml"
PAM = ROOT / "configs" / "curves" / "fmnist_vgg11_pam.yaml"
CSV = ROOT / "configs" / "loggers" / "csv.yaml"


def _run(subcommand: str, config: Path, out: Path, args: list[str]) -> dict:
    from lmc.cli import main

    argv, sys.argv = sys.argv, sys.argv[:1]  # this script's own options are not LightningCLI's
    try:
        main(
            [
                subcommand,
                "-c",
                str(config),
                "-c",
                str(CSV),
                f"--trainer.logger.init_args.save_dir={out}",
                f"--trainer.default_root_dir={out}",
                *args,
            ]
        )
    finally:
        sys.argv = argv
    [summary] = sorted(out.rglob("summary.json"))
    return json.loads(summary.read_text())["summary"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint-epochs", type=int, default=3)
    p.add_argument(
        "--train-size", type=int, default=12000, help="training images (endpoints, curves)"
    )
    p.add_argument("--curve-epochs", type=int, default=2)
    p.add_argument("--perm-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.02, help="curve SGD learning rate (cosine decay)")
    p.add_argument("--perm-lr", type=float, default=0.2)
    p.add_argument("--pam-start", choices=["aligned", "unaligned"], default="aligned")
    p.add_argument("--num-ts", type=int, default=13)
    p.add_argument(
        "--bn-size", type=int, default=1000, help="train subset for BatchNorm and alignment"
    )
    p.add_argument("--split", choices=["test", "val"], default="test")
    p.add_argument("--out", type=Path, default=None, help="run directory (default: a temp dir)")
    args = p.parse_args(argv)
    require_data("FashionMNIST", "benchmarks/curves.py")

    t0 = time.perf_counter()
    ckpts = fmnist_vgg_checkpoints([0, 1], args.endpoint_epochs, args.train_size)
    t_endpoints = time.perf_counter() - t0
    out = args.out or Path(tempfile.mkdtemp(prefix="lmc_curves_"))
    common = [
        f"--model.init_args.checkpoints=[{ckpts[0]}, {ckpts[1]}]",
        f"--model.init_args.evaluation.splits=[{args.split}]",
        f"--model.init_args.evaluation.num_ts={args.num_ts}",
        "--model.init_args.plane.kind=none",
        f"--data.init_args.limit_train={args.train_size}",
        f"--data.init_args.alignment_size={args.bn_size}",
        "--data.init_args.eval_batch_size=1000",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=2",
        f"--model.init_args.optimizer.init_args.lr={args.lr}",
        "--model.init_args.lr_scheduler=torch.optim.lr_scheduler.CosineAnnealingLR",
        f"--model.init_args.lr_scheduler.init_args.T_max={args.curve_epochs}",
    ]
    fit = [f"--trainer.max_epochs={args.curve_epochs}"]
    runs = {
        "linear": ("validate", CURVE, ["--model.init_args.alignment.method=none"]),
        "unaligned": ("fit", CURVE, [*fit, "--model.init_args.alignment.method=none"]),
        "aligned": ("fit", CURVE, [*fit, "--model.init_args.alignment.method=correlation"]),
        "pam": (
            "fit",
            PAM,
            [
                f"--trainer.max_epochs={args.perm_epochs + args.curve_epochs}",
                "--model.init_args.alignment.method="
                + ("correlation" if args.pam_start == "aligned" else "none"),
                f"--model.init_args.pam.perm_epochs={args.perm_epochs}",
                f"--model.init_args.pam.curve_epochs={args.curve_epochs}",
                f"--model.init_args.pam.perm_lr={args.perm_lr}",
            ],
        ),
    }
    results, seconds = {}, {}
    for name, (sub, config, extra) in runs.items():
        start = time.perf_counter()
        results[name] = _run(sub, config, out / name, [*common, *extra])
        seconds[name] = time.perf_counter() - start

    s = args.split
    print(
        f"\nFashion-MNIST VGG-11 x1/8, {args.train_size} training images; endpoints "
        f"{t_endpoints:.0f} s (cached after the first run); {args.num_ts} values of t, "
        f"BatchNorm re-estimated per t on {args.bn_size} train images; split: {s}"
    )
    print(
        f"{'path':<10} {'acc min':>8} {'acc mean':>9} {'acc arc':>8} {'loss max':>9} "
        f"{'acc t=0':>8} {'acc t=1':>8} {'seconds':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:<10} {r[f'{s}/acc_min']:8.4f} {r[f'{s}/acc_mean']:9.4f} "
            f"{r[f'{s}/acc_arc_mean']:8.4f} {r[f'{s}/loss_max']:9.4f} {r[f'{s}/acc_start']:8.4f} "
            f"{r[f'{s}/acc_end']:8.4f} {seconds[name]:8.1f}"
        )
    aligned = results["aligned"]
    print(
        f"alignment: mean matched correlation {aligned['align_corr_before']:.3f} -> "
        f"{aligned['align_corr_after']:.3f}"
    )
    pam = results["pam"]
    rounds = pam["pam_rounds"]
    print(
        f"PAM ({args.pam_start} start): objective {pam['pam_objective_start']:.4f} -> "
        f"{pam['pam_objective_end']:.4f}; rounding kept candidate "
        f"{[r['chosen'] for r in rounds]} of {[r['candidates'] for r in rounds]} "
        f"(0 = previous permutation), units moved {[r['units_moved'] for r in rounds]}"
    )
    print(f"total {time.perf_counter() - t0:.0f} s; runs under {out}")
    print(" ".join(f"min_acc_{n}={results[n][f'{s}/acc_min']:.4f}" for n in runs))


if __name__ == "__main__":
    main()
