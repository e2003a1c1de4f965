"""Weight-matching speed: plain (004 Alg. 2) vs accelerated (Alg. 3, dual warm start) vs a
straightforward scipy reference implementation of the same coordinate descent.

Two regimes, as 004 Fig. 2 measures them:

(a) repeated matching, as STE / STE-MM call it every step: the reference (target) model moves a
    little between calls (``--drift`` times each tensor's std, Gaussian) and the previous
    permutation (plain, reference) or permutation and duals (accelerated) are carried over;
    mean time per call, after one cold accelerated call that provides the starting state.
    Architectures: ResNet-20 x16 and VGG-11 x4 (random init, as the issue allows; training them
    on 2 CPU cores is out of reach; the reference is skipped on VGG to stay within 10 minutes)
    and the MNIST MLP. Accelerated calls keep the prepared source between calls (the source is
    fixed, as in STE-MM). Also printed: the time of one cost matrix per group, the products
    alone, which any exact method must redo once per call after the target moved; on a CPU they
    dominate and bound the attainable speed-up (004 measures on a GPU, where LAP solves
    dominate); and, on ResNet, plain restarted from the identity every call as 004 Alg. 2
    line 1 and Fig. 2 do (for information only; the key line uses plain warm-started from
    the previous permutation, the stricter baseline).
(b) a single cold call (identity start) on the MNIST MLP pair (784-512-512-512-10, each trained
    one epoch on MNIST from ``$LMC_DATA_DIR/MNIST/raw``, cached under ``benchmarks/.cache`` by a
    key of the training recipe and the code that trains them); median of ``--repeats`` calls.
    Without the MNIST files the script stops and says which it expects; ``--untrained`` runs the
    MLP regimes on two randomly initialised MLPs instead (a timing only), and then every MLP
    figure is labelled ``untrained`` and its keys end in ``_untrained``.

(c) trained endpoints: ResNet-20 x16 and VGG-11 x4 trained ``--train-epochs`` epochs (SGD) on a
    fake CIFAR set (``--train-images`` Gaussian images whose label is a fixed random linear
    function of the image, ``--image-size`` pixels), then regime (a) on them (keys ``_trained``).
(d) the LAP alone: a weight-matching-like cost ``-(A B^T)`` (n = 2048, Gaussian A, B) solved
    cold, then ``A`` moves by ``--lap-drift`` x std and the warm repair (previous assignment
    and duals, :func:`lmc.permutation.lap.sap_solver`) is timed against a cold solve and
    against scipy (``lap_warm_vs_cold_2048``; best of 5).

The numba LAP kernel is compiled (or loaded from its on-disk cache) before any timing; the
first-call time is printed. Run ``LMC_DATA_DIR=<copy of the datasets> python benchmarks/weight_matching.py`` (CPU;
``--device cuda`` keeps the weights and products on a GPU, the setting of 004 Fig. 2). The last
line holds the key=value results.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import hashlib
import importlib
import inspect
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._endpoints import cache_key, code_version, require_data  # noqa: E402
from lmc.models import MLP, VGG, ResNet  # noqa: E402
from lmc.permutation import PermutationSpec, spec_for, weight_matching  # noqa: E402
from lmc.permutation._costs import Problem, SourceCache  # noqa: E402
from lmc.permutation.lap import sap_solver  # noqa: E402
from lmc.permutation.lap_sap import compile_kernels  # noqa: E402
from lmc.permutation.spec import Permutation  # noqa: E402

WM_MODULE = importlib.import_module("lmc.permutation.weight_matching")  # the function's module

CACHE = ROOT / "benchmarks" / ".cache"


# -- the straightforward reference --------------------------------------------------------------
def reference_weight_matching(
    spec: PermutationSpec,
    a: Mapping[str, Tensor],
    b: Mapping[str, Tensor],
    init: Mapping[str, Tensor] | None = None,
    max_sweeps: int = 100,
    seed: int = 0,
) -> dict:
    """Permutation coordinate descent written the obvious way (Ainsworth et al. 2023): every
    sweep rebuilds every group's cost matrix from freshly permuted copies and solves it with
    scipy; stop after a sweep in which no group improved."""
    t0 = time.perf_counter()
    sizes = spec.sizes(a)
    device = next(iter(a.values())).device
    perm = {
        g: (init[g].clone().to(device) if init is not None else torch.arange(n, device=device))
        for g, n in sizes.items()
    }
    groups = list(spec.groups)
    rng = np.random.default_rng(seed)
    solve, sweeps = 0.0, 0
    for _ in range(max_sweeps):
        sweeps += 1
        progress = False
        for i in rng.permutation(len(groups)):
            g = groups[i]
            n = sizes[g]
            cost = torch.zeros(n, n, device=device)
            for key, axis in spec.groups[g]:
                wa, wb = a[key], b[key]
                for ax, h in enumerate(spec.axes[key]):
                    if ax != axis and h is not None:
                        wb = torch.index_select(wb, ax, perm[h])
                wa = torch.movedim(wa, axis, 0).reshape(n, -1)
                wb = torch.movedim(wb, axis, 0).reshape(n, -1)
                cost += wa @ wb.T
            cost = cost.cpu().numpy()
            ts = time.perf_counter()
            _, ci = linear_sum_assignment(cost, maximize=True)
            solve += time.perf_counter() - ts
            old = cost[np.arange(n), perm[g].cpu().numpy()].sum()
            new = cost[np.arange(n), ci].sum()
            progress = progress or new > old + 1e-12
            perm[g] = torch.as_tensor(ci, device=device)
        if not progress:
            break
    return {"perm": perm, "seconds": time.perf_counter() - t0, "solve": solve, "sweeps": sweeps}


# -- models -----------------------------------------------------------------------------------
def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mnist_tensors(split: str) -> tuple[Tensor, Tensor] | None:
    """Normalised MNIST ``split`` (flattened images, labels) from ``$LMC_DATA_DIR/MNIST/raw``
    (decompressed idx files, else the .gz originals); ``None`` if missing."""
    if "LMC_DATA_DIR" not in os.environ:
        return None
    raw = Path(os.environ["LMC_DATA_DIR"]).expanduser() / "MNIST" / "raw"
    prefix = "train" if split == "train" else "t10k"
    found = []
    for kind in ("images-idx3", "labels-idx1"):
        paths = [raw / f"{prefix}-{kind}-ubyte{ext}" for ext in ("", ".gz")]
        path = next((p for p in paths if p.exists()), None)
        if path is None:
            return None
        found.append(_read_idx(path))
    x = torch.from_numpy(found[0].astype(np.float32) / 255.0)
    x = ((x - 0.1307) / 0.3081).reshape(len(x), -1)
    return x, torch.from_numpy(found[1].astype(np.int64))


def mlp_cache_path(seed: int) -> Path:
    """Cache file of the seed-``seed`` MLP: keyed by its training recipe and by the code that
    trains it (this file's reader and training loop, and the ``lmc`` sources), so a change of
    either retrains instead of reusing a stale model."""
    recipe = {
        "net": "MLP(784, 10, width=512, depth=3)",
        "seed": seed,
        "data": "MNIST train, 60000 images, (x / 255 - 0.1307) / 0.3081",
        "epochs": 1,
        "optimizer": "Adam(lr=1e-3)",
        "batch_size": 128,
    }
    trainer = "".join(inspect.getsource(f) for f in (_read_idx, mnist_tensors, mnist_mlp_pair))
    code = code_version() + hashlib.sha256(trainer.encode()).hexdigest()
    return CACHE / f"mnist_mlp512x3_s{seed}_{cache_key(recipe, code)[:16]}.pt"


def mnist_mlp_pair(untrained: bool = False) -> tuple[nn.Module, nn.Module, str]:
    """Two 784-512-512-512-10 MLPs trained one epoch on MNIST (seeds 0, 1), cached.

    Stops (exit status 1, naming ``LMC_DATA_DIR`` and the files expected) when a model must be
    trained and MNIST is missing. ``untrained``: two randomly initialised MLPs, no data read.
    """
    if untrained:
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(MLP(784, 10, width=512, depth=3))
        return models[0], models[1], "UNTRAINED: random init (--untrained), timings only"
    models, note = [], "trained 1 epoch on MNIST (Adam 1e-3, batch 128)"
    train = None
    for seed in (0, 1):
        path = mlp_cache_path(seed)
        torch.manual_seed(seed)
        model = MLP(784, 10, width=512, depth=3)
        if path.exists():
            model.load_state_dict(torch.load(path, weights_only=True))
            models.append(model)
            continue
        if train is None:
            require_data("MNIST", "benchmarks/weight_matching.py (or pass --untrained)")
            train = mnist_tensors("train")
            assert train is not None
        x, y = train
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        for idx in order.split(128):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
        models.append(model)
    test = mnist_tensors("test")
    if test is None:
        note += f" (cached: {path.parent}); test accuracy not measured, MNIST test files missing"
    else:
        with torch.no_grad():
            accs = [float((m(test[0]).argmax(1) == test[1]).float().mean()) for m in models]
        note += f", test acc {accs[0]:.3f} / {accs[1]:.3f}"
    return models[0], models[1], note


DEVICE = torch.device("cpu")
#: cProfile the last accelerated call of each repeated regime (``--profile-call``)
PROFILE_CALL = False


@contextmanager
def _profiled(on: bool, title: str) -> Iterator[None]:
    """With ``on``, the block under cProfile, then ``title`` and its 22 costliest functions."""
    if not on:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        print(title)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(22)


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to(DEVICE) for k, v in model.state_dict().items()}


def _drift(state: Mapping[str, Tensor], eps: float, gen: torch.Generator) -> dict[str, Tensor]:
    out = {}
    for k, v in state.items():
        if v.is_floating_point() and v.numel() > 1:
            v = v + eps * float(v.std()) * torch.randn(v.shape, generator=gen).to(v.device)
        out[k] = v
    return out


def _device_name() -> str:
    return torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu"


# -- regimes ----------------------------------------------------------------------------------
def full_build_seconds(
    spec: PermutationSpec, a: Mapping[str, Tensor], b: Mapping[str, Tensor], perm: Permutation
) -> float:
    """Time of one cost matrix per group, the member products alone (source already unfolded
    and permuted): the least work per call of any exact method once the target has moved."""
    keys = [k for k, t in a.items() if t.dtype.is_floating_point]
    device = a[keys[0]].device
    perm = {g: p.to(device) for g, p in perm.items()}
    problem = Problem(a, b, spec, keys, SourceCache())
    members = [m for group in problem.dynamic.values() for m in group]
    for m in members:
        m.gathered(perm)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for m in members:
        m.product(perm, cached=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _fmt(name: str, seconds: float, sweeps: float, solve: float) -> str:
    share = solve / seconds if seconds else 0.0
    return f"{name} {seconds:8.3f}s  sweeps {sweeps:4.1f}  solve share {share:5.1%}"


def regime_repeat(
    label: str,
    a: nn.Module,
    b: nn.Module,
    calls: int,
    drift: float,
    with_reference: bool,
    identity_plain: bool = False,
) -> tuple[float, float]:
    """Regime (a); returns (plain per-call time / accelerated per-call time, seconds of the
    cold accelerated call that starts it).

    With ``identity_plain`` also times plain restarted from the identity every call, as 004
    Alg. 2 line 1 (and Fig. 2) do, and prints that ratio for information.
    """
    spec = spec_for(a)
    target, source = _state(a), _state(b)
    n_params = sum(t.numel() for t in source.values())
    with _profiled(PROFILE_CALL and calls == 0, f"[{label}] profile of the cold call:"):
        cold = weight_matching(target, source, spec, method="accelerated")
    print(
        f"[{label}] {n_params / 1e6:.1f}M params, {len(spec.groups)} groups; cold accelerated "
        f"call to start: {cold.seconds:.2f}s, {cold.sweeps} sweeps, {cold.solves} solves "
        f"(LAP {cold.solve_seconds:.2f}s, cost matrices {cold.cost_seconds:.2f}s, rest "
        f"{cold.seconds - cold.solve_seconds - cold.cost_seconds:.2f}s)"
    )
    if calls == 0:  # the cold call alone (benchmarks/gpu.py: plain repeats cost minutes there)
        return float("nan"), cold.seconds
    gen = torch.Generator().manual_seed(0)
    perm_plain, perm_ref, state = cold.perm, cold.perm, cold.state
    rows: dict[str, list[tuple[float, int, float, float]]] = {
        "plain": [],
        "accelerated": [],
        "reference": [],
        "plain from identity": [],
    }
    for t in range(calls):
        target = _drift(target, drift, gen)
        r = weight_matching(target, source, spec, method="plain", init=perm_plain, seed=t)
        perm_plain = r.perm
        rows["plain"].append((r.seconds, r.sweeps, r.solve_seconds, r.cost_seconds))
        last = PROFILE_CALL and t == calls - 1
        with _profiled(last, f"[{label}] profile of the last accelerated call:"):
            r = weight_matching(target, source, spec, method="accelerated", init=state, seed=t)
        state = r.state
        rows["accelerated"].append((r.seconds, r.sweeps, r.solve_seconds, r.cost_seconds))
        if identity_plain:
            r = weight_matching(target, source, spec, method="plain", seed=t)
            rows["plain from identity"].append(
                (r.seconds, r.sweeps, r.solve_seconds, r.cost_seconds)
            )
        if with_reference:
            ref = reference_weight_matching(spec, target, source, init=perm_ref, seed=t)
            perm_ref = ref["perm"]
            rows["reference"].append((ref["seconds"], ref["sweeps"], ref["solve"], float("nan")))
    means = {}
    for name, vals in rows.items():
        if not vals:
            continue
        sec, sw, so, co = (statistics.fmean(v[i] for v in vals) for i in range(4))
        means[name] = (sec, so)
        cost = f"  cost-matrix share {co / sec:5.1%}" if co == co else ""
        print(f"[{label}] (a) per call, {name:19s}: " + _fmt("", sec, sw, so) + cost)
    speedup = means["plain"][0] / means["accelerated"][0]
    floor = full_build_seconds(spec, target, source, perm_plain)
    print(
        f"[{label}] (a) one cost matrix per group (the products alone, which every exact method "
        f"redoes once per call after the target moved): {floor:.3f}s, so plain / accelerated "
        f"cannot exceed {means['plain'][0] / floor:.2f}x on this machine"
    )
    if "reference" in means:
        print(
            f"[{label}] (a) accelerated vs the scipy reference warm-started the same way: "
            f"{means['reference'][0] / means['accelerated'][0]:.2f}x per call"
        )
    if "plain from identity" in means:
        print(
            f"[{label}] (a) 004 Fig. 2 protocol, plain restarted from the identity every call "
            f"(Alg. 2 line 1): {means['plain from identity'][0] / means['accelerated'][0]:.2f}x "
            "per call (for information; the key uses plain warm-started from the last permutation)"
        )
    solve_speedup = means["plain"][1] / max(means["accelerated"][1], 1e-12)
    print(
        f"[{label}] (a) speed-up accelerated vs plain: {speedup:.2f}x per call "
        f"(LAP solves alone: {solve_speedup:.2f}x), {calls} calls, drift {drift:g} x std"
    )
    return speedup, cold.seconds


def compare_lap_cells(label: str, a: nn.Module, b: nn.Module, cells: int) -> None:
    """The cold accelerated call again, then with at most ``cells`` cost entries in LAPs
    solved at once, side by side (the same permutations: batching follows the one-by-one
    trajectory)."""
    spec = spec_for(a)
    target, source = _state(a), _state(b)
    default = WM_MODULE.CONCURRENT_LAP_CELLS
    runs = {}
    # the default again rather than the first cold call: that one also paid the new sizes'
    # first allocations (page-locked buffers, cuBLAS heuristics on a GPU)
    for cap in (default, cells):
        WM_MODULE.CONCURRENT_LAP_CELLS = cap
        try:
            runs[cap] = weight_matching(target, source, spec, method="accelerated")
        finally:
            WM_MODULE.CONCURRENT_LAP_CELLS = default
    same = all(torch.equal(runs[default].perm[g], runs[cells].perm[g]) for g in runs[cells].perm)
    print(
        f"[{label} trained] info: cold call with LAPs of at most {default} entries at once "
        f"(the default) {runs[default].seconds:.2f}s (LAP {runs[default].solve_seconds:.2f}s), "
        f"at most {cells}: {runs[cells].seconds:.2f}s (LAP {runs[cells].solve_seconds:.2f}s); "
        f"same permutations: {same}"
    )


def regime_cold(label: str, a: nn.Module, b: nn.Module, repeats: int) -> tuple[float, float]:
    """Regime (b); returns (plain / reference, accelerated / reference) time ratios."""
    spec = spec_for(a)
    target, source = _state(a), _state(b)

    def ref() -> tuple[float, int, float]:
        r = reference_weight_matching(spec, target, source)
        return r["seconds"], r["sweeps"], r["solve"]

    def run(method: str) -> Callable[[], tuple[float, int, float]]:
        def fn() -> tuple[float, int, float]:
            r = weight_matching(target, source, spec, method=method)  # type: ignore[arg-type]
            return r.seconds, r.sweeps, r.solve_seconds

        return fn

    weight_matching(target, source, spec)  # warm-up (allocator, BLAS threads)
    fns = {"reference": ref, "plain": run("plain"), "accelerated": run("accelerated")}
    runs: dict[str, list[tuple[float, int, float]]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved, so that a change of machine load hits all three
        for name, fn in fns.items():
            runs[name].append(fn())
    res = {name: sorted(r)[len(r) // 2] for name, r in runs.items()}  # median by time
    for name, (sec, sw, so) in res.items():
        print(f"[{label}] (b) cold call, {name:11s}: " + _fmt("", sec, sw, so))
    base = res["reference"][0]
    return res["plain"][0] / base, res["accelerated"][0] / base


def fake_cifar(images: int, size: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Gaussian ``3 x size x size`` images labelled by a fixed random linear map (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(images, 3, size, size, generator=g)
    w = torch.randn(3 * size * size, 10, generator=g)
    return x, (x.flatten(1) @ w).argmax(1)


def trained(model: nn.Module, data: tuple[Tensor, Tensor], epochs: int, seed: int) -> nn.Module:
    """``epochs`` epochs of SGD (lr 0.05, momentum 0.9, batch 32) on ``data``, on DEVICE."""
    model = model.to(DEVICE).train()
    x, y = data
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(32):
            loss = nn.functional.cross_entropy(model(x[idx].to(DEVICE)), y[idx].to(DEVICE))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval()


def regime_lap(n: int, drift: float, seed: int = 0) -> float:
    """Regime (d); returns cold / warm time of the LAP after a small move of the costs."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n)).astype(np.float32)
    b = rng.normal(size=(n, n)).astype(np.float32)
    cost = -(a @ b.T).astype(np.float64)
    first = sap_solver(cost)
    moved = -((a + drift * rng.normal(size=a.shape).astype(np.float32)) @ b.T).astype(np.float64)

    def best(fn: Callable[[], object], k: int) -> float:
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    warm_sol = sap_solver(moved, warm=first)
    warm = best(lambda: sap_solver(moved, warm=first), 5)
    cold = best(lambda: sap_solver(moved), 3)
    ref = best(lambda: linear_sum_assignment(moved), 3)
    print(
        f"[lap n={n}] cold {cold * 1e3:.1f} ms (scipy {ref * 1e3:.1f} ms, ratio "
        f"{cold / ref:.2f}); warm repair after a {drift:g} x std move of A {warm * 1e3:.1f} ms "
        f"({warm_sol.freed} of {n} rows freed): {cold / warm:.2f}x faster than cold"
    )
    return cold / warm


def main(argv: list[str] | None = None) -> None:
    """Run both regimes and print the key=value summary line last."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=2, help="repeated calls on ResNet-20 in (a)")
    p.add_argument("--vgg-calls", type=int, default=1, help="repeated calls on VGG-11 in (a)")
    p.add_argument("--drift", type=float, default=0.01, help="reference move per call, x std")
    p.add_argument("--repeats", type=int, default=5, help="cold calls on the MLP in (b)")
    p.add_argument("--quick", action="store_true", help="small widths, for a smoke test")
    p.add_argument("--device", default="cpu", help="where the weights and products live")
    p.add_argument("--train-epochs", type=int, default=2, help="(c) epochs on fake CIFAR")
    p.add_argument("--train-images", type=int, default=64, help="(c) fake CIFAR size")
    p.add_argument("--image-size", type=int, default=32, help="(c) fake CIFAR resolution")
    p.add_argument("--lap-n", type=int, default=2048, help="(d) LAP size")
    p.add_argument("--lap-drift", type=float, default=1e-3, help="(d) move of A, x std")
    p.add_argument(
        "--profile-call",
        action="store_true",
        help="print a cProfile of the last accelerated call of each repeated regime",
    )
    p.add_argument(
        "--compare-lap-cells",
        type=int,
        default=0,
        help="then the trained VGG's cold call again with at most this many cost entries in "
        "LAPs solved at once (lmc.permutation.weight_matching.CONCURRENT_LAP_CELLS; info)",
    )
    p.add_argument(
        "--only-trained",
        action="store_true",
        help="regime (c) alone: trained ResNet and VGG, repeated calls and the cold call",
    )
    p.add_argument(
        "--untrained",
        action="store_true",
        help="time the MLP regimes on randomly initialised MLPs (no MNIST needed); every MLP "
        "figure is then labelled untrained",
    )
    args = p.parse_args(argv)
    global DEVICE, PROFILE_CALL
    DEVICE = torch.device(args.device)
    PROFILE_CALL = args.profile_call
    t0 = time.perf_counter()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {DEVICE}")
    t1 = time.perf_counter()
    compile_kernels()  # both dtypes and the auction: no compilation inside a timing
    print(
        f"LAP kernel ready (numba compile or on-disk cache load): {time.perf_counter() - t1:.2f}s"
    )
    rw, vw = (2, 0.5) if args.quick else (16, 4)
    lap_ratio = plain_vs_ref = accel_vs_ref = resnet = vgg = float("nan")
    if not args.only_trained:
        lap_ratio = regime_lap(256 if args.quick else args.lap_n, args.lap_drift)

        mlp_a, mlp_b, note = mnist_mlp_pair(untrained=args.untrained)
        mlp = "mnist-mlp untrained" if args.untrained else "mnist-mlp"
        print(f"[{mlp}] {note}")
        # 512x512 products gain nothing from a second thread, and one thread keeps the timing of
        # these millisecond-scale steps stable when other processes share the cores
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        plain_vs_ref, accel_vs_ref = regime_cold(mlp, mlp_a, mlp_b, args.repeats)
        regime_repeat(mlp, mlp_a, mlp_b, 5, args.drift, with_reference=True)
        torch.set_num_threads(threads)

        print(
            f"[resnet20x{rw}] [vgg11x{vw:g}] random init by design (timings only; see the docstring)"
        )
        torch.manual_seed(1)
        res_a, res_b = ResNet(20, width=rw), ResNet(20, width=rw)
        resnet, _ = regime_repeat(
            f"resnet20x{rw}",
            res_a,
            res_b,
            args.calls,
            args.drift,
            with_reference=True,
            identity_plain=True,
        )
        del res_a, res_b
        torch.manual_seed(2)
        vgg_a, vgg_b = VGG(11, width=vw), VGG(11, width=vw)
        vgg, _ = regime_repeat(
            f"vgg11x{vw:g}", vgg_a, vgg_b, args.vgg_calls, args.drift, with_reference=False
        )
        del vgg_a, vgg_b
    data = fake_cifar(args.train_images, args.image_size)
    print(
        f"[trained] {args.train_epochs} epochs of SGD on fake CIFAR ({args.train_images} images, "
        f"{args.image_size}px), seeds 0/1 per architecture"
    )
    speedups, colds = {}, {}
    for name, factory, calls in (
        (f"resnet20x{rw}", lambda: ResNet(20, width=rw), args.calls),
        (f"vgg11x{vw:g}", lambda: VGG(11, width=vw), args.vgg_calls),
    ):
        t1 = time.perf_counter()
        pair = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            pair.append(trained(factory(), data, args.train_epochs, seed))
        print(f"[{name} trained] training took {time.perf_counter() - t1:.0f}s")
        speedups[name], colds[name] = regime_repeat(
            f"{name} trained", pair[0], pair[1], calls, args.drift, with_reference=False
        )
        if args.compare_lap_cells and name.startswith("vgg"):
            compare_lap_cells(name, pair[0], pair[1], args.compare_lap_cells)
        del pair
    print(f"total {time.perf_counter() - t0:.0f}s on {_device_name()}")
    mark = "_untrained" if args.untrained else ""
    print(
        f"info: wm_repeat_speedup_vgg11x{vw:g}={vgg:.3f} "
        f"wm_mlp_plain_vs_reference{mark}={plain_vs_ref:.3f}"
    )
    print(
        f"wm_repeat_speedup_resnet20x{rw}={resnet:.3f} "
        f"wm_repeat_speedup_resnet20x{rw}_trained={speedups[f'resnet20x{rw}']:.3f} "
        f"wm_repeat_speedup_vgg11x{vw:g}_trained={speedups[f'vgg11x{vw:g}']:.3f} "
        f"wm_vgg11x{vw:g}_trained_cold_s={colds[f'vgg11x{vw:g}']:.3f} "
        f"wm_mlp_accel_vs_reference{mark}={accel_vs_ref:.3f} "
        f"lap_warm_vs_cold_{256 if args.quick else args.lap_n}={lap_ratio:.3f}"
    )


if __name__ == "__main__":
    main()
