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
        # Branch-free (min, max and a select), so the loop over rows is SIMD. (The label as arithmetic,
        # best += (label - best)·(v < a), widened int32 to int64: the sweep took 2.5× as long on Milan, 1.6 ns a score.)
        for r in range(m):
            v, a = acc[r], first[r]
            second[r] = min(second[r], max(v, a))
            first[r] = min(v, a)
            best[r] = label if v < a else best[r]


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


@njit(cache=True, inline="always")
def _loosened(i, labels, upper, lower, x_sq, scale, shift, other, gap, skip_slack):
    """Row ``i``'s bounds after the centres moved (``shift``: its own centre's move, ``other``: the largest other move,
    ``gap``: from its centre to the nearest other), and whether they rule out every other centre by more than rounding
    could undo. One function for the pass and for :func:`rows_to_score`, so the count is the pass's own."""
    a = labels[i]
    u = upper[i] + shift[a]
    low = lower[i] - other[a]
    floor = max(gap[a] - u, low, 0.0)
    return u, low, u * u + 2 * scale * x_sq[i] + skip_slack < floor * floor


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
    cluster's sums to the new one's (``sums``/``totals`` per part, float64, zeroed first). ``changed`` and
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
        part_sums[:] = 0.0  # (here, by the part's own thread: the buffers are reused from pass to pass)
        part_totals[:] = 0.0
        # The rows the bounds leave are gathered until a tile's worth (across tiles of the part) before they are
        # scored: where the bounds skip most rows, a tile's few left made the SIMD loops over rows short (the
        # mixture's passes scored a sixth of the rows, about 43 a tile, at under half the pace of full tiles).
        # The rows are still settled in order, so the sums are added in the same order as before.
        end = min(n, (p + 1) * per_part * TILE)
        m = 0
        for i in range(p * per_part * TILE, end + 1):
            if i < end:
                if not score_all:
                    upper[i], lower[i], skip = _loosened(
                        i, labels, upper, lower, x_sq, scale, shift, other, gap, skip_slack
                    )
                    if skip:
                        continue  # its centre is nearer than any other by more than rounding could undo
                index[m] = i
                norms[m] = x_sq[i]
                for t in range(d):
                    rows_t[t, m] = x[i, t]
                m += 1
                if m < TILE:
                    continue
            if m == 0:
                continue  # (the end of the part, no row gathered since the last tile's worth)
            _nearest_two(rows_t, m, cm2, c_sq, best, first, second, acc)
            scored[p] += m
            for r in range(m):  # (a loop of its own, so the square roots are SIMD too)
                # with ‖x‖² added these are squared distances, each within the slack of the exact one
                upper_t[r] = math.sqrt(max(first[r] + norms[r] * (1 + scale) + c_slack, 0.0))
                lower_t[r] = math.sqrt(max(second[r] + norms[r] * (1 - scale) - c_slack, 0.0))
            for r in range(m):
                row = index[r]
                upper[row], lower[row] = upper_t[r], lower_t[r]
                if labels[row] != best[r]:
                    _move_row(x, w, weighted, row, best[r], labels, part_sums, part_totals)
                    changed[p] += 1
            m = 0


@njit(parallel=True, cache=True)
def rows_to_score(labels, upper, lower, x_sq, scale, shift, other, gap, skip_slack, every):
    """Of the rows in one tile in ``every`` (every row with 1), how many :func:`lloyd_pass` would score now, testing
    its bounds, and how many were looked at (nothing is written): the rows whose loosened bounds do not rule out
    every other centre."""
    n = labels.shape[0]
    looked_at = (n + every * TILE - 1) // (every * TILE)
    counts = np.zeros(looked_at, np.int64)
    sizes = np.zeros(looked_at, np.int64)
    for s in prange(looked_at):
        start = s * every * TILE
        count = 0
        for i in range(start, min(n, start + TILE)):
            count += not _loosened(i, labels, upper, lower, x_sq, scale, shift, other, gap, skip_slack)[2]
        counts[s] = count
        sizes[s] = min(n, start + TILE) - start
    return counts.sum(), sizes.sum()


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
    """``‖x‖²`` of every row, in float64 (for the bounds' rounding slack, which needs no particular order of sums:
    four running sums, 1.5× faster than one chain of dependent adds at 128 features here)."""
    n, d = x.shape
    for i in prange(n):
        s0 = s1 = s2 = s3 = 0.0
        for t in range(0, d - 3, 4):
            s0 += np.float64(x[i, t]) ** 2
            s1 += np.float64(x[i, t + 1]) ** 2
            s2 += np.float64(x[i, t + 2]) ** 2
            s3 += np.float64(x[i, t + 3]) ** 2
        for t in range(d - d % 4, d):
            s0 += np.float64(x[i, t]) ** 2
        out[i] = (s0 + s1) + (s2 + s3)


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


# -- the BLAS pass (dlscale.kmeans.blas_pass): a GEMM scores a block of rows, the loop settles them in cache -------


