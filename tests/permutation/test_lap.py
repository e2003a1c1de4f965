"""The warm-started shortest-augmenting-path LAP (issue 18): exact against scipy on random,
tied, all-equal, rectangular and huge-range costs, cold and warm-started from exact, stale and
garbage duals; repairs only the freed rows; clear errors on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from lmc.permutation.lap import (
    LapInputError,
    LapSolution,
    TimedSolver,
    available_solvers,
    get_solver,
    sap_solver,
    solve_max,
)

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _optimum(cost: np.ndarray) -> float:
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].sum())


def _check(cost: np.ndarray, sol: LapSolution) -> None:
    """Optimal objective (scipy's, up to rounding), a valid assignment and optimal duals."""
    nr, nc = cost.shape
    rows = np.flatnonzero(sol.perm >= 0)
    assert len(rows) == min(nr, nc)
    cols = sol.perm[rows]
    assert len(np.unique(cols)) == len(cols) and cols.max(initial=-1) < nc
    scale = 1e-9 * (1.0 + np.abs(cost).sum())
    assert float(cost[rows, cols].sum()) == pytest.approx(_optimum(cost), abs=scale)
    if nr == nc:
        red = cost - sol.u[:, None] - sol.v[None, :]
        tol = 1e-9 * (1.0 + np.abs(cost).max() + np.abs(sol.u).max() + np.abs(sol.v).max())
        assert red.min() >= -tol
        assert np.abs(red[rows, cols]).max() <= tol


def _matrix(kind: str, n: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=(n, m))
    if kind == "ties":
        return rng.integers(0, 3, size=(n, m)).astype(np.float64)
    if kind == "equal":
        return np.full((n, m), 7.0)
    if kind == "huge":  # entries spanning 1e-6 .. 1e12 with both signs
        return rng.choice([-1.0, 1.0], (n, m)) * 10.0 ** rng.uniform(-6, 12, (n, m))
    raise ValueError(kind)


KINDS = ["normal", "ties", "equal", "huge"]


@PROPS
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 24),
    extra=st.integers(0, 6),
    transpose=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_cold_is_exact(kind, n, extra, transpose, seed):
    cost = _matrix(kind, n, n + extra, seed)
    cost = cost.T.copy() if transpose else cost
    _check(cost, sap_solver(cost))


@PROPS
@given(
    kind=st.sampled_from(KINDS),
    start=st.sampled_from(["exact", "stale", "garbage"]),
    n=st.integers(1, 24),
    seed=st.integers(0, 2**31),
)
def test_warm_is_exact(kind, start, n, seed):
    rng = np.random.default_rng(seed + 1)
    cost = _matrix(kind, n, n, seed)
    if start == "exact":
        warm = sap_solver(cost)
    elif start == "stale":  # the solution of a neighbouring matrix
        scale = np.abs(cost).mean() + 1.0
        warm = sap_solver(cost + 0.1 * scale * rng.normal(size=cost.shape))
    else:
        warm = LapSolution(rng.permutation(n), rng.normal(size=n) * 1e3, rng.normal(size=n) * 1e3)
    _check(cost, sap_solver(cost, warm=warm))


def test_rectangular_warm_start_is_exact():
    rng = np.random.default_rng(0)
    for shape in ((5, 9), (9, 5)):
        cost = rng.normal(size=shape)
        first = sap_solver(cost)
        _check(cost, first)
        moved = cost + 0.05 * rng.normal(size=shape)
        _check(moved, sap_solver(moved, warm=first))


def test_warm_repair_only_runs_paths_from_freed_rows():
    rng = np.random.default_rng(0)
    n = 200
    cost = rng.normal(size=(n, n))
    cold = sap_solver(cost)
    assert cold.freed is not None and cold.freed < n // 4  # the cold start assigns most rows
    same = sap_solver(cost, warm=cold)
    assert same.freed == 0 and np.array_equal(same.perm, cold.perm)
    # one row moves: at most that row and the rows whose pairs it broke need a path
    moved = cost.copy()
    moved[3] += rng.normal(size=n)
    warm = sap_solver(moved, warm=cold)
    _check(moved, warm)
    assert warm.freed <= 2
    noisy = moved + 1e-3 * rng.normal(size=(n, n))
    stale = sap_solver(noisy, warm=cold)
    _check(noisy, stale)
    assert stale.freed < n // 4


