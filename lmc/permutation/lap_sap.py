"""Shortest-augmenting-path LAP with a true warm start, compiled with numba (issue 18).

The kernel solves ``min_P <C, P>`` over permutation matrices of a square float64 matrix ``C``
and returns the assignment ``x`` (row ``i`` -> column ``x[i]``) with optimal duals ``u`` (rows)
and ``v`` (columns): ``C[i, j] - u[i] - v[j] >= 0`` everywhere, ``= 0`` on the assignment.

Warm start (004 §4.2, Alg. 3 asks for duals carried from one solve to the next): given a
previous assignment ``x0`` and column duals ``v0`` (any finite values: exact, stale or garbage)

1. dual feasibility is restored by ``u[i] = min_j C[i, j] - v0[j]`` (one pass over ``C``,
   which also reads each column's smallest reduced cost while the row is in cache);
2. every previous pair ``(i, x0[i])`` that is still tight (a row minimum, up to rounding) is
   kept; a broken one is kept too when raising its column's dual by the gap leaves every other
   row's reduced cost in that column non-negative (its smallest decides: no column scan); the
   other rows are freed, a freed row whose minimum lies in a column nobody kept takes it (it
   is tight too), and Jonker and Volgenant's augmenting row reduction assigns most of the rest
   (:func:`_augmenting_row_reduction`);
3. only from the rows still free, shortest augmenting paths (Dijkstra on reduced costs, the
   scheme of scipy's ``linear_sum_assignment``, Crouse 2016) complete the assignment and move
   the duals, keeping feasibility and complementary slackness.

A cold solve is the same with ``v0`` = the column minima and no previous pair (Jonker and
Volgenant's column reduction followed by the row-minimum greedy start). Correctness never
depends on the quality of ``x0``/``v0``; only the number of freed rows (hence the time) does.

Some matrices make every augmenting path long: a trained VGG-11 x4's cost matrices of 2048
units are nearly flat (every entry within a narrow band), and a cold solve there frees ~1,800
rows whose Dijkstra searches each scan most of the matrix: 4-5 s a solve on one core, as long
as scipy's. The kernel watches its own work: once the paths it has run predict that the rest
will scan more than :data:`BAIL_ROWS` x n rows, it stops, and an epsilon-scaling auction
(Bertsekas 1988, Gauss-Seidel bidding; :func:`_auction`) computes near-optimal column duals
from where the kernel stopped, from which a second, warm run of the kernel finishes exactly
(0.1 s on that matrix). The auction only supplies a start: the result is the kernel's exact
optimum either way.

numba compiles the kernel once per process on first use and caches the machine code on disk
(``cache=True``): in ``lmc/permutation/__pycache__`` when the package is writable, else in
numba's per-user cache, else in ``$NUMBA_CACHE_DIR``, which :func:`_configure_cache` points at
a writable folder (``$XDG_CACHE_HOME/lmc/numba`` or the temp dir) when neither is writable.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

#: rows of a kept pair may miss the row minimum by this much (relative), i.e. float rounding
TIGHT_RTOL = 1e-13


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _configure_cache() -> bool:
    """Make sure numba has a writable cache folder; returns whether caching is possible.

    numba looks in ``$NUMBA_CACHE_DIR``, then ``__pycache__`` beside this file, then its
    per-user cache folder; if it finds none it refuses to compile a ``cache=True`` function.
    When the package sits in a read-only location (a system site-packages, a container image)
    and the home folder is read-only too, point ``NUMBA_CACHE_DIR`` at a writable folder.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return _writable(Path(os.environ["NUMBA_CACHE_DIR"]))
    if _writable(Path(__file__).resolve().parent / "__pycache__"):
        return True
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for cand in (Path(home) / "lmc" / "numba", Path(tempfile.gettempdir()) / "lmc-numba-cache"):
        if _writable(cand):
            os.environ["NUMBA_CACHE_DIR"] = str(cand)
            if "numba" in sys.modules:  # already imported: its config was read at import
                sys.modules["numba"].config.CACHE_DIR = str(cand)
            return True
    warnings.warn(
        "no writable folder for numba's cache (package dir, ~/.cache, temp dir): the LAP kernel "
        "is compiled anew in every process; set NUMBA_CACHE_DIR to a writable folder",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


_CACHE = _configure_cache()

from numba import njit  # noqa: E402  (after the cache folder is settled)

# status codes returned by the kernel (BAIL: stopped for the auction, see the module docstring)
OK, NONFINITE, STUCK, BAIL = 0, 1, 2, 3

#: the kernel hands over to the auction when its remaining paths would scan more rows than this
#: many times n (the auction's bids on the flat VGG matrices: ~35 n, each a scan of one row)
BAIL_ROWS = 64
#: the kernel first runs this many paths to estimate their length
BAIL_AFTER = 16
#: the auction's last epsilon, relative to the range of the costs: near-optimal duals, which
#: the warm kernel completes to the exact optimum
AUCTION_EPS_END = 1e-7
#: epsilon shrinks by this factor from phase to phase (range / 4 first)
AUCTION_FACTOR = 5.0
#: the auction stops after this many bids times n (the kernel finishes from where it is)
AUCTION_MAX_BIDS = 200


@njit(cache=_CACHE, nogil=True)
def _auction(c, x, v, eps, eps_end, max_bids):  # pragma: no cover - compiled
    """Forward auction with epsilon scaling on the column duals ``v`` (minimisation form).

    Each free row bids for the column of its smallest reduced cost ``c[i, j] - v[j]``, lowering
    that column's dual by the gap to its second smallest plus ``eps``; the column's previous
    row becomes free. Each phase starts with every row free and keeps the duals; ``eps`` is
    divided by :data:`AUCTION_FACTOR` until ``eps_end``. ``x`` (row -> column, -1 = none) and
    ``v`` are written in place. Returns the number of bids; stops after ``max_bids``. A bid's
    two smallest reduced costs come from :func:`_smallest_two` (bids only lower the duals).
    """
    n = c.shape[0]
    y = np.empty(n, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    bids = 0
    # a row's smallest reduced costs, kept between its bids (the duals only fall: see
    # _smallest_two); on a trained VGG-11 x4's flat matrices a row bids 34-128 times
    kv, kj, scanned = _kept_minima(n)
    while True:
        for j in range(n):
            y[j] = -1
        for i in range(n):
            x[i] = -1
            queue[i] = i
        head = 0
        count = n
        while count > 0:
            if bids >= max_bids:
                return bids
            i = queue[head]
            head = (head + 1) % n
            count -= 1
            m1, j1, m2, _ = _smallest_two(c, v, i, kv, kj, scanned)
            v[j1] -= m2 - m1 + eps
            bids += 1
            old = y[j1]
            y[j1] = i
            x[i] = j1
            if old >= 0:
                x[old] = -1
                queue[(head + count) % n] = old
                count += 1
        if eps <= eps_end:
            return bids
        eps = max(eps / AUCTION_FACTOR, eps_end)


def auction_start(c: np.ndarray, x: np.ndarray, v: np.ndarray) -> int:
    """Overwrite ``x`` and ``v`` with an auction's near-optimal assignment and column duals
    for the finite square ``c`` (n >= 2); returns the number of bids."""
    lo, hi = float(c.min()), float(c.max())
    span = hi - lo
    if not span > 0:  # constant costs: every assignment is optimal, nothing to bid for
        return 0
    # the last epsilon stays well above the rounding of the duals' magnitude
    eps_end = max(span * AUCTION_EPS_END, max(abs(lo), abs(hi)) * 1e-12)
    return int(_auction(c, x, v, span / 4, eps_end, AUCTION_MAX_BIDS * c.shape[0]))


#: the augmenting row reduction and the auction keep each row's this many smallest reduced
#: costs from its last scan (:func:`_smallest_two`; 8 or 16 were slower on VGG-11 x4's LAPs)
KEEP = 4


@njit(cache=_CACHE, nogil=True)
def _kept_minima(n):  # pragma: no cover - compiled
    """Room for every row's :data:`KEEP` smallest pairs (values, columns) and whether the row
    was scanned yet: the state :func:`_smallest_two` keeps."""
    keep = min(KEEP, n)
    return np.empty((n, keep)), np.empty((n, keep), dtype=np.int64), np.zeros(n, dtype=np.bool_)


@njit(cache=_CACHE, nogil=True)
def _scan_row(c, v, i, kv, kj):  # pragma: no cover - compiled
    """The ``kv.shape[1]`` smallest pairs ``(c[i, j] - v[j], j)`` of row ``i`` in
    lexicographic order, written into ``kv[i]`` (values) and ``kj[i]`` (columns)."""
    n = c.shape[0]
    keep = kv.shape[1]
    for k in range(keep):
        kv[i, k] = np.inf
        kj[i, k] = n
    last = np.inf
    for j in range(n):
        h = c[i, j] - v[j]
        if h < last:  # a later column ties lose: (h, j) sorts after every kept pair of value h
            p = keep - 1
            while p > 0 and h < kv[i, p - 1]:
                kv[i, p] = kv[i, p - 1]
                kj[i, p] = kj[i, p - 1]
                p -= 1
            kv[i, p] = h
            kj[i, p] = j
            last = kv[i, keep - 1]


@njit(cache=_CACHE, nogil=True)
def _smallest_two(c, v, i, kv, kj, scanned):  # pragma: no cover - compiled
    """Row ``i``'s two smallest pairs ``(c[i, j] - v[j], j)`` (lexicographically: the lower
    column first among equal values) as ``(h1, j1, h2, j2)``, from its kept pairs (``kv``,
    ``kj``, see :func:`_scan_row`) re-read with the current duals, scanning the row only the
    first time (``scanned[i]``) or when a column not kept may come second. Exact as long as
    the duals have only decreased since the row's last scan: a column not kept is then still
    above the last kept pair."""
    n = c.shape[0]
    keep = kv.shape[1]
    if not scanned[i]:  # just scanned: the kept pairs are exact
        _scan_row(c, v, i, kv, kj)
        scanned[i] = True
        return kv[i, 0], kj[i, 0], kv[i, 1], kj[i, 1]
    h1 = np.inf
    h2 = np.inf
    j1 = n
    j2 = n
    for q in range(keep):
        j = kj[i, q]
        h = c[i, j] - v[j]
        if h < h2 or (h == h2 and j < j2):
            if h < h1 or (h == h1 and j < j1):
                h2 = h1
                j2 = j1
                h1 = h
                j1 = j
            else:
                h2 = h
                j2 = j
    last = kv[i, keep - 1]
    if keep < n and (h2 > last or (h2 == last and j2 > kj[i, keep - 1])):
        _scan_row(c, v, i, kv, kj)
        return kv[i, 0], kj[i, 0], kv[i, 1], kj[i, 1]
    return h1, j1, h2, j2


@njit(cache=_CACHE, nogil=True)
def _augmenting_row_reduction(c, x, y, v, free, nfree):  # pragma: no cover - compiled
    """Two passes of Jonker and Volgenant's augmenting row reduction over the free rows.

    Keeps the invariant that every assigned row's column is a minimum of ``c[i] - v``; returns
    the number of rows still free (listed first in ``free``).

    A row's two smallest reduced costs (lexicographically, with the column) come from its
    :data:`KEEP` smallest at its last scan, re-read with the current duals: the duals only
    decrease here, so a column not kept has not fallen below the last kept pair, and the kept
    ones answer as long as two of them still come first. On flat matrices the rows are bid
    for back and forth (7 scans a row on a trained VGG-11 x4's): most scans are saved.
    """
    n = c.shape[0]
    kv, kj, scanned = _kept_minima(n)
    for _ in range(2):
        k = 0
        prev = nfree
        nfree = 0
        steps = 0
        while k < prev:
            i = free[k]
            k += 1
            steps += 1
            umin, j1, usub, j2 = _smallest_two(c, v, i, kv, kj, scanned)
            i0 = y[j1]
            lowered = umin < usub
            if lowered:
                if steps > 8 * n:  # a guard against cycling on float rounding
                    free[nfree] = i
                    nfree += 1
                    continue
                v[j1] -= usub - umin
            elif i0 >= 0:
                j1 = j2
                i0 = y[j2]
            x[i] = j1
            y[j1] = i
            if i0 >= 0:
                x[i0] = -1
                if lowered:
                    k -= 1
                    free[k] = i0
                else:
                    free[nfree] = i0
                    nfree += 1
    return nfree


@njit(cache=_CACHE, nogil=True)
def _sap_kernel(c, x, v, cold, may_bail):  # pragma: no cover - compiled; tested through solve_sap
    """Solve in place: ``x`` (row -> column, -1 = none) and ``v`` are the warm start (``v`` is
    overwritten by the column minima when ``cold``). Returns ``(u, status, bad_row, freed,
    scanned)``; with ``may_bail``, status ``BAIL`` when the paths left look too long (``x``
    and ``v`` are then a consistent partial assignment and its duals)."""
    n = c.shape[0]
    u = np.empty(n)
    y = np.full(n, -1, dtype=np.int64)  # column -> row
    jmin = np.empty(n, dtype=np.int64)
    if cold:
        for j in range(n):
            v[j] = np.inf
            x[j] = -1
        for i in range(n):
            for j in range(n):
                if c[i, j] < v[j]:
                    v[j] = c[i, j]
    # 1. feasibility: u[i] = min_j c[i, j] - v[j]; 2. keep the tight previous pairs. A warm
    # start also gets each column's smallest reduced cost, read while the row is in cache
    low = np.full(n, np.inf)
    for i in range(n):
        m = np.inf
        jm = -1
        for j in range(n):
            a = c[i, j] - v[j]
            if a - a != 0.0:  # NaN or +-inf (a branch never taken, not a chain of additions)
                return u, NONFINITE, i, 0, 0
            if a < m:
                m = a
                jm = j
        u[i] = m  # every entry finite: a minimum was found (jm >= 0)
        jmin[i] = jm
        if not cold:
            for j in range(n):
                low[j] = min(low[j], c[i, j] - v[j] - m)
        j = x[i]
        if j >= 0:
            a = c[i, j] - v[j]
            tol = TIGHT_RTOL * (abs(c[i, j]) + abs(v[j]) + abs(m))
            if a - m <= tol and y[j] < 0:
                y[j] = i
            elif y[j] >= 0:
                x[i] = -1
    # a broken pair (i, j) is kept by raising v[j] to make it tight, if column j allows it
    for i in range(n):
        j = x[i]
        if j < 0 or y[j] == i:
            continue
        x[i] = -1
        if y[j] >= 0:
            continue
        # it fits if no other row's reduced cost in column j is below delta; row i's own is
        # delta, so the column's smallest decides
        delta = c[i, j] - v[j] - u[i]
        if low[j] >= delta:
            v[j] += delta
            x[i] = j
            y[j] = i
    # a freed row takes its minimum's column when nobody kept it (also tight)
    free = np.empty(n, dtype=np.int64)
    nfree = 0
    for i in range(n):
        if x[i] < 0:
            j = jmin[i]
            if y[j] < 0:
                x[i] = j
                y[j] = i
            else:
                free[nfree] = i
                nfree += 1
    if nfree and n > 1:  # Jonker-Volgenant augmenting row reduction, two passes
        nfree = _augmenting_row_reduction(c, x, y, v, free, nfree)
        for i in range(n):  # duals of rows: tight on the assignment, row minimum if free
            if x[i] >= 0:
                u[i] = c[i, x[i]] - v[x[i]]
            else:
                m = np.inf
                for j in range(n):
                    a = c[i, j] - v[j]
                    if a < m:
                        m = a
                u[i] = m
    # 3. shortest augmenting paths from the free rows only
    spc = np.empty(n)
    path = np.empty(n, dtype=np.int64)
    remaining = np.empty(n, dtype=np.int64)
    srows = np.empty(n, dtype=np.int64)
    scols = np.empty(n, dtype=np.int64)
    scanned = 0
    for f in range(nfree):
        row = free[f]
        for j in range(n):
            spc[j] = np.inf
            remaining[j] = j
        nrem = n
        i = row
        min_val = 0.0
        sink = -1
        nsr = 0
        nsc = 0
        while sink < 0:
            srows[nsr] = i
            nsr += 1
            h = min_val - u[i]
            lowest = np.inf
            index = -1
            for it in range(nrem):
                j = remaining[it]
                r = h + c[i, j] - v[j]
                if r < spc[j]:
                    path[j] = i
                    spc[j] = r
                s = spc[j]
                if s < lowest or (s == lowest and y[j] < 0):
                    lowest = s
                    index = it
            if index < 0:
                return u, STUCK, row, f, scanned
            min_val = lowest
            j = remaining[index]
            scols[nsc] = j
            nsc += 1
            if y[j] < 0:
                sink = j
            else:
                i = y[j]
            nrem -= 1
            remaining[index] = remaining[nrem]
        scanned += nsr
        u[row] += min_val
        for k in range(1, nsr):
            i = srows[k]
            u[i] += min_val - spc[x[i]]
        for k in range(nsc):
            j = scols[k]
            v[j] -= min_val - spc[j]
        j = sink
        while True:
            i = path[j]
            y[j] = i
            nxt = x[i]
            x[i] = j
            j = nxt
            if i == row:
                break
        done = f + 1  # paths so far predict the rest: hand over to the auction if long
        if may_bail and done >= BAIL_AFTER and scanned * (nfree - done) > BAIL_ROWS * n * done:
            return u, BAIL, -1, nfree, scanned
    return u, OK, -1, nfree, scanned


def compile_kernels() -> None:
    """Compile (or load from numba's on-disk cache) every kernel for float32 and float64
    costs: the kernel, its row reduction and the auction (compiled on its first call), so that
    no solve a benchmark times includes a compilation."""
    cost = np.random.default_rng(0).normal(size=(4, 4))
    for dtype in (np.float32, np.float64):
        c = cost.astype(dtype)
        x, _, v, *_ = sap_square(c)
        sap_square(c, x, v)
        auction_start(c, np.full(4, -1, dtype=np.int64), np.zeros(4))


def sap_square(
    cost: np.ndarray,
    x0: np.ndarray | None = None,
    v0: np.ndarray | None = None,
    auction: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int, int]:
    """Run the kernel on a square C-contiguous float64 ``cost``; no argument checks.

    With ``auction``, a solve whose augmenting paths turn out long hands over to the auction
    and finishes warm from its duals (module docstring). Returns ``(x, u, v, status, bad_row,
    freed, bids)``: ``freed`` is the number of rows that needed an augmenting path in the
    first run, ``bids`` the auction's bids (0 when it did not run).
    """
    n = cost.shape[0]
    cold = v0 is None
    x = np.full(n, -1, dtype=np.int64) if x0 is None else np.array(x0, dtype=np.int64)
    v = np.zeros(n) if v0 is None else np.array(v0, dtype=np.float64)
    u, status, bad, freed, _ = _sap_kernel(cost, x, v, cold, auction and n > BAIL_AFTER)
    bids = 0
    if status == BAIL:
        bids = auction_start(cost, x, v)
        u, status, bad, _, _ = _sap_kernel(cost, x, v, False, False)
    return x, u, v, int(status), int(bad), int(freed), bids