#: Rows per GEMM of the BLAS pass: half a tile, so a block never straddles two parts. (Blocks of 128 rows scored
#: the 128-feature mixture in 9.7 ms a pass here, against 11.1 ms for 256 and 11.5-12.2 for torch's GEMM of the
#: whole chunk: docs/benchmarks.md.)
BLOCK = TILE // 2
#: Rows whose labels are settled together: their near ties are scored again in one call (one call per block, of one
#: or two rows each, cost 2 ms a pass), and their rows are still in the L2 cache when they move between the sums.
GROUP = 8 * BLOCK
#: Near ties scored again per call, at most: their transposed rows stay small (a group's, 512 KB at 128 features,
#: had each feature's row 4 KB from the next: the same cache set).
TIES = 64


@njit(cache=True, inline="always")
def _nearest_two_of_block(x, start, m, cm2, c_sq, by_centre, best, first, second):
    """The nearest centre of rows ``start`` to ``start + m``, and the two smallest ``‖c‖² − 2·x·c``, by one GEMM."""
    k = c_sq.shape[0]
    # The GEMM writes the scores a centre per row (−2·c · xᵀ: the rows' block transposed, a flag to the BLAS), so the
    # sweeps below are SIMD over rows with no copy. (Scores a row per row turned in a loop: a third of the noise's
    # pass at 32 features, 64 centres on Milan, 62 ms against 46.)
    scores = by_centre[: k * m].reshape((k, m))  # (contiguous, as np.dot's out must be)
    np.dot(cm2, x[start : start + m].T, scores)
    for r in range(m):
        first[r] = np.inf
        second[r] = np.inf
        best[r] = 0
    for j in range(k):  # branch-free, as in _nearest_two
        label, c_j, scores_j = np.int32(j), c_sq[j], scores[j]
        for r in range(m):
            v, a = scores_j[r] + c_j, first[r]
            second[r] = min(second[r], max(v, a))
            first[r] = min(v, a)
            best[r] = label if v < a else best[r]


@njit(parallel=True, cache=True)
def blas_pass(x, w, cm2, c_sq, c_max, labels, upper, lower, x_sq, scale, tie_scale, sums, totals, changed, near):
    """One Lloyd's pass scoring every row by BLAS (see :mod:`dlscale.kmeans.blas_pass`): per part of the rows, a group
    at a time, each block of the group scored by a GEMM against the centres (``cm2``: −2·c); then the group's near
    ties are scored again, and its rows get their bounds and move between the part's sums while they are in cache.

    A row whose two smallest GEMM values are within ``tie_scale·(‖x‖² + c_max)`` of each other (``c_max``: the
    largest ‖c‖²) is scored again by :func:`lloyd_pass`'s arithmetic, so every label is the one that pass gives;
    ``near`` counts them per part. The bounds allow ``scale·(‖x‖² + c_max)`` for rounding, as that pass's do.
    The parts, and the order of the rows within each, are :func:`lloyd_pass`'s, so the float64 sums are its sums
    bit for bit. The BLAS must run one thread per call here (the caller limits it): the parts are the threads.
    """
    n, d = x.shape
    k = c_sq.shape[0]
    parts = sums.shape[0]
    tiles = (n + TILE - 1) // TILE
    per_part = (tiles + parts - 1) // parts
    weighted = w.shape[0] > 0
    c_slack = scale * c_max
    for p in prange(parts):
        by_centre = np.empty(k * BLOCK, x.dtype)
        best = np.empty(GROUP, np.int32)
        first = np.empty(GROUP, x.dtype)
        second = np.empty(GROUP, x.dtype)
        tied = np.empty(GROUP, np.int64)
        rows_t = np.empty((d, TIES), x.dtype)
        tied_best = np.empty(TIES, np.int32)
        tied_first = np.empty(TIES, x.dtype)
        tied_second = np.empty(TIES, x.dtype)
        acc = np.empty(TIES, x.dtype)
        part_sums, part_totals = sums[p], totals[p]
        part_sums[:] = 0.0  # (here, by the part's own thread: the buffers are reused from pass to pass)
        part_totals[:] = 0.0
        end = min(n, (p + 1) * per_part * TILE)
        for group in range(p * per_part * TILE, end, GROUP):
            size = min(end, group + GROUP) - group
            ties = 0
            for offset in range(0, size, BLOCK):
                m = min(size, offset + BLOCK) - offset
                at = slice(offset, offset + m)
                _nearest_two_of_block(x, group + offset, m, cm2, c_sq, by_centre, best[at], first[at], second[at])
                for r in range(offset, offset + m):
                    if np.float64(second[r]) - np.float64(first[r]) <= tie_scale * (x_sq[group + r] + c_max):
                        tied[ties] = r
                        ties += 1
            for some in range(0, ties, TIES):
                count = min(ties, some + TIES) - some
                for q in range(count):
                    for t in range(d):
                        rows_t[t, q] = x[group + tied[some + q], t]
                _nearest_two(rows_t, count, cm2, c_sq, tied_best, tied_first, tied_second, acc)
                for q in range(count):
                    r = tied[some + q]
                    best[r], first[r], second[r] = tied_best[q], tied_first[q], tied_second[q]
            near[p] += ties
            for r in range(size):
                i = group + r
                upper[i] = math.sqrt(max(first[r] + x_sq[i] * (1 + scale) + c_slack, 0.0))
                lower[i] = math.sqrt(max(second[r] + x_sq[i] * (1 - scale) - c_slack, 0.0))
                if labels[i] != best[r]:
                    _move_row(x, w, weighted, i, best[r], labels, part_sums, part_totals)
                    changed[p] += 1
