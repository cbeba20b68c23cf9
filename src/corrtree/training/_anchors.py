"""State of the band trainers and its preprocessing: anchored rows in max trees,
the entries chosen from them, and the cumulative error of the implicit weights.

Anchors (``docs/design.md``, "Anchors and bands")
    Each neuron ``r`` has an anchor time ``t_a``: its products at ``t_a`` (the
    *anchored row*) are the leaves of tree ``r`` of a WTree-like store (m max
    trees of n leaves, float64, or float32 to save memory).  Its entries are
    every ``j`` with an anchored product ``>= b - β_r`` (a tree query at that
    lowered threshold) plus every pair that ever fired.

Certificate
    ``|U[r, j](t) - U[r, j](t')| <= ||w_r(t) - w_r(t')|| · ||x_j||``: a pair
    that is not an entry cannot fire while the drift since the anchor stays
    below ``β_r / R`` (``R = max_j ||x_j||``); past that the neuron is
    re-anchored (:mod:`._reanchor`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import _config, _maxtree
from ._pairs import firing_csr, materialize
from ._pool import BETA, CAP, CNT, LEAF_ERR, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP, Pool

__all__ = ["BandState", "count_candidates", "float32_error", "pair_dots", "query_threshold"]

_FLOAT32_MARGIN = _config.FLOAT32_QUERY_MARGIN
_DOT_ROWS = _config.DOT_ROWS


@njit(cache=True)
def query_threshold(tau, err):
    """Tree threshold catching every anchored product ``>= tau`` when leaves err by
    ``err`` (widened by :data:`~corrtree._config.FLOAT32_QUERY_MARGIN`)."""
    t = tau - err
    return t - _FLOAT32_MARGIN * abs(t) - 1e-300


def float32_error(W: np.ndarray, R: float) -> np.ndarray:
    """Bound on the error of each row of a float32 GEMM ``W·Xᵀ`` (``W`` and ``X``
    rounded to float32 first): ``γ_{d+2}·||w_r||·R`` with a safety factor
    (:data:`~corrtree._config.GEMM32_SAFETY`), ``R = max_j ||x_j||``."""
    d = W.shape[1]
    gamma = (d + 2) * _config.U32 / (1.0 - (d + 2) * _config.U32)
    return _config.GEMM32_SAFETY * gamma * np.sqrt(np.einsum("ij,ij->i", W, W)) * R


@njit(cache=True, parallel=True)
def count_candidates(V, inner, off, rows, tau, leaf_err):
    """Number of leaves of tree ``rows[k]`` at or above the query threshold."""
    dummy = np.empty((0, 1), dtype=np.int64)
    out = np.empty(rows.shape[0], dtype=np.int64)
    for k in prange(rows.shape[0]):
        r = rows[k]
        thr = query_threshold(tau[k], leaf_err[r])
        out[k] = _maxtree.report_row(V[r], inner[r], off, thr, dummy, 0, 0, r)
    return out


@njit(cache=True, parallel=True)
def fill_new_anchors(V, inner, off, rows, tau, leaf_err, exact, seg, pool, b):
    """Write the entries of freshly anchored neurons ``rows`` (no ever-fired pairs yet).

    ``exact[k]`` is the anchored row of ``rows[k]``; segments must already be
    placed with enough capacity.  Firing pairs come first: they form the
    ever-fired prefix.
    """
    # numba does not write through a namedtuple's fields inside prange: bind them first
    ej, uref, val, key, kappa, cref, fire, clast, vel = pool
    for k in prange(rows.shape[0]):
        r = rows[k]
        thr = query_threshold(tau[k], leaf_err[r])
        s0 = seg[r, START]
        found = np.empty((seg[r, CAP], 1), dtype=np.int64)
        cnt = _maxtree.report_row(V[r], inner[r], off, thr, found, 0, found.shape[0], r)
        pos = s0
        for f in range(cnt):
            j = found[f, 0]
            if exact[k, j] >= b:
                ej[pos] = j
                pos += 1
        nfire = pos - s0
        for f in range(cnt):
            j = found[f, 0]
            if exact[k, j] < b:
                ej[pos] = j
                pos += 1
        for q in range(s0, pos):
            v = exact[k, ej[q]]
            uref[q] = v
            val[q] = v
            key[q] = 0.0
            kappa[q] = 0.0
            cref[q] = 0.0
            clast[q] = 0.0
            if vel.shape[0]:
                vel[q] = 0.0
            fire[q] = v >= b
        seg[r, CNT] = cnt
        seg[r, SUPP] = nfire
        seg[r, NFIRE] = nfire


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def pair_dots(W, wi, X, xj, out):
    """``out[p] = <W[wi[p]], X[xj[p]]>`` in float64, the pairs taken point by point
    (a counting sort on ``xj``), so each row of ``X`` is read once and the few rows
    of ``W`` stay in cache.  O(p·d + n).  Reassociated (vectorized) sums: float64
    accuracy like any GEMM's."""
    n, d = X.shape
    start = np.zeros(n + 1, dtype=np.int64)
    for p in range(xj.shape[0]):
        start[xj[p] + 1] += 1
    for j in range(n):
        start[j + 1] += start[j]
    order = np.empty(xj.shape[0], dtype=np.int64)
    for p in range(xj.shape[0]):
        order[start[xj[p]]] = p
        start[xj[p]] += 1
    for o in range(order.shape[0]):
        p = order[o]
        r = wi[p]
        j = xj[p]
        s = 0.0
        for c in range(d):
            s += W[r, c] * X[j, c]
        out[p] = s


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def exact_entries_from_w(W, X, rows, seg, pool):
    """Recompute ``uref`` and ``val`` of the entries of ``rows`` as float64 dot products,
    :data:`~corrtree._config.DOT_ROWS` neurons at a time (:func:`pair_dots`)."""
    ej, uref, val = pool.j, pool.uref, pool.val
    nr = rows.shape[0]
    for c in prange((nr + _DOT_ROWS - 1) // _DOT_ROWS):
        lo, hi = c * _DOT_ROWS, min((c + 1) * _DOT_ROWS, nr)
        total = 0
        for k in range(lo, hi):
            total += seg[rows[k], CNT]
        wi = np.empty(total, dtype=np.int64)
        qs = np.empty(total, dtype=np.int64)
        p = 0
        for k in range(lo, hi):
            s0 = seg[rows[k], START]
            for q in range(s0, s0 + seg[rows[k], CNT]):
                wi[p] = rows[k]
                qs[p] = q
                p += 1
        out = np.empty(total)
        pair_dots(W, wi, X, ej[qs], out)
        for p in range(total):
            uref[qs[p]] = out[p]
            val[qs[p]] = out[p]


@njit(cache=True, parallel=True)
def reorder_after_exact(rows, seg, pool, b):
    """After exact values changed, put firing entries first and set the flags."""
    ej, uref, val, fire = pool.j, pool.uref, pool.val, pool.fire
    for k in prange(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        cnt = seg[r, CNT]
        head = s0
        for q in range(s0, s0 + cnt):
            if uref[q] >= b:
                if q != head:
                    ej[q], ej[head] = ej[head], ej[q]
                    uref[q], uref[head] = uref[head], uref[q]
                    val[q], val[head] = val[head], val[q]
                head += 1
        nfire = head - s0
        for q in range(s0, s0 + cnt):
            fire[q] = q < head
        seg[r, SUPP] = nfire
        seg[r, NFIRE] = nfire


class BandState:
    """Anchored products (tree store), entries and implicit weights of one run.

    Parameters
    ----------
    W0 : ndarray (m, d)
        Initial weights, read only: ``W(t) = W0 - C X`` (:meth:`weights`).
    X : ndarray (n, d)
    G : ndarray (n, n)
        ``X Xᵀ``.
    a : ndarray (m, K)
    b : float
    band : float
        Half-width ``β`` of the band of tracked products around ``b`` at an anchor.
    anchor_dtype : {"float64", "float32"}
        Storage of the anchored rows.  float32 halves the largest array; the
        rounding is covered by the query threshold.
    gemm_dtype : {"float64", "float32"}
        Precision of the initial GEMM.  With float32 every product within the
        float32 error bound ``γ_{d+2}·||w_r||·||x_j||`` of the band is
        recomputed in float64, so the entries are as exact as with float64.

    Notes
    -----
    Preprocessing: one GEMM (O(nmd), in blocks of
    :data:`~corrtree._config.ANCHOR_BLOCK_BYTES`), the trees (O(nm)) and the
    band queries (O(entries)).  Memory: ``n·m`` anchored products (4 or 8
    bytes), ~1/15 of that for the tree levels, ~61 bytes per entry.
    """

    def __init__(self, W0, X, G, a, b, band, anchor_dtype="float64", gemm_dtype="float64"):
        m, n = W0.shape[0], X.shape[0]
        self._bind(W0, X, G, a, b, band)
        self.E = np.zeros((n, self.K))  # cumulative error Σ_{τ<t} err(τ)
        self.V = np.empty((m, n), dtype=np.dtype(anchor_dtype))
        self.inner = np.empty((m, int(self.off[-1])), dtype=self.V.dtype)
        self.seg = np.zeros((m, 5), dtype=np.int64)
        self.nf = np.zeros((m, 6))
        self.nf[:, BETA] = self.band
        self.nf[:, SIGMA] = SIGMA_UNKNOWN  # computed where a bound first needs it
        self.pool = Pool(m * _config.POOL_ENTRIES_PER_NEURON)
        self._anchor_all(np.dtype(gemm_dtype) == np.float32)

    def _bind(self, W0, X, G, a, b, band) -> None:
        self.W0, self.X, self.G, self.a, self.b = W0, X, G, a, float(b)
        self.m, self.n, self.K = W0.shape[0], X.shape[0], a.shape[1]
        self.band = float(band)
        self.xnorm = np.sqrt(np.einsum("ij,ij->i", X, X))
        self.R = float(self.xnorm.max())
        self.off = _maxtree.level_offsets(self.n)
        self._x32: np.ndarray | None = None

    @property
    def X32(self) -> np.ndarray:
        """``X`` in float32, for float32 GEMMs (made once)."""
        if self._x32 is None:
            self._x32 = self.X.astype(np.float32)
        return self._x32

    @classmethod
    def from_arrays(cls, W0, X, G, a, b, band, V, seg, nf, pool, used, E) -> BandState:
        """The state of a run in progress (from a checkpoint, already checked): the tree
        levels are rebuilt from the anchored rows ``V`` (exact: they are maxima)."""
        st = cls.__new__(cls)
        st._bind(W0, X, G, a, b, band)
        st.V, st.seg, st.nf, st.E = V, seg, nf, E
        st.inner = np.empty((st.m, int(st.off[-1])), dtype=V.dtype)
        _maxtree.build(st.V, st.inner, st.off)
        st.pool = Pool.from_arrays(pool, used)
        return st

    @property
    def anchor_dtype(self) -> np.dtype:
        return self.V.dtype

    def _anchor_all(self, gemm32: bool) -> None:
        """Anchor every neuron at ``t = 0``, one GEMM block at a time."""
        W0, X, m = self.W0, self.X, self.m
        d = X.shape[1]
        if gemm32:
            X32 = self.X32
            self.nf[:, LEAF_ERR] = float32_error(W0, self.R)
            w32 = np.empty((min(self._block(), m), d), dtype=np.float32)
        tau_all = np.full(m, self.b - self.band)
        for s in range(0, m, self._block()):
            e = min(s + self._block(), m)
            rows = np.arange(s, e, dtype=np.int64)
            if gemm32:
                np.copyto(w32[: e - s], W0[s:e], casting="same_kind")
                A, B = w32[: e - s], X32
            else:
                A, B = W0[s:e], X
            if A.dtype == self.anchor_dtype:  # the GEMM writes the rows in place
                U = np.matmul(A, B.T, out=self.V[s:e])
            else:
                U = A @ B.T
                self.V[s:e] = U
            _maxtree.build(self.V[s:e], self.inner[s:e], self.off)
            counts = count_candidates(
                self.V, self.inner, self.off, rows, tau_all[rows], self.nf[:, LEAF_ERR]
            )
            if s == 0:  # size the pool from the first block, with a margin
                per = (counts.sum() + _config.SEGMENT_SLACK_ADD * rows.shape[0]) / rows.shape[0]
                self.pool.reserve(int(_config.POOL_FIRST_BLOCK_MARGIN * per * m))
            self.pool.place(self.seg, rows, counts)
            fill_new_anchors(
                self.V,
                self.inner,
                self.off,
                rows,
                tau_all[rows],
                self.nf[:, LEAF_ERR],
                U,
                self.seg,
                self.pool.arrays,
                self.b,
            )
            if gemm32:  # the float32 values only chose the entries: recompute them
                exact_entries_from_w(W0, X, rows, self.seg, self.pool.arrays)
                reorder_after_exact(rows, self.seg, self.pool.arrays, self.b)

    def _block(self) -> int:
        return _config.block_rows(8 * self.n, self.m, _config.ANCHOR_BLOCK_BYTES)

    @property
    def nbytes(self) -> int:
        return self.V.nbytes + self.inner.nbytes + self.pool.nbytes + self.seg.nbytes

    def entries(self) -> int:
        """Number of tracked pairs."""
        return int(self.seg[:, CNT].sum())

    def fired_pairs(self) -> int:
        return int(self.seg[:, NFIRE].sum())

    def moved_neurons(self) -> int:
        return int(np.count_nonzero(self.seg[:, NFIRE]))

    def firing_neurons(self) -> np.ndarray:
        """Sorted neurons that fire on some point (the ones a step moves)."""
        return np.flatnonzero(self.seg[:, NFIRE]).astype(np.int64)

    def firing_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return firing_csr(self.seg, self.pool.arrays, self.n)

    def weights(self, start: int, stop: int, eta_s: float) -> np.ndarray:
        """``W(t)[start:stop] = W0[start:stop] - C X`` as a new array.  O(d·Σ_r |prefix_r|)."""
        return self.weights_of(np.arange(start, stop, dtype=np.int64), eta_s)

    def weights_of(self, rows: np.ndarray, eta_s: float) -> np.ndarray:
        """``W(t)[rows]`` as a new array.  O(d·Σ_{r ∈ rows} |prefix_r|)."""
        out = self.W0[rows]
        materialize(out, rows, self.X, self.seg, self.pool.arrays, self.a, self.E, eta_s)
        return out
