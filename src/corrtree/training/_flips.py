"""The kernel trainer's flips: each flip of a pair changes a row and a column of the NTK
matrix ``H`` and one output (``docs/design.md``, "The kernel trainer")."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from ._pool import NFIRE, START, SUPP

__all__ = [
    "apply_flips",
    "apply_flips_by_rows",
    "flip_outputs",
    "flips_by_rows_cost",
    "is_symmetric",
    "new_h_cost",
]

_ROUND_UP = _config.ROUND_UP
_U64 = _config.U64
_EVALUATE_CHUNKS = _config.EVALUATE_CHUNKS


@njit(cache=True, inline="always")
def _add_pair(H, a, r, j, i, G, sign, m, lo, hi):
    """``g·a_r a_rᵀ``, ``g = sign·G[j, i]/m``, into the ``(j, i)`` and ``(i, j)`` blocks of
    ``H``, the rows of points ``lo <= · < hi`` only."""
    K = a.shape[1]
    own_j, own_i = lo <= j < hi, lo <= i < hi
    if not (own_j or own_i):
        return
    g = sign * G[j, i] / m
    for k in range(K):
        for k2 in range(K):
            c = g * a[r, k] * a[r, k2]
            if own_j:
                H[j * K + k, i * K + k2] += c
            if own_i:
                H[i * K + k2, j * K + k] += c


@njit(cache=True, inline="always")
def _add_diag(H, a, r, j, g):
    K = a.shape[1]
    for k in range(K):
        for k2 in range(K):
            H[j * K + k, j * K + k2] += g * a[r, k] * a[r, k2]


def apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m) -> tuple[int, int]:
    """Add flips (grouped by neuron, already applied to the pool) to ``u`` and ``H``.

    For each neuron the fire set before its flips is rebuilt from the pool,
    then the flips are added one by one: turning ``j`` on adds, for every
    point ``l`` then firing with ``r``, ``G[j, l]/m·a_r a_rᵀ`` to the
    ``(j, l)`` and ``(l, j)`` blocks of ``H`` (and ``G[j, j]/m`` to
    ``(j, j)``); turning it off removes the same.  Returns the changes of the
    fired-pair and moved-neuron counts.

    Each thread owns a range of points: it walks all the flips and writes only
    the rows of ``H`` and ``u`` of its points, so every entry receives its
    additions in the serial order, whatever the number of threads.
    Fewer than :data:`~corrtree._config.SERIAL_WORK` flips are added on the calling
    thread: the late steps of a run flip a handful of pairs, and waking the other
    threads costs more than that (on a virtual machine whose idle cores halt,
    milliseconds).  O(Σ_flips |S_r|·K²) writes, plus the walk per thread; the
    ``(l, j)`` writes land in a different row each, a cache miss each once ``H``
    outgrows the cache (:func:`apply_flips_by_rows` avoids them).
    """
    if fr.shape[0] < _config.SERIAL_WORK:
        return _apply_flips_rows(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, 0, u.shape[0])
    parts = max(1, min(numba.get_num_threads(), u.shape[0]))
    return _apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, parts)


def apply_flips_by_rows(
    fr, fj, fv, fon, seg, pool, u, H, T, a, G, b, scale, m, points
) -> tuple[int, int]:
    """:func:`apply_flips` through the scratch matrix ``T`` (``H``'s shape, zero on
    entry and on return): each flip adds ``±a_r a_rᵀ/m`` along its own point's row of
    ``T`` only -- into the ``(j, l)`` block of every point ``l`` of the neuron's fire
    set as the flip meets it, half of it into ``(j, j)`` -- the flips of one point
    one after the other, while that row stays in cache; then one pass over the tiles
    of ``H`` that meet those rows or their columns adds ``(T + Tᵀ) ∘ G``.

    Every entry of ``H`` receives one addition, the same for ``(p, q)`` as for
    ``(q, p)`` (``H`` stays symmetric to the bit; ``G`` must be, as ``X @ X.T`` is);
    the result equals :func:`apply_flips`'s up to rounding, for any number of
    threads.  ``points``: the distinct points of ``fj``, sorted.
    O(Σ_flips |S_r|·K²) writes along rows (the sets written out first, in the
    neurons' order), plus O(nK·min(nK, K·tile·#points)) for the tiles, instead of
    as many writes each in a row of its own.
    """
    starts = np.flatnonzero(np.diff(fr, prepend=-1))
    ends = np.append(starts[1:], fr.shape[0])
    ptr, sets = _flip_sets(fr, fj, fon, seg, pool, starts, ends)
    order = np.argsort(fj, kind="stable")
    bounds = np.searchsorted(fj[order], points)
    _rows_by_point(fr, fj, fon, order, bounds, ptr, sets, T, a, m)
    _add_symmetric(H, T, points, G, _config.FLIP_TILE)
    flip_outputs(fr, fj, fv, fon, u, a, b, scale)
    after = seg[fr[starts], NFIRE]
    before = after - np.add.reduceat(np.where(fon, 1, -1), starts)
    return int((after - before).sum()), int((after > 0).sum() - (before > 0).sum())


def flips_by_rows_cost(writes: float, points: int, size: int, K: int) -> float:
    """Modelled cost of :func:`apply_flips_by_rows` (in sequential additions): its
    ``writes`` along rows at :data:`~corrtree._config.FLIP_ROW_WRITE_COST`, and its
    tiles -- at most every tile of ``H`` (``size × size``), or the tile rows and
    columns of the ``points`` flipped -- at :data:`~corrtree._config.FLIP_TILE_COST`
    an entry."""
    tiles = min(float(size) * size, 2.0 * points * K * _config.FLIP_TILE * size)
    return _config.FLIP_ROW_WRITE_COST * writes + _config.FLIP_TILE_COST * tiles


@njit(cache=True, inline="always")
def _set_before(r, i, stop, fj, fon, seg, ej, fire, cur):
    """Write into ``cur`` the fire set of ``r`` before its flips ``i:stop`` (the pool
    holds the set after them: less the points they turn on, plus those they turn
    off); returns its size."""
    s0 = seg[r, START]
    nc = 0
    for q in range(s0, s0 + seg[r, SUPP]):
        if fire[q]:
            keep = True
            for f in range(i, stop):
                if fon[f] and fj[f] == ej[q]:
                    keep = False  # turned on by these flips: not in the old set
            if keep:
                cur[nc] = ej[q]
                nc += 1
    for f in range(i, stop):  # turned off by these flips: in the old set
        if not fon[f]:
            cur[nc] = fj[f]
            nc += 1
    return nc


@njit(cache=True, inline="always")
def _leave(cur, nc, j):
    """Remove ``j`` from ``cur[:nc]`` (order not kept); returns the new size."""
    for c in range(nc):
        if cur[c] == j:
            cur[c] = cur[nc - 1]
            return nc - 1
    return nc


@njit(cache=True, parallel=True)
def _flip_sets(fr, fj, fon, seg, pool, starts, ends):
    """The fire set of each flip's neuron as the flip meets it, without the flipped
    point: ``sets[ptr[f]:ptr[f + 1]]``, from the pool's sets after the flips
    (``starts``, ``ends``: where each neuron's flips start and end).  Returns
    ``(ptr, sets)``.  O(Σ_flips |S_r| + Σ_r |prefix_r|·#flips of r)."""
    ej, fire = pool.j, pool.fire
    ng = starts.shape[0]
    size = np.zeros(fr.shape[0] + 1, dtype=np.int64)
    for g in prange(ng):
        i, stop = starts[g], ends[g]
        nc = seg[fr[i], NFIRE]
        for f in range(i, stop):
            nc += -1 if fon[f] else 1
        for f in range(i, stop):  # the size of the set as flip f meets it
            if not fon[f]:
                nc -= 1
            size[f + 1] = nc
            if fon[f]:
                nc += 1
    ptr = np.cumsum(size)
    sets = np.empty(ptr[-1], dtype=np.int32)
    for g in prange(ng):
        i, stop = starts[g], ends[g]
        cur = np.empty(size[i + 1] + (stop - i), dtype=np.int32)
        nc = _set_before(fr[i], i, stop, fj, fon, seg, ej, fire, cur)
        for f in range(i, stop):
            j = fj[f]
            if not fon[f]:
                nc = _leave(cur, nc, j)
            sets[ptr[f] : ptr[f + 1]] = cur[:nc]
            if fon[f]:
                cur[nc] = j
                nc += 1
    return ptr, sets


@njit(cache=True, parallel=True)
def _rows_by_point(fr, fj, fon, order, bounds, ptr, sets, T, a, m):
    """The flips' writes along their own points' rows of ``T``: ``±a_r a_rᵀ/m`` into
    block ``(j, l)`` for each ``l`` of the flip's set and half of it into ``(j, j)``;
    the flips of a point one after the other, in their order (``order``: the flips
    by point, ``bounds``: where each point's start), each point's rows on one
    thread.  O(Σ_flips |S_r|·K²)."""
    K = a.shape[1]
    npts = bounds.shape[0]
    for c in prange(npts):
        lo = bounds[c]
        hi = bounds[c + 1] if c + 1 < npts else order.shape[0]
        for k in range(lo, hi):
            f = order[k]
            r, j = fr[f], fj[f]
            sign = 1.0 if fon[f] else -1.0
            for kk in range(K):
                row = T[j * K + kk]
                for k2 in range(K):
                    w = sign * a[r, kk] * a[r, k2] / m
                    for p in range(ptr[f], ptr[f + 1]):
                        row[sets[p] * K + k2] += w
                    row[j * K + k2] += 0.5 * w


@njit(cache=True, parallel=True)
def is_symmetric(G):
    """Whether the square ``G`` equals its transpose to the bit (``np.array_equal(G,
    G.T)``, NaN unequal), tile by tile: a strided read of ``G.T`` misses the cache once a
    value (0.35 s at n = 4096), a tile of it once a line.  O(n²)."""
    n = G.shape[0]
    tile = 64
    nb = (n + tile - 1) // tile
    bad = np.zeros(nb, dtype=np.bool_)
    for pb in prange(nb):
        for qb in range(pb, nb):
            for p in range(pb * tile, min((pb + 1) * tile, n)):
                for q in range(
                    max(qb * tile, p + 1) if qb == pb else qb * tile, min((qb + 1) * tile, n)
                ):
                    if not G[p, q] == G[q, p]:
                        bad[pb] = True
            if bad[pb]:
                break
        for p in range(pb * tile, min((pb + 1) * tile, n)):  # NaN: unequal to itself
            if not G[p, p] == G[p, p]:
                bad[pb] = True
    return not bad.any()


@njit(cache=True, parallel=True)
def _add_symmetric(H, T, points, G, tile):
    """``H += (T + Tᵀ) ∘ (G ⊗ 1_{K×K})`` over the tiles that meet the rows of ``points``
    (``T`` is zero elsewhere), then those rows of ``T`` set to zero.  Each tile row
    is one thread's, and ``(T[p, q] + T[q, p])·G[p, q]`` is the same number for
    ``(p, q)`` and ``(q, p)`` (``G`` symmetric to the bit, as ``X @ X.T`` is).
    O(tiles·tile²): a tile of ``Tᵀ`` is copied, then the rows are added in order."""
    size = H.shape[0]
    K = size // G.shape[0]
    nb = (size + tile - 1) // tile
    hit = np.zeros(nb, dtype=np.bool_)
    for c in range(points.shape[0]):
        for k in range(K):
            hit[(points[c] * K + k) // tile] = True
    point = np.arange(size) // K  # the point of each row of H
    for pb in prange(nb):
        p0, p1 = pb * tile, min((pb + 1) * tile, size)
        tq = np.empty((tile, tile))  # the tile of Tᵀ
        gq = np.empty(tile)
        for qb in range(nb):
            if not (hit[pb] or hit[qb]):
                continue
            q0, q1 = qb * tile, min((qb + 1) * tile, size)
            w = q1 - q0
            for q in range(q0, q1):
                tr = T[q]
                for p in range(p0, p1):
                    tq[p - p0, q - q0] = tr[p]
            for p in range(p0, p1):
                g = G[point[p]]
                for q in range(w):
                    gq[q] = g[point[q0 + q]]
                hp, tp, tt = H[p, q0:q1], T[p, q0:q1], tq[p - p0]
                for q in range(w):
                    hp[q] += (tp[q] + tt[q]) * gq[q]
    for c in prange(points.shape[0]):
        for k in range(K):
            T[points[c] * K + k, :] = 0.0


@njit(cache=True)
def new_h_cost(seg, K2):
    """``Σ_r |S_r|²·K²``: the additions that build ``H`` anew.  O(m)."""
    total = 0.0
    for r in range(seg.shape[0]):
        total += float(seg[r, NFIRE]) ** 2
    return total * K2


@njit(cache=True)
def flip_outputs(fr, fj, fv, fon, u, a, b, scale):
    """The outputs' part of :func:`apply_flips`: ``±scale·(U_rj - b)·a_r`` into ``u_j``
    for each flip, in order.  O(#flips·K)."""
    for f in range(fr.shape[0]):
        z = scale * (fv[f] - b)
        if not fon[f]:
            z = -z
        for k in range(a.shape[1]):
            u[fj[f], k] += a[fr[f], k] * z


@njit(cache=True, parallel=True)
def _apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, parts):
    n = u.shape[0]
    counts = np.zeros((parts, 2), dtype=np.int64)
    for t in prange(parts):
        lo, hi = t * n // parts, (t + 1) * n // parts
        counts[t, 0], counts[t, 1] = _apply_flips_rows(
            fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, lo, hi
        )
    return counts[0, 0], counts[0, 1]


@njit(cache=True)
def _apply_flips_rows(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, lo, hi):
    """:func:`apply_flips` for the rows of points ``lo <= · < hi``."""
    ej, fire = pool.j, pool.fire
    K = a.shape[1]
    d_fired = 0
    d_moved = 0
    i = 0
    while i < fr.shape[0]:
        r = fr[i]
        stop = i
        while stop < fr.shape[0] and fr[stop] == r:
            stop += 1
        cur = np.empty(seg[r, NFIRE] + (stop - i), dtype=np.int64)
        nc = _set_before(r, i, stop, fj, fon, seg, ej, fire, cur)
        before = nc
        for f in range(i, stop):
            j = fj[f]
            if fon[f]:
                sign = 1.0
            else:
                sign = -1.0
                nc = _leave(cur, nc, j)  # leave the set first
            for c in range(nc):
                _add_pair(H, a, r, j, cur[c], G, sign, m, lo, hi)
            if fon[f]:
                cur[nc] = j
                nc += 1
            if lo <= j < hi:
                _add_diag(H, a, r, j, sign * G[j, j] / m)
                z = sign * scale * (fv[f] - b)
                for k in range(K):
                    u[j, k] += a[r, k] * z
        d_fired += nc - before
        d_moved += (nc > 0) - (before > 0)
        i = stop
    return d_fired, d_moved