def test_warm_start_does_not_modify_its_inputs():
    rng = np.random.default_rng(1)
    cost = rng.normal(size=(30, 30))
    warm = sap_solver(cost)
    kept = (warm.perm.copy(), warm.u.copy(), warm.v.copy(), cost.copy())
    sap_solver(cost + rng.normal(size=cost.shape), warm=warm)
    for a, b in zip(kept, (warm.perm, warm.u, warm.v, cost)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_costs_are_rejected(bad):
    cost = np.zeros((4, 4))
    cost[2, 1] = bad
    with pytest.raises(LapInputError, match="row 2, column 1"):
        sap_solver(cost)
    with pytest.raises(LapInputError, match="NaN/inf"):
        TimedSolver("scipy")(cost)


def test_bad_warm_starts_are_rejected():
    cost = np.random.default_rng(0).normal(size=(5, 5))
    good = sap_solver(cost)
    cases = [
        (LapSolution(good.perm[:4], good.u, good.v), "perm .* length 5"),
        (LapSolution(good.perm.astype(float), good.u, good.v), "integer array"),
        (LapSolution(good.perm, good.u, good.v[:3]), "v must be a float array of length 5"),
        (LapSolution(good.perm, good.u, good.v.astype(np.int64)), "v must be a float array"),
        (LapSolution(good.perm, good.u[:2], good.v), "u must be a float array of length 5"),
        (LapSolution(good.perm, good.u, None), "without column duals"),
        (LapSolution(np.zeros(5, np.int64), good.u, good.v), "distinct columns"),
        (LapSolution(good.perm, good.u, np.full(5, np.nan)), "NaN/inf"),
    ]
    for warm, msg in cases:
        with pytest.raises(LapInputError, match=msg):
            sap_solver(cost, warm=warm)
    with pytest.raises(LapInputError, match="square"):
        TimedSolver("sap")(np.zeros((3, 4)))


def test_timed_solver_warm_starts_a_solver_without_warm_keyword():
    """A dual-returning solver without ``warm`` is given reduced costs; duals shifted back."""
    rng = np.random.default_rng(2)
    cost = rng.normal(size=(20, 20))
    warm = sap_solver(cost)

    def cold_only(c: np.ndarray) -> LapSolution:
        return sap_solver(c)

    lap = TimedSolver(cold_only)
    assert not lap.warm_start and TimedSolver("sap").warm_start
    _check(cost, lap(cost, warm))
    assert lap.calls == 1


def test_registry_names_and_legacy_aliases():
    assert {"scipy", "sap", "lapjv", "lapjv64"} <= set(available_solvers())
    assert get_solver("lapjv") == get_solver("sap") == get_solver("lapjv64")
    with pytest.raises(ValueError, match="unknown LAP solver 'nope'.*sap"):
        get_solver("nope")
    sim = np.random.default_rng(3).normal(size=(12, 12))
    best = sim[np.arange(12), solve_max(sim, "scipy")].sum()
    assert sim[np.arange(12), solve_max(sim, "sap")].sum() == pytest.approx(best)


def test_empty_and_single():
    assert sap_solver(np.zeros((0, 0))).perm.shape == (0,)
    sol = sap_solver(np.array([[3.0]]))
    assert sol.perm.tolist() == [0] and sol.u[0] + sol.v[0] == pytest.approx(3.0)


def test_kernel_cache_falls_back_when_the_package_dir_is_read_only(tmp_path, monkeypatch):
    """No writable __pycache__ beside the module and no writable home cache (a read-only
    install; permission bits cannot be tested as root): NUMBA_CACHE_DIR points at the temp dir."""
    import numba

    import lmc.permutation.lap_sap as mod

    readonly = (Path(mod.__file__).resolve().parent, tmp_path / "home")

    def writable(path: Path) -> bool:
        return not any(path.is_relative_to(r) for r in readonly)

    monkeypatch.setattr(mod, "_writable", writable)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(mod.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)
    assert mod._configure_cache()
    expected = str(tmp_path / "tmp" / "lmc-numba-cache")
    assert os.environ["NUMBA_CACHE_DIR"] == expected == numba.config.CACHE_DIR
    monkeypatch.setattr(mod, "_writable", lambda path: False)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        assert not mod._configure_cache()


def test_cache_dir_from_environment_is_used(tmp_path):
    """A fresh process with NUMBA_CACHE_DIR compiles once and writes the cache there."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    code = "import numpy as np; from lmc.permutation.lap import sap_solver; sap_solver(np.eye(3))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert list(tmp_path.rglob("*.nbi")), "no numba cache index written"


@pytest.mark.parametrize("name", available_solvers())
def test_every_registered_solver_is_exact_and_its_duals_certify_it(name):
    """Every registered LAP solver (and alias): the optimum of scipy on random costs; a solver
    registered as returning duals returns feasible, complementary ones (004 eq. 3-4)."""
    fn, returns_duals = get_solver(name)
    rng = np.random.default_rng(7)
    for n in (1, 5, 40):
        cost = rng.standard_normal((n, n))
        sol = fn(cost)
        rows, cols = linear_sum_assignment(cost)
        assert sorted(sol.perm) == list(range(n))
        assert cost[np.arange(n), sol.perm].sum() == pytest.approx(cost[rows, cols].sum())
        if returns_duals:
            reduced = cost - sol.u[:, None] - sol.v[None, :]
            assert reduced.min() >= -1e-9
            assert np.abs(reduced[np.arange(n), sol.perm]).max() <= 1e-9


def _flat(n: int, seed: int, spread: float = 0.05) -> np.ndarray:
    """A nearly flat weight-matching cost ``-(A Bᵀ)`` (a shared mean dominates every unit, as in
    a trained VGG's wide layers): every augmenting path of a cold solve scans most columns."""
    rng = np.random.default_rng(seed)
    a = (1 + spread * rng.normal(size=(n, 64))) * rng.uniform(0.5, 1.5, size=(n, 1))
    b = (1 + spread * rng.normal(size=(n, 64))) * rng.uniform(0.5, 1.5, size=(n, 1))
    return -(a @ b.T)


@pytest.mark.parametrize("seed", range(4))
def test_long_paths_hand_over_to_the_auction_and_finish_exactly(seed):
    from lmc.permutation.lap_sap import sap_square

    cost = _flat(512, seed)
    x, u, v, status, _, freed, bids = sap_square(cost)
    assert status == 0 and freed > 400 and bids > 0  # the kernel stopped and the auction ran
    sol = LapSolution(x, u, v)
    _check(cost, sol)
    x2, *_ = sap_square(cost, auction=False)  # the kernel alone: the same optimum
    assert cost[np.arange(512), x].sum() == pytest.approx(cost[np.arange(512), x2].sum(), abs=1e-9)
    # a warm start from garbage duals on the same matrix also hands over, and is exact
    rng = np.random.default_rng(seed)
    garbage = LapSolution(rng.permutation(512), None, rng.normal(size=512))
    _check(cost, sap_solver(cost, warm=garbage))


def test_an_auction_stopped_by_its_bid_cap_still_gives_the_exact_optimum(monkeypatch):
    from lmc.permutation import lap_sap

    cost = _flat(512, 7)
    monkeypatch.setattr(lap_sap, "AUCTION_MAX_BIDS", 0)  # no bid at all: the kernel finishes
    x, u, v, status, _, _, bids = lap_sap.sap_square(cost)
    assert status == 0 and bids == 0
    _check(cost, LapSolution(x, u, v))
    monkeypatch.setattr(lap_sap, "AUCTION_MAX_BIDS", 1)  # stopped mid-phase: rows left free
    x, u, v, status, _, _, bids = lap_sap.sap_square(cost)
    assert status == 0 and bids == 512
    _check(cost, LapSolution(x, u, v))


def test_the_auction_on_constant_or_offset_costs():
    from lmc.permutation.lap_sap import auction_start

    x, v = np.full(200, -1), np.zeros(200)
    assert auction_start(np.full((200, 200), 3.0), x, v) == 0  # nothing to bid for
    cost = _flat(300, 1) + 1e9  # huge offset: the last epsilon stays above the duals' rounding
    x, v = np.full(300, -1), np.zeros(300)
    bids = auction_start(cost, x, v)
    assert 0 < bids <= 200 * 300
    _check(cost, sap_solver(cost, warm=LapSolution(x, None, v)))


def _scanning_row_reduction(c, x, y, v, free, nfree):
    """Jonker and Volgenant's augmenting row reduction as written first: a full scan of the row
    at every step (the kernel keeps each row's smallest reduced costs between scans)."""
    n = c.shape[0]
    for _ in range(2):
        k, prev, nfree, steps = 0, nfree, 0, 0
        while k < prev:
            i = free[k]
            k += 1
            steps += 1
            h = c[i] - v
            order = np.lexsort((np.arange(n), h))  # by value, then column: the scan's ties
            j1, j2 = int(order[0]), int(order[1])
            umin, usub = h[j1], h[j2]
            i0 = y[j1]
            lowered = umin < usub
            if lowered:
                if steps > 8 * n:
                    free[nfree] = i
                    nfree += 1
                    continue
                v[j1] -= usub - umin
            elif i0 >= 0:
                j1, i0 = j2, y[j2]
            x[i], y[j1] = j1, i
            if i0 >= 0:
                x[i0] = -1
                if lowered:
                    k -= 1
                    free[k] = i0
                else:
                    free[nfree] = i0
                    nfree += 1
    return nfree


@pytest.mark.parametrize("kind", ["flat", "ties", "normal"])
@pytest.mark.parametrize("seed", range(3))
def test_row_reduction_with_kept_minima_is_the_scanning_one(kind, seed):
    """The kept smallest reduced costs answer exactly as a fresh scan would: the same
    assignment, duals and free rows, step for step (ties broken by the lower column), on flat
    costs where rows are bid for back and forth, on tied and on plain ones."""
    from lmc.permutation.lap_sap import _augmenting_row_reduction

    n = 96
    rng = np.random.default_rng(seed)
    cost = {"flat": _flat(n, seed), "ties": _matrix("ties", n, n, seed)}.get(kind)
    cost = _matrix("normal", n, n, seed) if cost is None else cost
    v0 = cost.min(0)  # the column reduction of a cold start
    x0 = np.full(n, -1)
    y0 = np.full(n, -1)
    keep = rng.permutation(n)[: n // 3]  # a third of the rows keep their column minimum's pair
    for i in keep:
        j = int(np.argmin(cost[i] - v0))
        if y0[j] < 0:
            x0[i], y0[j] = j, i
    free0 = np.flatnonzero(x0 < 0)
    out = []
    for reduce in (_augmenting_row_reduction, _scanning_row_reduction):
        x, y, v, free = x0.copy(), y0.copy(), v0.copy(), np.zeros(n, np.int64)
        free[: len(free0)] = free0
        left = reduce(cost, x, y, v, free, len(free0))
        out.append((x, y, v, free[:left]))
    (xa, ya, va, fa), (xb, yb, vb, fb) = out
    assert len(fa) < len(free0)  # the reduction assigned rows
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb) and np.array_equal(fa, fb)
    assert np.array_equal(va, vb)  # bit for bit: the same subtractions in the same order


def test_row_reduction_breaks_ties_by_column_like_the_scan():
    """Small integer costs tie all the time: a moved kept column tying with another must come
    after it if its index is higher, as in a scan (hundreds of small cases, all rows free)."""
    from lmc.permutation.lap_sap import _augmenting_row_reduction

    for n, high in ((5, 3), (5, 4), (8, 3)):
        for seed in range(200):
            cost = np.random.default_rng(seed).integers(0, high, size=(n, n)).astype(np.float64)
            out = []
            for reduce in (_augmenting_row_reduction, _scanning_row_reduction):
                x, y, v = np.full(n, -1), np.full(n, -1), cost.min(0)
                free = np.arange(n)
                left = reduce(cost, x, y, v, free, n)
                out.append((x, v, free[:left]))
            (xa, va, fa), (xb, vb, fb) = out
            assert np.array_equal(xa, xb) and np.array_equal(va, vb), (n, high, seed)
            assert np.array_equal(fa, fb), (n, high, seed)


def test_a_broken_pair_whose_column_has_room_is_kept_without_a_path():
    """Row i's pair (i, j) stops being its row minimum, but every other row's reduced cost in
    column j exceeds the gap: raising v[j] keeps it, and no row needs an augmenting path."""
    rng = np.random.default_rng(3)
    n = 60
    cost = rng.normal(size=(n, n))
    cold = sap_solver(cost)
    red = cost - cold.u[:, None] - cold.v[None, :]
    for i in range(n):  # a row whose next reduced cost and column room are both clear of 0
        j = int(cold.perm[i])
        second = np.delete(red[i], j).min()  # row i's next smallest reduced cost
        room = np.delete(red[:, j], i).min()  # column j's smallest among the other rows
        if second > 1e-3 and room > 1e-3:
            break
    else:
        pytest.fail("no row with clear gaps")
    moved = cost.copy()
    moved[i, j] += second + room / 2  # broken by room / 2, which column j can absorb
    warm = sap_solver(moved, warm=cold)
    _check(moved, warm)
    assert warm.freed == 0 and np.array_equal(warm.perm, cold.perm)
    # only column j's dual moved, by the gap (no row went through the row reduction)
    assert np.array_equal(np.delete(warm.v, j), np.delete(cold.v, j))
    assert warm.v[j] - cold.v[j] == pytest.approx(room / 2, rel=1e-9)


@pytest.mark.parametrize("kind", ["normal", "ties", "flat"])
def test_float32_costs_solve_as_their_float64_widening(kind):
    """float32 costs go to the kernel as they are (weight matching's cost matrices): every
    operation on them widens them exactly, so assignment and duals equal the float64 solve's,
    bit for bit, cold and warm (and through the auction on flat costs)."""
    from lmc.permutation.lap_sap import sap_square

    n = 300
    cost = (_flat(n, 1) if kind == "flat" else _matrix(kind, n, n, 1)).astype(np.float32)
    wide = cost.astype(np.float64)
    moved = (wide + 0.01 * np.random.default_rng(2).normal(size=(n, n))).astype(np.float32)
    for c32 in (cost, moved):
        warm = sap_square(wide)
        for start in ((None, None), (warm[0], warm[2])):
            a = sap_square(c32, *start)
            b = sap_square(c32.astype(np.float64), *start)
            for x, y in zip(a, b):
                assert np.array_equal(x, y)
    sol32, sol64 = sap_solver(cost[:, :200]), sap_solver(wide[:, :200])  # padded rectangles
    assert np.array_equal(sol32.perm, sol64.perm) and np.array_equal(sol32.v, sol64.v)
    assert sap_solver(cost).u.dtype == np.float64


def _scanning_auction(c, x, v, eps, eps_end, max_bids):
    """The auction as written first: every bid scans its row (the kernel keeps each row's
    smallest reduced costs between bids)."""
    from lmc.permutation.lap_sap import AUCTION_FACTOR

    n = c.shape[0]
    bids = 0
    while True:
        y = np.full(n, -1)
        x[:] = -1
        queue = list(range(n))
        while queue:
            if bids >= max_bids:
                return bids
            i = queue.pop(0)
            h = c[i] - v
            order = np.lexsort((np.arange(n), h))
            j1, m1, m2 = int(order[0]), h[order[0]], h[order[1]]
            v[j1] -= m2 - m1 + eps
            bids += 1
            old, y[j1], x[i] = y[j1], i, j1
            if old >= 0:
                x[old] = -1
                queue.append(old)
        if eps <= eps_end:
            return bids
        eps = max(eps / AUCTION_FACTOR, eps_end)


@pytest.mark.parametrize("kind", ["flat", "ties"])
def test_auction_with_kept_minima_bids_as_the_scanning_one(kind):
    """Bid for bid the same auction: the same assignment, duals and number of bids."""
    from lmc.permutation.lap_sap import _auction

    for seed in range(3):
        cost = _flat(48, seed) if kind == "flat" else _matrix("ties", 48, 48, seed)
        span = float(cost.max() - cost.min())
        out = []
        for auction in (_auction, _scanning_auction):
            x, v = np.full(48, -1), cost.min(0).copy()
            bids = auction(cost, x, v, span / 4, span * 1e-7, 200 * 48)
            out.append((x, v, bids))
        (xa, va, ba), (xb, vb, bb) = out
        assert ba == bb and ba > 48  # rows were outbid
        assert np.array_equal(xa, xb) and np.array_equal(va, vb)


def test_compile_kernels_prepares_both_dtypes_and_the_auction():
    """After :func:`compile_kernels` the kernel and the auction hold a compiled version for
    float32 and for float64 costs (a benchmark's first timed solve compiles nothing)."""
    from lmc.permutation import lap_sap

    lap_sap.compile_kernels()
    for kernel in (lap_sap._sap_kernel, lap_sap._auction):
        dtypes = {str(sig[0].dtype) for sig in kernel.signatures}
        assert {"float32", "float64"} <= dtypes, (kernel, dtypes)
