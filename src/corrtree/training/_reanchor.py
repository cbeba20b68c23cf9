"""Re-anchoring: a neuron whose certificate expired gets an exact row at the current
time, scanned for a new band of entries (``docs/design.md``, "Anchors and
bands").  Cost per neuron: O(n·|prefix|) for the Gram identity from a float64
anchored row, or O(d·|prefix|) for ``w_r(t)`` and O(nd) in a GEMM for its row,
whichever is cheaper (:data:`~corrtree._config.REANCHOR_GEMM_GAIN`), plus O(n)
for the scans.  Without float64 anchored rows the row comes from a float32
GEMM, as at set-up: the pool's values (ever-fired pairs and the band, widened
by the GEMM's error bound) are then float64 dot products, O(d) each.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from .._threads import full_blas
from ._anchors import (
    BandState,
    count_candidates,
    dot_chunk,
    float32_error,
    pair_dots,
    query_threshold,
    report_above,
)
from ._pairs import coef, dot_row, flip
from ._pool import BETA, CAP, CNT, LEAF_ERR, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP

__all__ = ["reanchor"]

_CHUNKS = _config.EVALUATE_CHUNKS
_REBUILD_ROWS = _config.REBUILD_ROWS


def reanchor(
    st: BandState, rows: np.ndarray, eta_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Re-anchor neurons ``rows`` of ``st`` at the current time.

    Their rows are recomputed exactly (Gram identity from the float64
    anchored rows, or a GEMM from ``w_r(t)``: in float32 when no rows are
    stored, with float64 values where the pool reads them), stored if
    anchored rows are kept, and their entries become the ever-fired pairs
    plus the band around ``b``.  A pair outside the band may have crossed ``b`` once the
    certificate expired: such flips are applied and returned as
    ``(r, j, value, on)`` arrays for the caller's bookkeeping.
    """
    out: list[list[np.ndarray]] = [[] for _ in range(4)]
    chunk = _config.block_rows(8 * st.n, rows.shape[0], _config.REANCHOR_BLOCK_BYTES)
    pool = st.pool.arrays
    for s in range(0, rows.shape[0], chunk):
        part = rows[s : s + chunk]
        exact = st.buffer("exact_rows", (part.shape[0], st.n))
        leaf_err = np.zeros(part.shape[0])
        leaves = exact  # the rows the entries are chosen from
        if st.V is None:  # rows from w_r(t), none being stored
            w = st.weights_of(part, eta_s, st.buffer("weights", (part.shape[0], st.X.shape[1])))
            w32 = st.buffer("weights32", w.shape, np.float32)
            err32 = float32_error(w, st.R, w32)
            # |products| <= ||w_r||·R: far from float32's overflow (a diverging run is not)
            if (err32 < _config.FLOAT32_SAFE_ERROR).all():  # exact values come below
                leaves = st.buffer("leaves", (part.shape[0], st.n), np.float32)
                with full_blas(2.0 * leaves.size * w32.shape[1]):
                    np.matmul(w32, st.X32.T, out=leaves)
                leaf_err = err32
            else:
                with full_blas(2.0 * exact.size * w.shape[1]):
                    np.matmul(w, st.X.T, out=exact)
        else:
            _exact_rows(st, part, eta_s, exact)
            st.V[part] = exact
        st.nf[part, LEAF_ERR] = leaf_err
        st.nf[part, SIGMA] = SIGMA_UNKNOWN  # the fire set is rebuilt
        st.nf[part, BETA] = st.intended_widths(part)  # a dropped band (β = 0) widens again
        tau = st.b - st.nf[part, BETA]  # each neuron keeps its band half-width
        counts = count_candidates(leaves, tau, leaf_err)
        if leaves is not exact:
            args = (tau, leaf_err, counts, st.seg, pool, dot_chunk(part.shape[0]))
            exact_where_read(part, w, st.X, exact, leaves, *args)
        need = counts + ever_not_in_band(part, exact, st.seg, pool, tau)
        old = st.seg[part].copy()
        grow = need > old[:, CAP]
        if grow.any():
            st.pool.place(st.seg, part[grow], need[grow])
            pool = st.pool.arrays
        flips = rebuild_entries(
            part,
            old,
            exact,
            leaves,
            tau,
            leaf_err,
            st.seg,
            pool,
            st.a,
            st.E,
            eta_s,
            st.b,
        )
        for acc, arr in zip(out, flips, strict=True):
            acc.append(arr)
    r, j, value, on = (np.concatenate(acc) for acc in out)
    return r, j, value, on


