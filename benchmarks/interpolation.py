"""Interpolation cost and the MNIST barrier check (issue 4).

Trains (or loads from benchmarks/.cache) two MNIST MLPs with configs/mnist/mlp.yaml, seeds 0
and 1, then on the test split:

* the loss barrier naive vs weight-matched, and the reduction (acceptance: >= 80%);
* the time of the whole 25-point evaluation of one path vs 25 plain forward passes of one
  fixed model over the same (cached) data, both measured here; BN/REPAIR time is reported
  separately (this MLP has no BatchNorm; REPAIR is timed on the matched path).

Run ``LMC_DATA_DIR=<copy of the datasets> python benchmarks/interpolation.py``. The last line is
``interp_overhead=<25-point evaluation time / 25 plain forward passes>``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._endpoints import mnist_mlp_checkpoints, require_data  # noqa: E402
from lmc.data import MNISTDataModule  # noqa: E402
from lmc.interpolation import cache_batches, evaluate, interpolate_path  # noqa: E402
from lmc.interpolation.barrier import alpha_grid  # noqa: E402
from lmc.interpolation.study import match_states  # noqa: E402
from lmc.io import load_checkpoint, model_state_dict  # noqa: E402
from lmc.models import MLP  # noqa: E402


def main() -> None:
    require_data("MNIST", "benchmarks/interpolation.py")
    torch.set_num_threads(2)
    ckpts = mnist_mlp_checkpoints([0, 1], epochs=3)
    a, b = (model_state_dict(load_checkpoint(p)) for p in ckpts)
    dm = MNISTDataModule(eval_batch_size=2000, alignment_size=5000)
    dm.setup("fit")
    test = cache_batches(dm.test_dataloader())
    align = cache_batches(dm.alignment_dataloader(2000))
    net = MLP()
    (_, b_matched), _ = match_states(net, [a, b], "weight")
    alphas = alpha_grid(25)

    naive, _ = interpolate_path(net, a, b, {"test": test}, alphas)
    matched, _ = interpolate_path(net, a, b_matched, {"test": test}, alphas)
    bn, bm = naive.barriers["test"]["loss"], matched.barriers["test"]["loss"]
    print(
        f"test loss barrier: naive {bn:.4f}, weight-matched {bm:.4f}, reduction {1 - bm / bn:.1%}"
    )
    print(
        f"test acc barrier:  naive {naive.barriers['test']['acc']:.4f}, weight-matched {matched.barriers['test']['acc']:.4f}"
    )

    net.load_state_dict(a)
    plain_net = MLP()
    plain_net.load_state_dict(a)
    evaluate(plain_net, test)  # warm-up
    # Paired measurements, adjacent in time, so machine load affects both alike; median ratio.
    reps, ratios, plain, interp = 5, [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in alphas:
            evaluate(plain_net, test)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        interpolate_path(net, a, b_matched, {"test": test}, alphas)
        interp.append(time.perf_counter() - t)
        ratios.append(interp[-1] / plain[-1])
    t = time.perf_counter()
    _, repair_s = interpolate_path(
        net, a, b_matched, {"test": test}, alphas, repair_mode="repair", align_batches=align
    )
    total_repair = time.perf_counter() - t
    p, i = min(plain), min(interp)
    print(f"25 plain forward passes: {p:.3f} s; 25-point interpolation: {i:.3f} s (best of {reps})")
    print(f"paired ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"REPAIR on the same path: {repair_s:.3f} s of {total_repair:.3f} s total")
    print(f"barrier_loss_naive={bn:.6f} barrier_loss_matched={bm:.6f} reduction={1 - bm / bn:.4f}")
    print(f"interp_overhead={sorted(ratios)[len(ratios) // 2]:.3f}")


if __name__ == "__main__":
    main()
