"""The batched device auction against the host kernel (issue 48 item 1), on the same LAPs.

``B`` weight-matching-like cost matrices of size ``n`` (``-A B^T / d`` with ``B`` a noisy,
permuted copy of ``A``: nearly flat costs with a hidden permutation, as trained wide layers
give) are solved three ways, each timed over the whole batch: the host kernel
(:func:`lmc.permutation.lap.sap_solver`) one problem after the other, cold; the device auction
alone (:func:`lmc.permutation.lap_device.auction`: eps-optimal); and the auction finished
exactly by the host kernel's warm start (:func:`lmc.permutation.lap_device.auction_solve`).
Every exact result is checked against the host kernel's optimum.

Run ``python benchmarks/lap_device.py --device cuda`` on the GPU machine (``benchmarks/gpu.py``
runs it as its ``lap_device`` part). The last line is ``device=... n=... batch=...
lap_host_s=... lap_auction_s=... lap_auction_finish_s=... lap_device_speedup=...`` (host time
over auction + finish; above 1, the device path wins at that size).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmc.permutation.lap import sap_solver  # noqa: E402
from lmc.permutation.lap_device import auction, auction_solve  # noqa: E402


def costs(batch: int, n: int, d: int = 64, noise: float = 2.0, seed: int = 0) -> np.ndarray:
    """``batch`` nearly flat (n, n) costs ``-A B^T / d``, ``B`` a noisy permuted copy of ``A``."""
    rng = np.random.default_rng(seed)
    out = np.empty((batch, n, n))
    for k in range(batch):
        a = rng.standard_normal((n, d))
        b = a[rng.permutation(n)] + noise * rng.standard_normal((n, d))
        out[k] = -(a @ b.T) / d
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    c = costs(args.batch, args.n)
    sap_solver(np.ascontiguousarray(c[0, :8, :8]))  # warm-up: the compiled kernel loaded
    t0 = time.perf_counter()
    host = [sap_solver(k) for k in c]
    host_s = time.perf_counter() - t0
    optimum = [float(k[np.arange(args.n), s.perm].sum()) for k, s in zip(c, host)]
    on_device = torch.tensor(c, device=device)
    auction(on_device[:, :8, :8])  # warm-up: kernels loaded, allocator primed
    _sync(device)
    t0 = time.perf_counter()
    result = auction(on_device)
    _sync(device)
    auction_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    finished = auction_solve(on_device)
    finish_s = time.perf_counter() - t0
    for k, s, best in zip(c, finished, optimum):
        assert abs(float(k[np.arange(args.n), s.perm].sum()) - best) <= 1e-9 * max(1.0, abs(best))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"auction: {result.steps} steps, {result.bids} bids, last eps {result.eps:.3g}")
    values = {
        "device": name.replace(" ", "_"),
        "n": str(args.n),
        "batch": str(args.batch),
        "lap_host_s": f"{host_s:.4f}",
        "lap_auction_s": f"{auction_s:.4f}",
        "lap_auction_finish_s": f"{finish_s:.4f}",
        "lap_device_speedup": f"{host_s / finish_s:.3f}",
    }
    print(" ".join(f"{k}={v}" for k, v in values.items()))
    return values


if __name__ == "__main__":
    main()
