"""The loops of the CPU pass, compiled by numba: imported only by :mod:`dlscale.kmeans.hamerly` (numba is optional).

Rows are scored a tile at a time: the tile's rows are copied transposed (d × tile) so the
loops over a tile's rows are unit-stride, and the compiler turns them into SIMD over rows
(8 float32 rows per AVX2 instruction), whatever d and k are. A row's distances are never
written to memory: each centre's distances for the tile update the nearest and second
nearest in place. Neither ``fastmath`` nor FMA contraction is allowed, so every call (the
fit, ``predict``, one rank or N) rounds a row's distances the same way.
"""

import math

import numpy as np
from numba import njit, prange

#: Rows per tile: a tile's transposed rows, distances and nearest two stay in the L1 cache.
TILE = 256


@njit(cache=True, inline="always")
def _nearest_two(rows_t, m, cm2, c_sq, best, first, second, acc):
    """For the tile's first ``m`` rows: the nearest centre, and ``‖c‖² − 2·x·c`` for it and the second nearest.

    Ties go to the lower-numbered centre, as a row-wise argmin (and scikit-learn) gives.
    """
    k, d = cm2.shape
    for r in range(m):
        first[r] = np.inf
        second[r] = np.inf
        best[r] = 0
    for j in range(k):
        label = np.int32(j)
        for r in range(m):
            acc[r] = c_sq[j]
        # four features per sweep over the tile: a quarter of the loads and stores of acc (2.1× faster at d = 32)
        for t in range(0, d - 3, 4):
            f0, f1, f2, f3 = cm2[j, t], cm2[j, t + 1], cm2[j, t + 2], cm2[j, t + 3]
            x0, x1, x2, x3 = rows_t[t], rows_t[t + 1], rows_t[t + 2], rows_t[t + 3]
            for r in range(m):
                acc[r] += (x0[r] * f0 + x1[r] * f1) + (x2[r] * f2 + x3[r] * f3)
        for t in range(d - d % 4, d):
            factor = cm2[j, t]
            for r in range(m):
                acc[r] += rows_t[t, r] * factor
        for r in range(m):  # branch-free (min, max, arithmetic), so the loop over rows stays SIMD
            v, a = acc[r], first[r]
            second[r] = min(second[r], max(v, a))
            first[r] = min(v, a)
            best[r] += (label - best[r]) * np.int32(v < a)


@njit(cache=True, inline="always")
def _move_row(x, w, weighted, i, new, labels, part_sums, part_totals):
    """Give row ``i`` the label ``new`` (not its label now): move its weighted features from the old cluster's sums
    to the new one's. One function for both passes, so their float64 sums agree bit for bit."""
    old = labels[i]
    labels[i] = new
    weight = w[i] if weighted else 1.0
    for t in range(x.shape[1]):
        part_sums[new, t] += weight * x[i, t]
    part_totals[new] += weight
    if old >= 0:
        for t in range(x.shape[1]):
            part_sums[old, t] -= weight * x[i, t]
        part_totals[old] -= weight


