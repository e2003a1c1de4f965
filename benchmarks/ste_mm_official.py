"""STE-MM epoch against the official implementation, side by side (issue 48 item 2, 004 §4.1).

The official code (Ito et al., https://github.com/e5-a/STE-MM, ``srcs/search/mult/ste.py``) is
not part of lmc and is not copied into it: point ``--official`` at its ``srcs`` folder in a
checkout, with its LAP module built and its imports installed::

    cd <checkout>/lap_uv && c++ -O2 -ftree-vectorize -march=haswell -mabm -fopenmp -std=c++17 \\
        -shared -fPIC $(python -m pybind11 --includes) -I include src/main.cpp \\
        -o ../srcs/lap_uv$(python3-config --extension-suffix)
    pip install torchopt torchviz pybind11   # the official code's imports

(the flags are those of its ``CMakePresets.json``). Both sides get:

* the same three endpoints: MNIST MLPs 784-512-512-512-10 trained with configs/mnist/mlp.yaml
  for 5 epochs, seeds 0-2 (benchmarks/_endpoints.py), loaded into the official ``mlp.Net``
  by position (the same layers, other names);
* the same 235 training batches of 256 (one shuffled pass, cached before any timing);
* the same protocol: reference = model 0, proxies start at it, Adam lr 1e-3, lambda i.i.d.
  U(0, 1) normalised (``mixing: uniform``, as the official ``mid: False`` draws it),
  accelerated weight matching with dual warm start every step (its ``fast_wm: True``).

One *round* is one epoch of each, the order alternating from round to round so that both see
the same machine load; ``stemm_vs_official`` is lmc's median epoch over the official median
(target <= 0.5). Each side's own epoch is timed from its first to its last step (the official
function's own set-up, a permutation spec traced with torch.fx, is outside its timing).
The last line is ``stemm_official_epoch_s=... stemm_lmc_epoch_s=... stemm_vs_official=...
device=cpu``.

Run: ``LMC_DATA_DIR=<datasets copy> python benchmarks/ste_mm_official.py --official
<checkout>/srcs``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._endpoints import mnist_mlp_checkpoints, require_data  # noqa: E402
from lmc.data import MNISTDataModule  # noqa: E402
from lmc.io import load_checkpoint, model_state_dict  # noqa: E402
from lmc.merging import STEMM  # noqa: E402
from lmc.models import MLP  # noqa: E402
from lmc.permutation import spec_for  # noqa: E402


def official_modules(srcs: Path):
    """The official ``ste`` function and ``mlp.Net``, imported from ``srcs``."""
    if not (srcs / "search" / "mult" / "ste.py").is_file():
        raise SystemExit(
            f"--official {srcs}: no search/mult/ste.py there; pass the srcs folder of a "
            "checkout of https://github.com/e5-a/STE-MM"
        )
    if not list(srcs.glob("lap_uv*.so")):
        raise SystemExit(
            f"--official {srcs}: its LAP module lap_uv is not built; build it as this "
            "script's docstring says"
        )
    sys.path.insert(0, str(srcs))
    from networks import mlp  # type: ignore[import-not-found]
    from search.mult import ste  # type: ignore[import-not-found]

    return ste.ste, mlp.Net


def official_epoch(ste_fn, net_cls, states, batches) -> tuple[float, float]:
    """One epoch of the official STE-MM: (seconds from its first step to its last, mean batch
    loss, read off what it prints)."""
    nets = []
    for state in states:
        net = net_cls(w=1)
        net.load_state_dict(dict(zip(net.state_dict(), state.values())))
        nets.append(net)
    np.random.seed(0)
    timed, printed = _Timed(batches), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        ste_fn(nets[0], nets[1:], timed, None, 1e-3, 1, False, "cpu", [1, 28, 28], True)
    # it prints the sum of the batch means over the number of examples
    per_example = float(re.search(r"loss/train: (\S+)", printed.getvalue()).group(1))
    return timed.seconds, per_example * sum(len(y) for _, y in batches) / len(batches)


class _Timed:
    """The batches, as a loader that times the pass over them (first batch to end)."""

    def __init__(self, batches):
        self.batches, self.seconds = batches, 0.0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        start = time.perf_counter()
        yield from self.batches
        self.seconds = time.perf_counter() - start


def lmc_epoch(states, batches) -> tuple[float, float, dict[str, float]]:
    """One epoch of lmc's STE-MM under the official protocol: (seconds, mean batch loss, the
    matching's seconds: ``match``, of which ``cost`` building cost matrices and ``solve`` in
    the LAP solver)."""
    net = MLP(784, 10, width=512, depth=3)
    search = STEMM(net, states, spec_for(net), method="accelerated", mixing="uniform", seed=0)
    opt = torch.optim.Adam(search.proxy_parameters(), lr=1e-3)
    losses = []
    start = time.perf_counter()
    for x, y in batches:
        loss = search.step_loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    seconds = time.perf_counter() - start
    st = search.wm_stats
    split = {"match": search.wm_seconds, "cost": st["cost_seconds"], "solve": st["solve_seconds"]}
    return seconds, float(np.mean(losses)), split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", type=Path, required=True, help="<checkout>/srcs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    require_data("MNIST", "benchmarks/ste_mm_official.py")
    ste_fn, net_cls = official_modules(args.official.resolve())
    torch.set_num_threads(args.threads)

    ckpts = mnist_mlp_checkpoints([0, 1, 2], epochs=5)
    states = [model_state_dict(load_checkpoint(p)) for p in ckpts]
    dm = MNISTDataModule(batch_size=256, val_size=5000)
    dm.setup("fit")
    torch.manual_seed(0)
    batches = [(x, y) for x, y in dm.train_dataloader()]
    from lmc.permutation.lap_sap import compile_kernels

    compile_kernels()
    print(f"3 MNIST MLPs, {len(batches)} batches of 256, {args.threads} threads, cpu")
    official, ours, splits = [], [], []
    for r in range(args.rounds):
        for side in ("official", "lmc") if r % 2 == 0 else ("lmc", "official"):
            if side == "official":
                seconds, official_loss = official_epoch(ste_fn, net_cls, states, batches)
                official.append(seconds)
            else:
                seconds, loss, split = lmc_epoch(states, batches)
                ours.append(seconds)
                splits.append(split)
        print(
            f"round {r + 1}: official {official[-1]:.2f} s (mean batch loss {official_loss:.4f}), "
            f"lmc {ours[-1]:.2f} s (mean batch loss {loss:.4f}; matching {split['match']:.2f} s: "
            f"cost matrices {split['cost']:.2f} s, LAP solves {split['solve']:.2f} s)",
            flush=True,
        )
    o, m = statistics.median(official), statistics.median(ours)
    half = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
    print(
        f"stemm_official_epoch_s={o:.2f} stemm_lmc_epoch_s={m:.2f} stemm_vs_official={m / o:.3f} "
        f"stemm_lmc_match_s={half['match']:.2f} stemm_lmc_cost_s={half['cost']:.2f} "
        f"stemm_lmc_solve_s={half['solve']:.2f} device=cpu"
    )


if __name__ == "__main__":
    main()
