"""Merging models of disjoint tasks (issue 33; ZipIt!, Stoica et al., ICLR 2024, §5): the joint
accuracy of a pair of models trained on labels 0-4 and 5-9, merged by plain weight averaging,
weight matching, activation matching (permute), zip and partial zip, against the pair's output
ensemble.

Runs the two study files through the study engine (``benchmarks/studies.py``'s runner: a
folder that already holds a study's done jobs is only read): ``configs/studies/zipit_disjoint.yaml``
(MLPs 784-512x3-10 on MNIST and on Fashion-MNIST, 3 trials each) and
``configs/studies/zipit_disjoint_vgg.yaml`` (VGG-11 with BatchNorm, width 1/4, on MNIST, 3
trials). The numbers come from the studies' results tables, means over the trials:

* ``joint_acc_{wavg,wm,permute,zip_full}``: MNIST MLPs, merged by naive averaging, ``wm_ref``,
  ``permute`` and ``zip`` (alpha 0.3, beta 0.125), evaluated on all ten digits;
  ``joint_acc_zip_partial``: zip of the first 2 of the 3 hidden layers, each model keeping its
  last hidden layer and output layer as a head (``joint_acc_zip_until1``: 1 of 3);
  ``joint_acc_ensemble``: the pair's averaged outputs (two models' cost, the ceiling);
* the same keys with ``_fmnist`` (Fashion-MNIST MLPs) and ``_vgg`` (MNIST VGG-11s; partial
  zipping at 3 and 6 of the 8 conv layers, ``joint_acc_zip_partial_vgg`` = 6);
* ``task_acc_*``: per-task accuracy (a task's examples, the prediction among its labels),
  mean of the two tasks.

Run ``LMC_DATA_DIR=<writable copy of MNIST and FashionMNIST> python benchmarks/zipit.py``
(``--dir`` for the study folders, ``--workers``). About 6 minutes on 2 CPU cores. The last line
is ``joint_acc_wavg=... joint_acc_wm=... joint_acc_permute=... joint_acc_zip_full=...
joint_acc_zip_partial=... joint_acc_ensemble=...`` and then the other keys.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.studies import print_line, run_and_read  # noqa: E402

HEADLINE = (
    "joint_acc_wavg",
    "joint_acc_wm",
    "joint_acc_permute",
    "joint_acc_zip_full",
    "joint_acc_zip_partial",
    "joint_acc_ensemble",
)
#: the partial cut each study reports as ``joint_acc_zip_partial``: the deeper of its two
PARTIAL = {"": "zip_until2", "_fmnist": "zip_until2", "_vgg": "zip_until6"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / "benchmarks" / ".cache" / "studies")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    numbers: dict[str, float] = {}
    failed = []
    for name in ("zipit_disjoint", "zipit_disjoint_vgg"):
        read, broke, _ = run_and_read(name, args.dir / name, args.workers)
        numbers.update(read)  # type: ignore[arg-type]
        if broke:
            failed.append(name)
    for suffix, cut in PARTIAL.items():
        for kind in ("joint_acc", "task_acc"):
            numbers[f"{kind}_zip_partial{suffix}"] = numbers[f"{kind}_{cut}{suffix}"]
    line = [f"{k}={numbers[k]:.4g}" for k in HEADLINE]
    line += [f"{k}={v:.4g}" for k, v in numbers.items() if k not in HEADLINE]
    print("device=cpu", flush=True)
    print_line(line, failed)


if __name__ == "__main__":
    main()