@njit(parallel=True, cache=True)
def lloyd_pass(
    x,
    w,
    cm2,
    c_sq,
    labels,
    upper,
    lower,
    x_sq,
    scale,
    shift,
    other,
    gap,
    c_slack,
    skip_slack,
    score_all,
    sums,
    totals,
    changed,
    scored,
):
    """One Lloyd's pass over this rank's rows with Hamerly's bounds (see :mod:`dlscale.kmeans.hamerly`).

    Rows whose bounds rule out a new centre are skipped; the others are scored, their bounds
    reset, and each row that changed cluster moves its weighted features from the old
    cluster's sums to the new one's (``sums``/``totals`` per part, float64). ``changed`` and
    ``scored`` count per part. With ``score_all`` every row is scored (its bounds are then
    set afresh); on the first pass (labels −1) every row is also added to its cluster.
    """
    n, d = x.shape
    parts = sums.shape[0]
    tiles = (n + TILE - 1) // TILE
    per_part = (tiles + parts - 1) // parts
    weighted = w.shape[0] > 0
    for p in prange(parts):
        rows_t = np.empty((d, TILE), x.dtype)
        index = np.empty(TILE, np.int64)
        best = np.empty(TILE, np.int32)
        first = np.empty(TILE, x.dtype)
        second = np.empty(TILE, x.dtype)
        acc = np.empty(TILE, x.dtype)
        norms = np.empty(TILE, np.float64)
        upper_t = np.empty(TILE, np.float64)
        lower_t = np.empty(TILE, np.float64)
        part_sums, part_totals = sums[p], totals[p]
        for tile in range(p * per_part, min(tiles, (p + 1) * per_part)):
            m = 0
            for i in range(tile * TILE, min(n, (tile + 1) * TILE)):
                if not score_all:
                    a = labels[i]
                    u = upper[i] + shift[a]
                    low = lower[i] - other[a]
                    upper[i], lower[i] = u, low
                    floor = max(gap[a] - u, low, 0.0)
                    if u * u + 2 * scale * x_sq[i] + skip_slack < floor * floor:
                        continue  # its centre is nearer than any other by more than rounding could undo
                index[m] = i
                norms[m] = x_sq[i]
                for t in range(d):
                    rows_t[t, m] = x[i, t]
                m += 1
            if m == 0:
                continue
            _nearest_two(rows_t, m, cm2, c_sq, best, first, second, acc)
            scored[p] += m
            for r in range(m):  # (a loop of its own, so the square roots are SIMD too)
                # with ‖x‖² added these are squared distances, each within the slack of the exact one
                upper_t[r] = math.sqrt(max(first[r] + norms[r] * (1 + scale) + c_slack, 0.0))
                lower_t[r] = math.sqrt(max(second[r] + norms[r] * (1 - scale) - c_slack, 0.0))
            for r in range(m):
                i = index[r]
                upper[i], lower[i] = upper_t[r], lower_t[r]
                if labels[i] != best[r]:
                    _move_row(x, w, weighted, i, best[r], labels, part_sums, part_totals)
                    changed[p] += 1


@njit(parallel=True, cache=True)
def nearest(x, cm2, c_sq, labels, distance):
    """Every row's nearest centre, by the same arithmetic as :func:`lloyd_pass`, and its squared distance (float64)."""
    n, d = x.shape
    tiles = (n + TILE - 1) // TILE
    for tile in prange(tiles):
        rows_t = np.empty((d, TILE), x.dtype)
        best = np.empty(TILE, np.int32)
        first = np.empty(TILE, x.dtype)
        second = np.empty(TILE, x.dtype)
        acc = np.empty(TILE, x.dtype)
        start = tile * TILE
        m = min(n, start + TILE) - start
        for r in range(m):
            for t in range(d):
                rows_t[t, r] = x[start + r, t]
        _nearest_two(rows_t, m, cm2, c_sq, best, first, second, acc)
        for r in range(m):
            x_sq = 0.0
            for t in range(d):
                x_sq += np.float64(x[start + r, t]) ** 2
            labels[start + r] = best[r]
            distance[start + r] = max(first[r] + x_sq, 0.0)


@njit(parallel=True, cache=True)
def column_sums(x, parts):
    """The sum of each column of ``x``, in float64: per part of the rows in parallel, then the parts in order."""
    n, d = x.shape
    size = (n + parts - 1) // parts
    totals = np.zeros((parts, d))
    for p in prange(parts):
        total = totals[p]
        for i in range(p * size, min(n, (p + 1) * size)):
            for t in range(d):
                total[t] += x[i, t]
    return totals.sum(0)


@njit(parallel=True, cache=True)
def squared_norms(x, out):
    """``‖x‖²`` of every row, in float64."""
    n, d = x.shape
    for i in prange(n):
        total = 0.0
        for t in range(d):
            total += np.float64(x[i, t]) ** 2
        out[i] = total


