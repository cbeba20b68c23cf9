"""The kernel-space trainer: exact gradient descent through the NTK recurrence.

Beyond the paper (``docs/design.md``, "The kernel trainer").  With ``H(t)`` the NTK matrix of the
current fire sets (``nK × nK``: ``(1/m)·Σ_r a_r a_rᵀ ⊗ (F_r F_rᵀ) ∘ G``) the
outputs obey exactly

    u(t+1) = u(t) - η·H(t)·err(t) + Σ_{(r,j) flipped} (a_r/sqrt m)·(U[r,j](t+1) - b)·(F_new - F_old)

so an iteration costs one ``nK × nK`` mat-vec, plus the work on the pairs that
cross ``b``.  Those are found without touching every neuron: while the fire
set of ``r`` is constant its drift obeys

    ||w_r(t') - w_r(t)|| <= (η/sqrt m)·σ_r·sqrt(K)·(P(t') - P(t)),   P(t) = Σ_{τ<t} ||err(τ)||_F

(``σ_r² >= λ_max(G_SS)``, a Gershgorin bound), so each neuron gets a key: the
value of the global, increasing ``P`` at which one of its tracked pairs, or
the band that protects its untracked pairs, could first be reached.  Keys
sit in a heap; an iteration processes only the neurons whose key ``P`` has
passed: it evaluates their tracked pairs exactly (Gram identity on the
anchored products, as in the lazy trainer), applies the flips to ``u`` and
``H`` (each changes a row and column of ``H`` by ``±G[j, S̃_r]/m``),
re-anchors the neuron if its band may be exceeded, and gives it a new key.  On data
with leading directions, while the visits read a large share of the fired pairs,
each neuron keeps its own clock instead (:func:`own_clocks`: the errors on its own
fire set, one O(fired pairs) pass a step; :meth:`KernelTrainer._choose_clock`).
Per iteration: O((nK)² + work on the keyed neurons) -- no ``d``, and the
second term vanishes as the error decays.

Mini-batch SGD without momentum or weight decay is this recurrence with an
error that is zero outside the batch.  With momentum or weight decay a pair's
coefficient keeps changing after it stops firing, so ``u(t+1) - u(t)`` is no
longer ``H·err``: those steps are the band trainers' linear step
(:meth:`~.band.BandTrainer._advance_linear`, every moving neuron evaluated),
and ``H`` and the keys are left as they were.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .. import _config
from ._heap import pop_due, push_all
from ._ntk import ntk_matrix
from ._pairs import (
    by_data,
    coef,
    data_dot,
    dot_row,
    eval_ever,
    eval_ever_data,
    flip,
    form_move,
    gram_block,
    move_norm,
    needs_reanchor,
    safe_norm,
    sigma,
    trace_sigma,
)
from ._pool import (
    BETA,
    CNT,
    DRIFT,
    KEY,
    MINKEY,
    NFIRE,
    SIGMA,
    SIGMA_UNKNOWN,
    START,
    SUPP,
)
from ._state import Field, Scalar, Schema, fail
from .band import BAND_FIELDS, BAND_SCALARS, BandTrainer
from .optim import LinearStep

__all__ = [
    "KEY",
    "KernelTrainer",
    "anchor_keys",
    "apply_flips",
    "apply_flips_by_rows",
    "own_clocks",
    "pop_due",
    "principal_parts",
    "push_all",
    "visit",
    "visit_rows",
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
    ej, fire = pool[0], pool[6]
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
def _new_h_cost(seg, K2):
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
    ej, fire = pool[0], pool[6]
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


def _rest(lam: np.ndarray, k: int) -> float:
    """The (k+1)-th of the descending eigenvalues ``lam``, or 0 when there are ``k`` or fewer."""
    return float(lam[k]) if lam.shape[0] > k else 0.0


def principal_parts(X: np.ndarray, G: np.ndarray, rank: int, gain: float) -> tuple[np.ndarray, ...]:
    """The data along its leading principal directions, for the move bound and the
    screen of :func:`visit`: ``Z = X Q`` (n×k, ``Q`` orthonormal d×k), the residual norms
    ``||x_l - Q z_l||`` and a bound ``ρ`` on the residual's spectral norm
    ``||X - Z Qᵀ||_2`` (the (k+1)-th singular value of X), each enlarged to cover
    the rounding of the eigensolver and of ``Z``.  ``k = min(rank, d, n)``, or 0 when
    ``||X||_2`` is within ``gain`` of that ``ρ`` (data without leading directions,
    as isotropic data): the bound is then ``||X||_2·||dl||``, with no O(k) work per
    pair.

    The screen splits ``G`` itself: ``G = Z Zᵀ + G_res`` with ``G_res + δI`` positive
    semidefinite (``δ`` covers the rounding of ``G``, of the eigensolver and of ``Z``),
    so for any coefficients ``c`` (Cauchy–Schwarz in the ``G_res + δI`` inner product)

        |cᵀ G e_j - <Zᵀc, z_j>| <= sqrt(cᵀ (G_res + δI) c) · g_j + δ·||c||_1,

    with ``g_j >= sqrt(G_res[j, j] + δ)`` and ``sqrt(cᵀ (G_res + δI) c) <= min(ρ_g,
    sqrt(Σ_{l: c_l ≠ 0} g_l²))·||c||``, ``ρ_g² >= λ_max(G_res) + δ``.  Returns ``(Z,
    residual norms, ρ, g, ρ_g, δ)``.  O(n·d·min(n, d) + min(n, d)³), from ``G`` when
    ``n <= d``.
    """
    n, d = X.shape
    # X = U S Vᵀ: eigenpairs of G = U S² Uᵀ, or of Xᵀ X = V S² Vᵀ
    M = G if n <= d else X.T @ X
    k = min(rank, d, n)
    # the values first: data without leading directions needs no vector (2.3x faster
    # at order 784)
    lam = np.linalg.eigvalsh(M)[::-1]
    if k and lam[0] > gain * gain * _rest(lam, k):
        lam, vec = np.linalg.eigh(M)
        lam, vec = lam[::-1], vec[:, ::-1]
    else:  # none: the bound is ||X||_2
        k = 0
        vec = np.empty((M.shape[0], 0))
    rest = _rest(lam, k)
    if n <= d:  # the top rows of S Vᵀ: Z = U_k S_k, Q = Xᵀ U_k / S_k
        top = np.maximum(lam[:k], 0.0)
        Z = np.ascontiguousarray(vec[:, :k] * np.sqrt(top))
        Q = X.T @ vec[:, :k] / np.where(top > 0, np.sqrt(top), 1.0)
    else:
        Q = vec[:, :k]
        Z = np.ascontiguousarray(X @ Q)
    scale = max(float(lam[0]), 0.0) if lam.shape[0] else 0.0
    # eigenvalues err by ~min(n, d)·2⁻⁵³·λ_1; Q's columns are orthonormal to the same order
    slack = 64.0 * min(n, d) * _U64 * scale
    R = X - Z @ Q.T
    resid = np.sqrt(np.einsum("ij,ij->i", R, R))
    bound = math.sqrt(max(rest, 0.0) + slack) * _ROUND_UP
    xn = np.sqrt(np.einsum("ij,ij->i", X, X))
    # G's rounding (<= (d+2)·2⁻⁵³·||x_i||·||x_j|| an entry) and Z's, as a spectral norm
    top = max(scale, float(np.max(xn, initial=0.0)) ** 2)
    delta = slack + 64.0 * (n + d + 2) * (d + 2) * _U64 * top
    zz = np.einsum("ij,ij->i", Z, Z)
    g = np.sqrt(np.maximum(np.diag(G) - zz, 0.0) + delta + (k + 2) * _U64 * zz) * _ROUND_UP
    rho_g = math.sqrt(max(rest, 0.0) + 2.0 * delta) * _ROUND_UP
    return Z, resid * _ROUND_UP + math.sqrt(slack / max(scale, 1e-300)) * xn, bound, g, rho_g, delta


@njit(cache=True, inline="always")
def _sigma_of(r, seg, nf, pool, G, xnorm, d, scatter):
    """``σ_r`` (``nf[r, SIGMA]``), computed if unknown: :func:`~._pairs.trace_sigma` for a
    neuron whose values come from the data (:func:`~._pairs.by_data`), else the
    Gershgorin bound :func:`~._pairs.sigma`."""
    if nf[r, SIGMA] == SIGMA_UNKNOWN:
        if by_data(d, seg[r, SUPP], scatter):
            nf[r, SIGMA] = trace_sigma(r, seg, pool, xnorm)
        else:
            nf[r, SIGMA] = sigma(r, seg, pool, G)
    return nf[r, SIGMA]


@njit(cache=True, inline="always")
def _heap_key(r, nf, anchor_drift, R, P, per_p):
    """The value of ``P`` at which the drift of ``r`` may first reach the smallest key of
    its entries (``nf[r, MINKEY]``) or its band (``β/R`` past ``anchor_drift[r]``): the
    drift grows at most ``per_p·σ_r`` per unit of ``P``."""
    drift = nf[r, DRIFT]
    slack = min(nf[r, MINKEY] - drift, nf[r, BETA] / R - (drift - anchor_drift[r]))
    rate = per_p * nf[r, SIGMA]
    return P + max(slack, 0.0) / rate if rate > 0 else np.inf


@njit(cache=True, inline="always")
def _entry_key(drift, v, b, xn):
    """The drift at which an entry of value ``v`` at drift ``drift`` may reach ``b``."""
    return drift + abs(v - b) / xn if xn > 0 else np.inf


@njit(cache=True, parallel=True)
def anchor_keys(rows, seg, nf, pool, G, xnorm, d, scatter, b, R, P, per_p, anchor_drift, res_drift):
    """Keys of freshly anchored neurons ``rows`` (all values current): every entry's, the
    neuron's (:func:`_heap_key`), ``anchor_drift[r]``, its drift now, and ``res_drift[r] =
    0``: no residual move since the anchor yet."""
    ej, val, key = pool.j, pool.val, pool.key
    for k in prange(rows.shape[0]):
        r = rows[k]
        drift = nf[r, DRIFT]
        best = np.inf
        s0 = seg[r, START]
        for q in range(s0, s0 + seg[r, CNT]):
            key[q] = _entry_key(drift, val[q], b, xnorm[ej[q]])
            best = min(best, key[q])
        nf[r, MINKEY] = best
        anchor_drift[r] = drift
        res_drift[r] = 0.0
        _sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
        nf[r, KEY] = _heap_key(r, nf, anchor_drift, R, P, per_p)


@njit(cache=True, parallel=True)
def own_clocks(seg, nf, pool, a, err, xnorm, eta_s, cert, R, anchor_drift, clock, due):
    """Advance every neuron's own clock by a bound on its step under the error ``err``,
    and mark in ``due`` the neurons it may have brought to an entry's key or to their band.

    While the fire set ``S`` of ``r`` is constant its step ``eta_s·Σ_{l ∈ S} e_l x_l``,
    ``e_l = <a_r, err_l>``, has norm at most ``eta_s·min(σ_r·||e_S||, Σ_S |e_l|·||x_l||)``
    (Cauchy–Schwarz, the triangle inequality): the errors on the neuron's own fire set,
    where the global clock ``P`` can only use ``sqrt(K)·||err||_F``.  ``clock[r]``, the
    drift at the last visit plus these bounds since (``cert`` times, with their
    rounding), bounds the drift the neuron may have reached; it is due once that reaches
    ``nf[r, MINKEY]`` or ``anchor_drift[r] + β/R`` (always, while ``clock[r]`` is
    infinite).  O(fired pairs·K).
    """
    ej, fire = pool.j, pool.fire
    m = seg.shape[0]
    chunks = min(m, _EVALUATE_CHUNKS)
    for c in prange(chunks):
        for r in range(c * m // chunks, (c + 1) * m // chunks):
            if seg[r, NFIRE]:
                s0 = seg[r, START]
                ns = seg[r, SUPP]
                sq = 0.0
                tri = 0.0
                for q in range(s0, s0 + ns):
                    if fire[q]:
                        j = ej[q]
                        e = dot_row(a, r, err, j)
                        sq += e * e
                        tri += abs(e) * xnorm[j]
                step = tri
                if nf[r, SIGMA] >= 0.0:
                    step = min(step, nf[r, SIGMA] * math.sqrt(sq))
                clock[r] += cert * eta_s * step * (1.0 + (ns + 4) * _U64) * _ROUND_UP
            due[r] = clock[r] >= min(nf[r, MINKEY], anchor_drift[r] + nf[r, BETA] / R)


@njit(cache=True, inline="always")
def _screened_gap(uref, fire, zc, z, xn, b, residual, slack):
    """How far beyond ``b``, on the side ``fire`` says, a value ``uref - <zc, z>`` within
    ``residual`` plus ``slack = (δ·||dc||_1, unit rounding, ||dc||_1·max ||x_l||)`` of
    its exact Gram sum must lie (:func:`visit`'s screen); 0 if it may not be there, or
    if ``||x_j|| = xn`` is 0.  O(k)."""
    zp = 0.0
    for t in range(zc.shape[0]):
        zp += zc[t] * z[t]
    fixed, unit, scale = slack
    margin = (residual + fixed + unit * (scale * xn + abs(uref) + abs(zp))) * _ROUND_UP
    side = uref - zp - b
    gap = side - margin if fire else -side - margin
    return gap if gap > 0.0 and xn > 0 else 0.0


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def visit(
    r, seg, nf, pool, scratch, due_at, a, E, G, X, xnorm, parts, eta_s, b, R, cert, scatter,
    gram_cost, dw, dws, zw, zc, anchor_drift, res_drift, full, ahead, f_j, f_v, f_on, fpos,
):  # fmt: skip
    """Bring neuron ``r``, whose key has passed, to the current time (kernel trainer).

    Since its last visit its fire set ``S`` is constant, so it moved by exactly ``Σ_l dl_l
    x_l`` over its ever-fired pairs (``dl = C - clast``; ``clast`` becomes ``C``): at most
    ``s·||dl_S|| + Σ_{l ∉ S} |dl_l|·||x_l||`` (the second term is rounding: a frozen
    coefficient does not change), with ``s·||dl_S||`` the smaller of ``σ_r·||dl_S||`` and,
    with ``parts = (Z, residual norms, ρ)`` of :func:`principal_parts`, ``||Σ_S dl_l z_l|| +
    min(ρ, ||residuals_S||)·||dl_S||`` (O(|prefix|·k): on coherent data the principal part
    carries most of the move, and it is exact); that bound, times ``cert`` and its rounding,
    is what the drift ``D_r`` gains, unless most of its entries would then be due: those
    visits compute every value anyway, and the exact step ``||Σ_l dl_l x_l||`` too (formed
    from the data in O(d·|prefix|), or ``dlᵀ G dl``), which the drift gains if smaller (on
    incoherent data, while nearly every pair is due, it is several times smaller). Every
    entry, firing or not, keeps a key ``D + |v - b|/||x_j||`` from its last evaluation at
    drift ``D`` with value ``v``: only the entries whose key ``D_r`` reached are evaluated,
    by the Gram identity ``uref - Σ_l dc_l G[l, j]`` (``dc = C - cref``, |prefix| reads; all
    of them in one pass over the prefix's rows of G, :func:`~._pairs.gram_block`) or, when
    ``gram_cost`` reads a value cost more, from the move ``Σ_l dc_l x_l`` formed once.
    With principal directions, a due entry is first screened in O(k): its value is
    ``uref - <Σ_l dc_l z_l, z_j>`` within ``res_drift[r]·g_j`` (:func:`principal_parts`;
    ``res_drift`` sums the bounds on the residual part of each step since the anchor,
    ``zc`` holds ``Σ_l dc_l z_l``), and an entry that stays on its side by more than that
    and the rounding of both ways is not evaluated: its key becomes the drift plus that
    margin over ``||x_j||``.  Only the entries that may flip, or whose side is in doubt,
    are evaluated; the fire flags are the same.
    Flips are applied and recorded from ``fpos`` on (if ``f_j`` is non-empty).

    The distance from the anchor is at most ``D_r - anchor_drift[r]``; once that
    may reach the band ``β/R`` (or if ``full``, or most entries are due), every ever-fired
    value and the exact distance are computed (:func:`~._pairs.eval_ever`,
    :func:`~._pairs.eval_ever_data`), ``anchor_drift`` is reset from them, and the neuron
    is re-anchored if the band is exceeded (its other entries are then left to the
    re-anchoring), or would be after ``ahead`` more steps like this one
    (:func:`lookahead`).  From the data, unless ``full``, the distance is the norm of the
    move formed (:func:`~._pairs.move_norm`) and only the due values are computed, when
    they cost less than the ``|prefix|·d`` of all the ever-fired ones (W4: ``|prefix|``
    reads of G against 784 flops a value; the iterations 1-3 of W4 at m = 2^16 1.3×
    faster).  On the first visit since the anchor the step is that distance: a neuron
    re-anchored then computes no value.  Returns
    ``(fpos + #flips, #values computed, whether to re-anchor)``; the values, keys
    and ``nf[r, MINKEY]`` (over all entries) are current.  O(|prefix|·K + the
    evaluated values).
    """
    ej, uref, val, key, fire, clast, cref, kappa = (
        pool.j, pool.uref, pool.val, pool.key, pool.fire, pool.clast, pool.cref, pool.kappa
    )  # fmt: skip
    record = f_j.shape[0] > 0
    first = fpos
    d = X.shape[1]
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    end = s0 + seg[r, CNT]
    sig = _sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
    Z, resid, rho, gres, rho_g, delta = parts
    k = Z.shape[1]
    dc, dls = scratch[0], scratch[1]
    zw[:] = 0.0
    zc[:] = 0.0
    sq = 0.0
    sq_all = 0.0
    off = 0.0
    res2 = 0.0
    gres2 = 0.0
    l1 = 0.0
    l1_all = 0.0
    l1_c = 0.0
    xmax = 0.0
    xall = 0.0
    unvisited = True  # clast = cref: the step since the last visit is the move since the anchor
    for q in range(s0, s0 + ns):
        c = coef(q, r, kappa, fire, ej, a, E, eta_s)
        unvisited &= clast[q] == cref[q]
        dl = c - clast[q]
        dls[q - s0] = dl
        l1_all += abs(dl)
        sq_all += dl * dl
        j = ej[q]
        xall = max(xall, xnorm[j])
        if fire[q]:
            sq += dl * dl
            res2 += resid[j] * resid[j]
            l1 += abs(dl)
            xmax = max(xmax, xnorm[j])
            for t in range(k):
                zw[t] += dl * Z[j, t]
        else:
            off += abs(dl) * xnorm[j]
        clast[q] = c
        dcq = c - cref[q]
        dc[q - s0] = dcq
        l1_c += abs(dcq)
        if k:
            gres2 += gres[j] * gres[j]
    proj = 0.0
    for t in range(k):
        proj += zw[t] * zw[t]
    # Σ dl z in float64 errs by at most (|S| + k)·2⁻⁵³·Σ|dl|·max ||x||
    proj = math.sqrt(proj) + (ns + k + 4) * _U64 * l1 * xmax
    norm_dl = math.sqrt(sq)
    split = proj + min(rho, math.sqrt(res2)) * norm_dl
    move = (min(sig * norm_dl, split) + off) * (1.0 + (ns + 4) * _U64) * _ROUND_UP
    drift = nf[r, DRIFT] + cert * move
    if k:  # the residual part of this step, in the G_res + δI norm (principal_parts)
        step_res = min(rho_g, math.sqrt(gres2)) * math.sqrt(sq_all)
        res_drift[r] += cert * step_res * (1.0 + (ns + 4) * _U64) * _ROUND_UP
    # a screened value errs by the residual part, δ·||dc||_1 and the rounding of both ways
    res_now = res_drift[r]
    slack = (delta * l1_c, 2.0 * (ns + k + 4) * _U64, l1_c * xall)
    exact = np.inf
    due = 0
    if drift >= nf[r, MINKEY]:  # else no entry is due (MINKEY is their smallest key)
        for q in range(s0, end):
            if key[q] <= drift:
                due += 1
    if k and due:  # the screen's centre, Σ dc_l z_l: only a visit with due entries needs it
        for p in range(ns):
            dcq = dc[p]
            zj = Z[ej[s0 + p]]
            for t in range(k):
                zc[t] += dcq * zj[t]
    fresh = full or (drift - anchor_drift[r]) * R >= nf[r, BETA]
    data = by_data(d, ns, scatter)
    if fresh or 2 * due >= end - s0:  # most values are due: all of them, and the exact step
        fresh = True
        if data:  # ||Σ dl_l x_l||, formed; it errs by at most (|P| + d)·2⁻⁵³·Σ|dl|·max ||x||
            form_move(dws, X, ej, dls, s0, s0 + ns)
            sqx = 0.0
            for t in range(d):
                sqx += dws[t] * dws[t]
            exact = (math.sqrt(sqx) + 4.0 * (ns + d + 4) * _U64 * l1_all * xall) * _ROUND_UP
        else:  # dlᵀ G dl, |P|² reads
            sqx = 0.0
            gmax = 0.0
            for p in range(ns):
                jp = ej[s0 + p]
                gmax = max(gmax, G[jp, jp])
                for p2 in range(ns):
                    sqx += dls[p] * dls[p2] * G[jp, ej[s0 + p2]]
            exact = safe_norm(sqx, l1_all, gmax)
        drift = nf[r, DRIFT] + cert * min(move, exact)
    nf[r, DRIFT] = drift
    evaluated = 0
    again = False
    skip = fresh and unvisited and needs_reanchor(r, nf, exact * (1.0 + ahead), R)
    ever = False  # whether every ever-fired value is current
    if skip:  # its step is its distance from the anchor: re-anchored, no values needed
        again = True
    elif fresh:  # the exact distance from the anchor
        # from the data, the move formed and the due values only, while cheaper than
        # every ever-fired value (W4: 2·|prefix| against 784 a value)
        lite = data and not full and due * min(d, gram_cost * ns) < ns * d
        if data and unvisited:  # the move since the anchor is the step, just formed in dws
            dw[:] = dws
        if lite:
            if not unvisited:
                form_move(dw, X, ej, dc, s0, s0 + ns)
            since = move_norm(dw, l1_c, xall, ns)
        elif data:
            since, _ = eval_ever_data(r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, unvisited)
        else:
            since, _ = eval_ever(r, seg, pool, scratch, a, E, G, eta_s, False)
        ever = not lite
        if ever:
            evaluated = ns
        anchor_drift[r] = drift - cert * since
        again = needs_reanchor(r, nf, since + ahead * exact, R)
        if lite:
            skip = again  # the re-anchoring recomputes every value
            data = ns * gram_cost > d  # the due values: from the move, or from G
    else:
        data = due * ns * gram_cost > (ns + due) * d
    best = np.inf
    stop = s0 if skip else s0 + ns if again else end  # re-anchoring recomputes the others
    if not (fresh or due):  # nothing to evaluate: the keys, and their minimum, stand
        stop = s0
        best = nf[r, MINKEY]
    # the due values (and the ever-fired ones, unless current): screened first, the
    # rest computed together, before any flip moves an entry
    count = 0
    for q in range(s0 + ns if ever else s0, stop):
        if key[q] <= drift:
            j = ej[q]
            if k:
                gap = _screened_gap(
                    uref[q], fire[q], zc, Z[j], xnorm[j], b, res_now * gres[j], slack
                )
                if gap > 0.0:  # on its side, unless rounding keeps it due
                    later = drift + gap / xnorm[j]
                    if later > drift:
                        key[q] = later
                        continue
            due_at[0, count] = q
            due_at[1, count] = j
            count += 1
    if count:
        evaluated += count
        values = scratch[2]
        if data:
            if not fresh:  # a fresh visit formed the move since the anchor in dw
                form_move(dw, X, ej, dc, s0, s0 + ns)
            for t in range(count):
                values[t] = data_dot(X, due_at[1, t], dw)
        else:
            gram_block(G, ej, dc, s0, ns, due_at[1], count, values)
        for t in range(count):
            q = due_at[0, t]
            val[q] = uref[q] - values[t]
    for q in range(s0, stop):  # increasing order: a pair turned on moves below q (flip)
        if (ever and q < s0 + ns) or key[q] <= drift:
            v = val[q]
            now = v >= b
            pos = q
            if now != fire[q]:
                if record:
                    f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], v, now
                fpos += 1
                pos = flip(r, q, seg, pool, a, E, eta_s, now)
            key[pos] = _entry_key(drift, v, b, xnorm[ej[pos]])
            best = min(best, key[pos])
        else:
            best = min(best, key[q])
    nf[r, MINKEY] = best
    if fpos > first:  # the fire set changed
        nf[r, SIGMA] = SIGMA_UNKNOWN
        _sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
    return fpos, evaluated, again


@njit(cache=True)
def _visit_range(
    rows, lo, hi, seg, nf, pool, a, E, G, X, xnorm, parts, eta_s, b, R, cert, scatter,
    gram_cost, anchor_drift, res_drift, full, ahead, P, per_p, fbuf, f_j, f_v, f_on, nflips, nevals,
    again,
):  # fmt: skip
    """:func:`visit` for ``rows[lo:hi]`` on this thread, with its own scratch vectors;
    each gets its new key (:func:`_heap_key`) unless it must be re-anchored
    (``again[k]``).  The flips of ``rows[k]`` are recorded at ``f_*[fbuf[k]:]``
    (when ``f_j`` is non-empty)."""
    record = f_j.shape[0] > 0
    dw = np.empty(X.shape[1])
    dws = np.empty(X.shape[1])
    zw = np.empty(parts[0].shape[1])
    zc = np.empty(parts[0].shape[1])
    scratch = np.empty((3, G.shape[0]))
    due_at = np.empty((2, G.shape[0]), dtype=np.int64)  # the due entries, their points
    for k in range(lo, hi):
        r = rows[k]
        start = fbuf[k] if record else 0
        pos, nevals[k], again[k] = visit(
            r, seg, nf, pool, scratch, due_at, a, E, G, X, xnorm, parts, eta_s, b, R, cert,
            scatter, gram_cost, dw, dws, zw, zc, anchor_drift, res_drift, full, ahead, f_j, f_v,
            f_on, start,
        )  # fmt: skip
        nflips[k] = pos - start
        if not again[k]:
            nf[r, KEY] = _heap_key(r, nf, anchor_drift, R, P, per_p)


@njit(cache=True, parallel=True)
def visit_rows(
    rows, seg, nf, pool, a, E, G, X, xnorm, parts, eta_s, b, R, cert, scatter, gram_cost,
    anchor_drift, res_drift, full, ahead, P, per_p, fbuf, f_j, f_v, f_on, nflips, nevals, again,
):  # fmt: skip
    """:func:`_visit_range` for every neuron of ``rows``, in parallel chunks."""
    nrows = rows.shape[0]
    chunks = min(nrows, _EVALUATE_CHUNKS)
    for c in prange(chunks):
        _visit_range(
            rows, c * nrows // chunks, (c + 1) * nrows // chunks, seg, nf, pool, a, E, G, X,
            xnorm, parts, eta_s, b, R, cert, scatter, gram_cost, anchor_drift, res_drift, full,
            ahead, P, per_p, fbuf, f_j, f_v, f_on, nflips, nevals, again,
        )  # fmt: skip


@njit(cache=True)
def visit_few(
    rows, seg, nf, pool, a, E, G, X, xnorm, parts, eta_s, b, R, cert, scatter, gram_cost,
    anchor_drift, res_drift, full, ahead, P, per_p, fbuf, f_j, f_v, f_on, nflips, nevals, again,
):  # fmt: skip
    """:func:`visit_rows` on the calling thread, for a few rows (the same results)."""
    _visit_range(
        rows, 0, rows.shape[0], seg, nf, pool, a, E, G, X, xnorm, parts, eta_s, b, R, cert,
        scatter, gram_cost, anchor_drift, res_drift, full, ahead, P, per_p, fbuf, f_j, f_v, f_on,
        nflips, nevals, again,
    )  # fmt: skip


def _norm(v: np.ndarray) -> float:
    return float(np.sqrt(np.einsum("ik,ik->", v, v)))


def lookahead(after: float, before: float) -> float:
    """How far, in steps like the last, a neuron is still expected to move: ``ρ/(1 - ρ)``
    with ``ρ = after/before`` the contraction of the error norm by this step (before its
    flips), or 0 when ``ρ`` exceeds :data:`~corrtree._config.LOOKAHEAD_CONTRACTION`.

    On isotropic data with ``lr = 1/λ_max`` the error shrinks 3-5 times a step, so a
    neuron's first step is most of its whole path (W4: the first step takes 0.8 of the
    band, the whole path 1.3): a visit that finds its step, plus what is still to come,
    beyond its band re-anchors it at once, without computing the values the
    re-anchoring recomputes, and the fresh anchor then holds to the end instead of being
    replaced one step later.  Only the time of a re-anchoring changes, not the result.
    """
    if not before > 0 or not after < _config.LOOKAHEAD_CONTRACTION * before:
        return 0.0
    rho = after / before
    return rho / (1.0 - rho)


class KernelTrainer(BandTrainer):
    """Exact GD whose per-iteration cost grows with neither ``m`` nor ``d`` (module docs;
    options: :class:`~.band.BandTrainer`)."""

    name = "kernel"
    SCHEMA = Schema(
        7,
        (
            *BAND_FIELDS,
            Field("H", ("f8",), ("nK", "nK")),
            Field("heap_keys", ("f8",), ("heap",)),
            Field("heap_ids", ("i8",), ("heap",), index="m"),
            Field("anchor_drift", ("f8",), ("m",)),
            Field("res_drift", ("f8",), ("m",), finite=False),
            Field("clock", ("f8",), ("m",), finite=False),
        ),
        (*BAND_SCALARS, Scalar("P", float, 0.0)),
    )

    def _prepare(self, W0: np.ndarray, **options: Any) -> None:
        n, K = self.X.shape[0], self.a.shape[1]
        if not _config.ntk_fits(n, K):
            raise MemoryError(
                f"method='kernel' needs {_config.ntk_bytes(n, K) / 2**30:.2f} "
                f"GiB for the {n * K}×{n * K} NTK matrix; use method='lazy'"
            )
        super()._prepare(W0, **options)
        self.H = ntk_matrix(*self.store.firing_csr(), self.G, self.a, self.width)
        self._scratch: np.ndarray | None = None  # apply_flips_by_rows's, made when first used
        self._by_rows: bool | None = None  # whether it may be used (_rows_fit)
        self._set_parts()
        self.P = 0.0
        self.anchor_drift = np.zeros(self.m)  # D_r - anchor_drift[r] bounds the distance
        self.res_drift = np.zeros(self.m)  # bounds its residual part (principal_parts)
        self.clock = np.zeros(self.m)  # own clocks: the drift each neuron may have reached
        self._consistent = True  # every ever-fired value is of the neuron's last visit
        self._count()

    def _set_parts(self) -> None:
        """:func:`principal_parts` of the data; whether own clocks may be used (on data
        with leading directions, :meth:`_choose_clock`), and they are to start with."""
        self._parts = principal_parts(
            self.X, self.G, _config.PROJECTION_RANK, _config.PROJECTION_GAIN
        )
        self._coherent = self._own = self._parts[0].shape[1] > 0
        self._due = np.zeros(self.m, dtype=np.bool_)

    def _choose_clock(self, popped: np.ndarray) -> None:
        """Keep the clock whose iterations cost less: a neuron's own (:func:`own_clocks`,
        an O(fired pairs) pass) while the visits read a large share of the fired pairs,
        else the global ``P`` with its heap.

        On coherent data nearly every neuron fires on many points whose errors differ
        (W2, image patches: the global clock pops 43 k of 65 k neurons an iteration, the
        own clocks make 24 k due); where few neurons are due (W5 after its first
        iterations), the pass would cost more than the visits.  The visits' share of the
        fired pairs, ``Σ |prefix|`` over ``popped`` against the fired pairs, decides
        (:data:`~corrtree._config.OWN_CLOCK_ENTER`, :data:`~corrtree._config.OWN_CLOCK_LEAVE`).
        Leaving pushes every neuron with its key (a global-clock key stays valid: ``P``
        advances in both); entering makes every neuron due once (its own clock starts
        at infinity).  Neither changes what is found, only which neurons are visited.
        """
        if not self._coherent:
            return
        work = int(self.store.seg[popped, SUPP].sum())
        if self._own and work < _config.OWN_CLOCK_LEAVE * self.fired:
            self._fill_heap()
            self._own = False
        elif not self._own and work >= _config.OWN_CLOCK_ENTER * self.fired:
            self.clock.fill(np.inf)
            self.heap_size = 0
            self._own = True

    def _count(self) -> None:
        st = self.store
        self.fired = st.fired_pairs()
        self.moved = st.moved_neurons()
        self.entries = st.entries()

    @property
    def per_p(self) -> float:
        """The drift of a neuron grows at most ``per_p·σ_r`` per unit of ``P``."""
        return self.eta_s * math.sqrt(self.a.shape[1]) * self.cert * _config.ROUND_UP

    def _anchor_keys(self, rows: np.ndarray) -> None:
        """:func:`anchor_keys` of freshly anchored ``rows`` at the current ``P``."""
        st = self.store
        anchor_keys(
            rows,
            st.seg,
            st.nf,
            st.pool.arrays,
            self.G,
            st.xnorm,
            self.X.shape[1],
            _config.scatter_cost(st.n),
            st.b,
            st.R,
            self.P,
            self.per_p,
            self.anchor_drift,
            self.res_drift,
        )

    def _start(self) -> None:
        """Every neuron gets its first key, once the learning rate sets the drift rate
        (its clock, with own clocks: the heap stays empty)."""
        st = self.store
        every = np.arange(self.m)
        self._anchor_keys(every)
        self.clock[:] = st.nf[:, DRIFT]
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_size = 0
        if not self._own:
            self._fill_heap()

    def _fill_heap(self) -> None:
        """Every neuron into the heap with its key: O(m log m)."""
        every = np.arange(self.m)
        self.heap_size = push_all(self.heap_keys, self.heap_ids, 0, every, self.store.nf)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, scalars = super().state()
        size = self.heap_size
        arrays.update(
            H=self.H,
            heap_keys=self.heap_keys[:size],
            heap_ids=self.heap_ids[:size],
            anchor_drift=self.anchor_drift,
            res_drift=self.res_drift,
            clock=self.clock,
        )
        return arrays, {**scalars, "P": self.P}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        keys, ids = arrays["heap_keys"], arrays["heap_ids"]
        if ids.shape[0] > self.m or np.unique(ids).shape[0] != ids.shape[0]:
            fail("heap_ids", "must hold distinct neurons")
        parent = (np.arange(1, ids.shape[0]) - 1) // 2
        if (keys[parent] > keys[1:]).any():
            fail("heap_keys", "not a heap")
        for name in ("res_drift", "clock"):
            if not (arrays[name] >= 0).all():
                fail(name, "must be >= 0")
        super()._restore(W0, arrays, scalars, sizes)
        self.H = arrays["H"]
        self._scratch = None
        self._by_rows = None
        self.P = scalars["P"]
        self.anchor_drift = arrays["anchor_drift"]
        self.res_drift = arrays["res_drift"]
        self.clock = arrays["clock"]
        self._set_parts()
        self._own = self._coherent and not ids.shape[0]  # the heap is empty under own clocks
        if not self._coherent and ids.shape[0] != self.m:
            fail("heap_ids", "must hold every neuron: this data takes the global clock")
        self._consistent = False
        self.heap_size = ids.shape[0]
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_keys[: self.heap_size] = keys
        self.heap_ids[: self.heap_size] = ids
        self._count()

    def ntk(self) -> np.ndarray:
        return self.H

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        if step is not None:  # the recurrence needs Δc = η·f·a·err: see the module docs
            if not self._consistent:  # the linear step reads every ever-fired value
                every = np.arange(self.m)
                again, flips = self._visit(every, full=True, ahead=0.0)
                self._apply(flips)
                if again.any():
                    self._apply(self._reanchor(every[again]))
                    self._anchor_keys(every[again])
                self._consistent = True
            # its evaluations do not add to the residual drifts: no screen from now on;
            # and every neuron is due at the next step of the recurrence
            self.res_drift.fill(np.inf)
            self.clock.fill(np.inf)
            return self._advance_linear(err, step)
        st = self.store
        stats = (self.fired, self.moved, self.flips, self.entries)
        with self.timer("forward"):
            before = _norm(self.u - self.Y)
            self.u -= self.lr * (self.H @ err.ravel()).reshape(self.u.shape)
            st.E += err
            self.P += _norm(err) * _config.ROUND_UP
            # a shard's u is its share of the outputs: no contraction to read from it
            ahead = lookahead(_norm(self.u - self.Y), before) if self.width == self.m else 0.0
        with self.timer("query"):
            if self._own:
                own_clocks(
                    st.seg, st.nf, st.pool.arrays, self.a, err, st.xnorm, self.eta_s,
                    self.cert, st.R, self.anchor_drift, self.clock, self._due,
                )  # fmt: skip
                popped = np.flatnonzero(self._due)
            else:
                popped, self.heap_size = pop_due(
                    self.heap_keys, self.heap_ids, self.heap_size, self.P
                )
            self._consistent = False
            again, flips = self._visit(popped, full=False, ahead=ahead)
        with self.timer("update"):
            self.flips = self._apply(flips)
            rows = popped[again]
            if rows.shape[0]:
                before = int(st.seg[rows, CNT].sum())
                self.flips += self._apply(self._reanchor(rows))
                self._anchor_keys(rows)
                self.entries += int(st.seg[rows, CNT].sum()) - before
            if self._own:
                self.clock[popped] = st.nf[popped, DRIFT]
            else:
                self.heap_size = push_all(
                    self.heap_keys, self.heap_ids, self.heap_size, popped, st.nf
                )
            self._choose_clock(popped)
        row = self._row(*stats, reanchored=rows.shape[0], evaluated_pairs=self.evaluated)
        self.evaluated = 0
        return row

    def _visit(
        self, rows: np.ndarray, full: bool, ahead: float
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """:func:`visit_rows` on ``rows`` (``full``: every ever-fired value; ``ahead``: see
        :func:`lookahead`); returns the mask of the rows to re-anchor and the flips as
        ``(r, j, value, on)`` arrays."""
        st = self.store
        args = (*self._store_args(), self.G, self.X, st.xnorm, self._parts, self.eta_s, self.b)
        args += (st.R, self.cert, _config.scatter_cost(st.n), _config.GRAM_ROW_COST)
        args += (self.anchor_drift, self.res_drift, full, ahead, self.P, self.per_p)
        few = rows.shape[0] < _config.SERIAL_WORK  # waking the other threads costs more
        _, again, flips = self._in_groups(rows, True, visit_few if few else visit_rows, args)
        return again, flips

    def _rows_fit(self) -> bool:
        """Whether :func:`apply_flips_by_rows` may be used: its scratch matrix within
        :data:`~corrtree._config.FLIP_SCRATCH_BYTES` and ``G`` symmetric to the bit."""
        if self._by_rows is None:
            self._by_rows = self.H.nbytes <= _config.FLIP_SCRATCH_BYTES and bool(
                np.array_equal(self.G, self.G.T)
            )
        return self._by_rows

    def _apply(self, flips: tuple[np.ndarray, ...]) -> int:
        """Add flips (already applied to the pool) to ``u`` and ``H`` and to the counts;
        returns their number.

        Each flip rewrites ``|S_r|·K²`` entries of a row and as many of a column of
        ``H``.  Of three ways, the one of least modelled cost (in sequential additions):
        those writes in place (:func:`apply_flips`, a cache miss each at
        :data:`~corrtree._config.FLIP_WRITE_COST`); the row writes into a scratch
        matrix, then ``H`` tile by tile (:func:`apply_flips_by_rows`, while the scratch
        fits :data:`~corrtree._config.FLIP_SCRATCH_BYTES`); or ``H`` built anew from
        the fire sets (:func:`~._ntk.ntk_matrix`, ``Σ_r |S_r|²·K²`` additions, as in the
        first steps of coherent data).  The same matrix up to rounding.
        """
        fr, fj, fv, fon = flips
        if not fr.shape[0]:
            return 0
        st = self.store
        K = self.a.shape[1]
        size = self.H.shape[0]
        writes = float(st.seg[fr, NFIRE].sum()) * K * K
        costs = {
            "scattered": _config.FLIP_WRITE_COST * writes,
            "anew": _new_h_cost(st.seg, K * K) + size**2,
        }
        if fr.shape[0] >= _config.SERIAL_WORK and self._rows_fit():
            points = np.unique(fj)
            costs["rows"] = flips_by_rows_cost(writes, points.shape[0], size, K)
        way = min(costs, key=costs.__getitem__)
        if way == "anew":
            self.H = ntk_matrix(*st.firing_csr(), self.G, self.a, self.width)
            flip_outputs(fr, fj, fv, fon, self.u, self.a, self.b, self.scale)
            self.fired = st.fired_pairs()
            self.moved = st.moved_neurons()
            return int(fr.shape[0])
        args = (self.a, self.G, self.b, self.scale, float(self.width))
        pool = st.pool.arrays
        if way == "rows":
            if self._scratch is None:
                self._scratch = np.zeros_like(self.H)
            d_fired, d_moved = apply_flips_by_rows(
                fr, fj, fv, fon, st.seg, pool, self.u, self.H, self._scratch, *args, points
            )
        else:
            d_fired, d_moved = apply_flips(fr, fj, fv, fon, st.seg, pool, self.u, self.H, *args)
        self.fired += d_fired
        self.moved += d_moved
        return int(fr.shape[0])