def _exact_rows(st: BandState, part: np.ndarray, eta_s: float, exact: np.ndarray) -> None:
    """``exact[k]`` = the float64 row of ``part[k]`` now, float64 anchored rows: the
    Gram identity from its anchored row where that is exact (not from a float32
    GEMM) and cheaper, else a float64 GEMM from ``w_r(t)``."""
    from_anchor = (st.nf[part, LEAF_ERR] == 0.0) & (
        st.seg[part, SUPP] * _config.REANCHOR_GEMM_GAIN < 2 * st.X.shape[1]
    )
    if from_anchor.any():
        known = st.V[part[from_anchor]]  # float64 here; indexing copies
        gram_rows(part[from_anchor], known, st.seg, st.pool.arrays, st.a, st.E, eta_s, st.G)
        exact[from_anchor] = known
    if not from_anchor.all():
        w = st.weights_of(part[~from_anchor], eta_s)
        with full_blas(2.0 * w.size * st.n):
            exact[~from_anchor] = w @ st.X.T


@njit(cache=True, parallel=True)
def gram_rows(rows, out, seg, pool, a, E, eta_s, G):
    """Exact current rows by the Gram identity, in place: ``out[k]`` holds the
    anchored row of ``rows[k]``; subtract ``Σ_l (C_l - cref_l) G[l]``."""
    ej, cref, kappa, fire = pool.j, pool.cref, pool.kappa, pool.fire
    n = out.shape[1]
    for k in prange(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        for p in range(seg[r, SUPP]):
            q = s0 + p
            c = coef(q, r, kappa, fire, ej, a, E, eta_s) - cref[q]
            if c != 0.0:
                g = ej[q]
                for j in range(n):
                    out[k, j] -= c * G[g, j]


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def exact_where_read(rows, w, X, exact, leaves, tau, leaf_err, counts, seg, pool, step):
    """``exact[k, j] = <w_k, x_j>`` in float64 where the pool will read it: at the
    ever-fired pairs of ``r = rows[k]`` and where ``leaves[k]`` reaches ``tau[k]``
    (widened by ``leaf_err[k]``); the rest of ``exact`` is never read.  O(d) a
    value, ``step`` rows at a time (:func:`~._anchors.pair_dots`, :func:`~._anchors.dot_chunk`);
    ``counts[k]``: the products of ``leaves[k]`` at or above that threshold
    (:func:`~._anchors.count_candidates`), which size the lists of pairs."""
    ej = pool.j
    n = X.shape[0]
    nr = rows.shape[0]
    for c in prange((nr + step - 1) // step):
        lo, hi = c * step, min((c + 1) * step, nr)
        room = n  # the last row's scan writes up to n places past its kept points
        for k in range(lo, hi):
            room += counts[k] + seg[rows[k], SUPP]
        xj = np.empty(room, dtype=np.int64)
        wi = np.empty(room, dtype=np.int64)
        p = 0
        for k in range(lo, hi):
            r = rows[k]
            thr = query_threshold(tau[k], leaf_err[k])
            end = report_above(leaves[k], thr, xj, p)
            s0 = seg[r, START]
            for q in range(s0, s0 + seg[r, SUPP]):
                if leaves[k, ej[q]] < thr:  # not reported above
                    xj[end] = ej[q]
                    end += 1
            wi[p:end] = k
            p = end
        xj = xj[:p]
        out = np.empty(p)
        pair_dots(w, wi[:p], X, xj, out)
        for i in range(p):
            exact[wi[i], xj[i]] = out[i]


@njit(cache=True)
def ever_not_in_band(rows, exact, seg, pool, tau):
    """Ever-fired pairs of ``rows[k]`` whose new anchored product is below ``tau[k]``."""
    ej = pool.j
    out = np.zeros(rows.shape[0], dtype=np.int64)
    for k in range(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        for p in range(seg[r, SUPP]):
            if exact[k, ej[s0 + p]] < tau[k]:
                out[k] += 1
    return out


@njit(cache=True)
def _set_entry(pool, pos, j, value, kappa, c, on, vel):
    pool.j[pos] = j
    pool.uref[pos] = value
    pool.val[pos] = value
    pool.key[pos] = 0.0
    pool.kappa[pos] = kappa
    pool.cref[pos] = c
    pool.clast[pos] = c
    pool.fire[pos] = on
    if pool.vel.shape[0]:
        pool.vel[pos] = vel


@njit(cache=True, parallel=True)
def rebuild_entries(rows, old, exact, leaves, tau, leaf_err, seg, pool, a, E, eta_s, b):
    """Re-create the entries of re-anchored neurons from their exact rows.

    The ever-fired pairs stay (with ``cref`` set to their current
    coefficient); the other entries are the points where ``leaves[k]``
    (``exact[k]`` up to ``leaf_err[k]``) reaches the lowered threshold.
    A pair whose exact value disagrees with its firing flag is flipped here.
    Returns the flips as ``(r, j, value, on)`` arrays, in the order of ``rows``
    and, within a neuron, of position.  Neurons are rebuilt in parallel runs
    (at most :data:`~corrtree._config.EVALUATE_CHUNKS`, of at least
    :data:`~corrtree._config.REBUILD_ROWS` neurons): each owns its segments (a grown
    one is fresh), so the result does not depend on the scheduling.
    O(n + |entries|) a neuron.
    """
    n = exact.shape[1]
    nr = rows.shape[0]
    disagree = np.zeros(nr, dtype=np.int64)
    runs = max(1, min(nr // _REBUILD_ROWS, _CHUNKS))  # each run allocates O(n) scratch
    for c in prange(runs):
        mark = np.full(n, -1, dtype=np.int64)
        found = np.empty(n, dtype=np.int64)
        for k in range(c * nr // runs, (c + 1) * nr // runs):
            disagree[k] = _rebuild_one(
                k, rows, old, exact, leaves, tau, leaf_err, seg, pool, a, E, eta_s, b, mark, found
            )
    at = np.zeros(nr + 1, dtype=np.int64)
    for k in range(nr):
        at[k + 1] = at[k] + disagree[k]
    fr = np.empty(at[nr], dtype=np.int64)
    fj = np.empty(at[nr], dtype=np.int64)
    fv = np.empty(at[nr])
    fo = np.empty(at[nr], dtype=np.bool_)
    for k in prange(nr):
        if disagree[k]:
            _flip_disagreeing(rows[k], seg, pool, a, E, eta_s, b, fr, fj, fv, fo, at[k])
    return fr, fj, fv, fo


@njit(cache=True)
def _rebuild_one(
    k, rows, old, exact, leaves, tau, leaf_err, seg, pool, a, E, eta_s, b, mark, found
):
    """The entries of ``rows[k]`` (:func:`rebuild_entries`); returns how many of them
    disagree with their firing flag.  ``mark`` and ``found`` are scratch of ``n``."""
    r = rows[k]
    o_start, ns = old[k, START], old[k, SUPP]
    # copy the ever-fired pairs out first: the segment may be the same
    keep_j = pool.j[o_start : o_start + ns].copy()
    keep_kappa = pool.kappa[o_start : o_start + ns].copy()
    keep_fire = pool.fire[o_start : o_start + ns].copy()
    keep_vel = pool.vel[o_start : o_start + ns].copy() if pool.vel.shape[0] else np.zeros(ns)
    s0 = seg[r, START]
    pos = s0
    nfire = 0
    for p in range(ns):
        j = keep_j[p]
        c = keep_kappa[p]
        if keep_fire[p]:
            c += eta_s * dot_row(a, r, E, j)
        _set_entry(pool, pos, j, exact[k, j], keep_kappa[p], c, keep_fire[p], keep_vel[p])
        nfire += keep_fire[p]
        mark[j] = r
        pos += 1
    thr = query_threshold(tau[k], leaf_err[k])
    cnt = report_above(leaves[k], thr, found, 0)
    for f in range(cnt):
        j = found[f]
        if mark[j] == r:
            continue
        _set_entry(pool, pos, j, exact[k, j], 0.0, 0.0, False, 0.0)
        pos += 1
    seg[r, CNT] = pos - s0
    seg[r, SUPP] = ns
    seg[r, NFIRE] = nfire
    wrong = 0
    for q in range(s0, pos):
        wrong += (pool.val[q] >= b) != pool.fire[q]
    return wrong


@njit(cache=True)
def _flip_disagreeing(r, seg, pool, a, E, eta_s, b, fr, fj, fv, fo, at):
    """Flip the entries of ``r`` whose exact value disagrees with their flag (pairs
    that crossed ``b`` unseen), recording them from ``at`` on.  In increasing
    position order, so that the swaps of :func:`~._pairs.flip` never move a pair
    still to visit."""
    s0 = seg[r, START]
    for q in range(s0, s0 + seg[r, CNT]):
        now = pool.val[q] >= b
        if now != pool.fire[q]:
            fr[at], fj[at], fv[at], fo[at] = r, pool.j[q], pool.val[q], now
            flip(r, q, seg, pool, a, E, eta_s, now)
            at += 1