@njit(parallel=True, cache=True)
def inertia(x, w, centers, labels, parts):
    """Σ w·‖x − c_label‖² over the rows, each term and the sums in float64 (``w`` empty: weights of 1)."""
    n, d = x.shape
    size = (n + parts - 1) // parts
    totals = np.zeros(parts)
    weighted = w.shape[0] > 0
    for p in prange(parts):
        total = 0.0
        for i in range(p * size, min(n, (p + 1) * size)):
            row = 0.0
            for t in range(d):
                row += (np.float64(x[i, t]) - np.float64(centers[labels[i], t])) ** 2
            total += w[i] * row if weighted else row
        totals[p] = total
    return totals.sum()


# -- the BLAS pass's loops (dlscale.kmeans.blas_pass): a GEMM scores the rows, these read its block --------------


@njit(parallel=True, cache=True)
def nearest_two_of_scores(scores, x_sq, tie_scale, c_max, best, first, second, near):
    """For each row of ``scores`` (rows × k of ``‖c‖² − 2·x·c``, from a GEMM): its smallest column (the first of
    equals), the two smallest values, and whether they are within ``tie_scale·(‖x‖² + c_max)`` of each other (a
    near tie, which rounding could reverse). Branch-free (min, max, arithmetic): 3× faster than with branches here."""
    n, k = scores.shape
    for i in prange(n):
        a, b, label = np.inf, np.inf, np.int32(0)
        for j in range(k):
            v = scores[i, j]
            b = min(b, max(v, a))
            label += (np.int32(j) - label) * np.int32(v < a)
            a = min(v, a)
        best[i], first[i], second[i] = label, a, b
        near[i] = np.float64(b) - np.float64(a) <= tie_scale * (x_sq[i] + c_max)


@njit(parallel=True, cache=True)
def nearest_two_of_rows(x, rows, cm2, c_sq, best, first, second):
    """The rows ``rows`` of ``x`` scored by :func:`lloyd_pass`'s arithmetic: nearest centre, first and second values."""
    n = rows.shape[0]
    d = x.shape[1]
    tiles = (n + TILE - 1) // TILE
    for tile in prange(tiles):
        rows_t = np.empty((d, TILE), x.dtype)
        tile_best = np.empty(TILE, np.int32)
        tile_first = np.empty(TILE, x.dtype)
        tile_second = np.empty(TILE, x.dtype)
        acc = np.empty(TILE, x.dtype)
        start = tile * TILE
        m = min(n, start + TILE) - start
        for r in range(m):
            for t in range(d):
                rows_t[t, r] = x[rows[start + r], t]
        _nearest_two(rows_t, m, cm2, c_sq, tile_best, tile_first, tile_second, acc)
        for r in range(m):
            best[start + r], first[start + r], second[start + r] = tile_best[r], tile_first[r], tile_second[r]


@njit(parallel=True, cache=True)
def apply_labels(x, w, best, first, second, labels, upper, lower, x_sq, scale, c_slack, sums, totals, changed):
    """Set every row's bounds from its two nearest values and move the rows whose label changed between the sums.

    The rows are split into parts exactly as :func:`lloyd_pass` splits them, and each part moves its rows in the
    same order, so the float64 sums are bit for bit those the compiled pass would have left.
    """
    n = x.shape[0]
    parts = sums.shape[0]
    tiles = (n + TILE - 1) // TILE
    per_part = (tiles + parts - 1) // parts
    weighted = w.shape[0] > 0
    for p in prange(parts):
        part_sums, part_totals = sums[p], totals[p]
        for i in range(p * per_part * TILE, min(n, (p + 1) * per_part * TILE)):
            upper[i] = math.sqrt(max(first[i] + x_sq[i] * (1 + scale) + c_slack, 0.0))
            lower[i] = math.sqrt(max(second[i] + x_sq[i] * (1 - scale) - c_slack, 0.0))
            if labels[i] != best[i]:
                _move_row(x, w, weighted, i, best[i], labels, part_sums, part_totals)
                changed[p] += 1
