"""State of the band trainers and its preprocessing: anchored rows, the entries
chosen from them, and the cumulative error of the implicit weights.

Anchors (``docs/design.md``, "Anchors and bands")
    Each neuron ``r`` has an anchor time ``t_a``: its products at ``t_a`` (the
    *anchored row*) are computed in GEMM blocks and scanned once, as they are
    made, for its entries: every ``j`` with an anchored product ``>= b - β_r``
    plus every pair that ever fired.  Only float64 storage keeps the rows
    (``V``), for re-anchoring by the Gram identity; float32 rows are scanned
    and dropped, and re-anchoring recomputes them from ``w_r(t)``.

Certificate
    ``|U[r, j](t) - U[r, j](t')| <= ||w_r(t) - w_r(t')|| · ||x_j||``: a pair
    that is not an entry cannot fire while the drift since the anchor stays
    below ``β_r / R`` (``R = max_j ||x_j||``); past that the neuron is
    re-anchored (:mod:`._reanchor`).
"""

from __future__ import annotations

import math
import time

import numpy as np
from numba import get_num_threads, prange

from .. import _config
from .._implicit import StoredWeights
from .._jit import njit
from ._outputs import materialize
from ._pool import BETA, CNT, LEAF_ERR, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP, Pool, zeros
from ._sparse import firing_csr

__all__ = [
    "BandState",
    "count_candidates",
    "dot_chunk",
    "float32_error",
    "pair_dots",
    "query_threshold",
    "report_above",
]

_FLOAT32_MARGIN = _config.FLOAT32_QUERY_MARGIN
_DOT_ROWS = _config.DOT_ROWS
_CHUNKS = _config.EVALUATE_CHUNKS


@njit(cache=True)
def query_threshold(tau, err):
    """Tree threshold catching every anchored product ``>= tau`` when leaves err by
    ``err`` (widened by :data:`~corrtree._config.FLOAT32_QUERY_MARGIN`)."""
    t = tau - err
    return t - _FLOAT32_MARGIN * abs(t) - 1e-300


def float32_error(W: np.ndarray, R: float, out: np.ndarray) -> np.ndarray:
    """Copy ``W`` to the float32 array ``out`` and return a bound on the error of each
    row of the float32 GEMM ``out·Xᵀ`` (``X`` rounded to float32 too):
    ``γ_{d+2}·||w_r||·R`` with a safety factor
    (:data:`~corrtree._config.GEMM32_SAFETY`), ``R = max_j ||x_j||``.  One pass
    over ``W``, O(d) a row."""
    d = W.shape[1]
    gamma = (d + 2) * _config.U32 / (1.0 - (d + 2) * _config.U32)
    sq = np.empty(W.shape[0])
    _to_float32(W, out, sq)
    return _config.GEMM32_SAFETY * gamma * np.sqrt(sq) * R


@njit(cache=True, parallel=True)
def _to_float32(W, out, sq):
    """``out = W`` rounded to float32, ``sq[k] = ||W[k]||²``."""
    for k in prange(W.shape[0]):
        s = 0.0
        for i in range(W.shape[1]):
            v = W[k, i]
            out[k, i] = v
            s += v * v
        sq[k] = s


@njit(cache=True, inline="always")
def report_above(row, thr, out, pos):
    """Write every ``j`` with ``row[j] >= thr`` to ``out[pos:]``, in increasing order;
    returns the position after the last.  O(n), streaming (the row was just made).

    Without branches, as :func:`fill_new_anchors` scans: each ``j`` is written and kept
    if it passes, so ``out`` must have room for ``pos + n`` entries (a row's kept points
    and its other tracked points fit in ``n``, which every caller's buffer allows).  A
    re-anchored row of W4 keeps about 250 of 4096 points, at places no branch predictor
    learns: the scan took 2.6 µs a row with a test per point and 1.0-1.5 µs without
    (two threads, 2-core AMD EPYC)."""
    for j in range(row.shape[0]):
        out[pos] = j
        pos += row[j] >= thr
    return pos


@njit(cache=True, parallel=True)
def count_candidates(U, tau, leaf_err):
    """Number of products of row ``U[k]`` at or above its query threshold
    (:func:`query_threshold` of ``tau[k]`` and ``leaf_err[k]``).  O(n) a row."""
    out = np.empty(U.shape[0], dtype=np.int64)
    for k in prange(U.shape[0]):
        thr = query_threshold(tau[k], leaf_err[k])
        c = 0
        for j in range(U.shape[1]):
            c += U[k, j] >= thr
        out[k] = c
    return out


@njit(cache=True, parallel=True)
def fire_counts(U, b):
    """Number of products of each row ``U[k]`` at or above ``b``.  O(n) a row."""
    out = np.empty(U.shape[0], dtype=np.int64)
    for k in prange(U.shape[0]):
        c = 0
        for j in range(U.shape[1]):
            c += U[k, j] >= b
        out[k] = c
    return out


def band_widths(fires: np.ndarray, band: float, mean_fire: float) -> np.ndarray:
    """Half-width of each fresh anchor's band:
    ``β_r = band·(f_r / mean_fire)^e`` (``e`` = :data:`~corrtree._config.BAND_FIRE_EXPONENT`,
    ``f_r = max(fires[r], 1)``) within ``[band/2, 2·band]``.  A neuron firing on more
    points moves more per step (its step sums more errors): it gets room for that
    instead of a re-anchoring.  Any ``β_r > 0`` is exact; the counts may come from
    float32 rows."""
    w = band * (np.maximum(fires, 1) / mean_fire) ** _config.BAND_FIRE_EXPONENT
    return np.clip(w, 0.5 * band, 2.0 * band)


@njit(cache=True, parallel=True)
def fill_new_anchors(U, rows, tau, leaf_err, seg, pool, b):
    """Write the entries of freshly anchored neurons ``rows`` (no ever-fired pairs yet).

    ``U[k]`` is the anchored row of ``rows[k]``, erring by at most
    ``leaf_err[k]``; segments must already be placed with enough capacity.
    Firing pairs come first: they form the ever-fired prefix.  One pass over a row
    without branches: each ``j`` is written to a firing and a band list and kept in
    the one it belongs to, cheaper than testing each ``j`` when few are kept.
    The rows in at most :data:`~corrtree._config.EVALUATE_CHUNKS` parallel runs, each
    with O(n) scratch.  O(n + |entries|) a neuron.
    """
    # numba does not write through a namedtuple's fields inside prange: bind them first
    ej, uref, val, key, kappa, cref, fire, clast, vel = pool
    n = U.shape[1]
    nr = rows.shape[0]
    runs = min(nr, _CHUNKS)
    for c in prange(runs):
        above = np.empty(n, dtype=ej.dtype)
        band = np.empty(n, dtype=ej.dtype)
        for k in range(c * nr // runs, (c + 1) * nr // runs):
            r = rows[k]
            thr = query_threshold(tau[k], leaf_err[k])  # below b: tau = b - β
            nfire = 0
            nband = 0
            for j in range(n):
                v = U[k, j]
                above[nfire] = j
                band[nband] = j
                up = v >= b
                nfire += up
                nband += (v >= thr) & (not up)
            s0 = seg[r, START]
            mid = s0 + nfire
            end = mid + nband
            ej[s0:mid] = above[:nfire]
            ej[mid:end] = band[:nband]
            for q in range(s0, end):
                v = U[k, ej[q]]
                uref[q] = v
                val[q] = v
                fire[q] = q < mid
            key[s0:end] = 0.0
            kappa[s0:end] = 0.0
            cref[s0:end] = 0.0
            clast[s0:end] = 0.0
            if vel.shape[0]:
                vel[s0:end] = 0.0
            seg[r, CNT] = end - s0
            seg[r, SUPP] = nfire
            seg[r, NFIRE] = nfire


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def pair_dots(W, wi, X, xj, out):
    """``out[p] = <W[wi[p]], X[xj[p]]>`` in float64, the pairs taken point by point
    (a counting sort on ``xj``) and eight (then four) of a point at a time, so each row
    of ``X`` is read once and each read of it serves eight rows of ``W``.  O(p·d + n).
    Reassociated (vectorized) sums: float64 accuracy like any GEMM's."""
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
    lo = 0  # start[j] is now the end of point j's pairs in order
    for j in range(n):
        hi = start[j]
        x = X[j]
        q = lo
        while q + 8 <= hi:
            p0, p1, p2, p3 = order[q], order[q + 1], order[q + 2], order[q + 3]
            p4, p5, p6, p7 = order[q + 4], order[q + 5], order[q + 6], order[q + 7]
            w0, w1, w2, w3 = W[wi[p0]], W[wi[p1]], W[wi[p2]], W[wi[p3]]
            w4, w5, w6, w7 = W[wi[p4]], W[wi[p5]], W[wi[p6]], W[wi[p7]]
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
            for c in range(d):
                xc = x[c]
                s0 += w0[c] * xc
                s1 += w1[c] * xc
                s2 += w2[c] * xc
                s3 += w3[c] * xc
                s4 += w4[c] * xc
                s5 += w5[c] * xc
                s6 += w6[c] * xc
                s7 += w7[c] * xc
            out[p0], out[p1], out[p2], out[p3] = s0, s1, s2, s3
            out[p4], out[p5], out[p6], out[p7] = s4, s5, s6, s7
            q += 8
        while q + 4 <= hi:
            p0, p1, p2, p3 = order[q], order[q + 1], order[q + 2], order[q + 3]
            w0, w1, w2, w3 = W[wi[p0]], W[wi[p1]], W[wi[p2]], W[wi[p3]]
            s0 = s1 = s2 = s3 = 0.0
            for c in range(d):
                xc = x[c]
                s0 += w0[c] * xc
                s1 += w1[c] * xc
                s2 += w2[c] * xc
                s3 += w3[c] * xc
            out[p0], out[p1], out[p2], out[p3] = s0, s1, s2, s3
            q += 4
        while q < hi:
            p = order[q]
            w = W[wi[p]]
            s = 0.0
            for c in range(d):
                s += w[c] * x[c]
            out[p] = s
            q += 1
        lo = hi


def dot_chunk(nr: int) -> int:
    """Rows of :func:`pair_dots` a parallel run takes out of ``nr``:
    :data:`~corrtree._config.DOT_ROWS`, fewer where that would leave a thread idle
    (two runs a thread at least)."""
    return max(1, min(_DOT_ROWS, -(-nr // (2 * get_num_threads()))))


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def exact_entries_from_w(W, X, rows, seg, pool, offset, step, floor):
    """Recompute ``uref`` and ``val`` of the entries of ``rows`` as float64 dot products,
    ``step`` neurons at a time (:func:`pair_dots`; :func:`dot_chunk`); ``W[k]`` holds
    the weights of neuron ``offset + k``.  With ``floor`` of shape ``(len(rows), 2)``
    (not ``(0, 2)``), only the entries of ``rows[k]`` whose ``uref`` lies in
    ``[floor[k, 0], floor[k, 1])``."""
    ej, uref, val = pool.j, pool.uref, pool.val
    nr = rows.shape[0]
    every = floor.shape[0] == 0
    for c in prange((nr + step - 1) // step):
        lo, hi = c * step, min((c + 1) * step, nr)
        total = 0
        for k in range(lo, hi):
            total += seg[rows[k], CNT]
        wi = np.empty(total, dtype=np.int64)
        qs = np.empty(total, dtype=np.int64)
        p = 0
        for k in range(lo, hi):
            s0 = seg[rows[k], START]
            for q in range(s0, s0 + seg[rows[k], CNT]):
                wi[p] = rows[k] - offset
                qs[p] = q
                p += every or (floor[k, 0] <= uref[q] < floor[k, 1])
        total = p
        out = np.empty(total)
        pair_dots(W, wi[:total], X, ej[qs[:total]], out)
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


@njit(cache=True)
def _windows(b, leaf_err, above):
    """``(len(leaf_err), 2)`` windows of float32 values for :func:`exact_entries_from_w`:
    at or above each row's :func:`query_threshold` of ``b`` (``above``: the entries that
    may fire), or below it (those below ``b`` for certain)."""
    out = np.empty((leaf_err.shape[0], 2))
    for k in range(leaf_err.shape[0]):
        thr = query_threshold(b, leaf_err[k])
        out[k, 0], out[k, 1] = (thr, np.inf) if above else (-np.inf, thr)
    return out


class BandState:
    """Anchored products, entries and implicit weights of one run.

    Parameters
    ----------
    W0 : ndarray (m, d) or ImplicitWeights
        Initial weights, read only: ``W(t) = W0 - C X`` (:meth:`weights`); stored or
        regenerated by blocks (:mod:`corrtree._implicit`): the state reads them only
        by :meth:`~corrtree._implicit.ImplicitWeights.rows` and
        :meth:`~corrtree._implicit.ImplicitWeights.take`.
    X : ndarray (n, d)
    G : ndarray (n, n)
        ``X Xᵀ``.
    a : ndarray (m, K)
    b : float
    band : float
        Half-width ``β`` of the band of tracked products around ``b`` at an anchor,
        scaled per neuron by its fire count (:func:`band_widths`; ``nf[:, BETA]``).
    anchor_dtype : {"float64", "float32"}
        Storage of the anchored rows.  float64 keeps them (``V``, m·n·8 bytes)
        for re-anchoring by the Gram identity; float32 keeps none: each row
        is scanned for its entries as its GEMM block is made, and a
        re-anchored row comes from a new float32 GEMM.
    gemm_dtype : {"float64", "float32"}
        Precision of the initial GEMM.  With float32 every product within the
        float32 error bound ``γ_{d+2}·||w_r||·||x_j||`` of the band is
        recomputed in float64, so the entries are as exact as with float64.
    defer_band : bool
        After a float32 GEMM from stored weights, recompute in float64 only the
        entries that fire or whose side of ``b`` the GEMM's error leaves in doubt; the
        others (below ``b`` for certain) keep their float32 values, ``pending`` marks
        their neurons, and :meth:`settle_band` must run before any of them is read.

    Notes
    -----
    Preprocessing: one GEMM (O(nmd), in blocks of
    :data:`~corrtree._config.ANCHOR_BLOCK_BYTES`), two scans of each block as
    it is made (O(nm)) and, after a float32
    GEMM, a float64 dot product per entry (O(d·entries)).  Memory: ~61 bytes
    per entry, plus ``8·n·m`` for float64 anchored rows.
    """

    #: neurons whose band entries hold float32 values (``defer_band``), until
    #: :meth:`settle_band`
    pending: np.ndarray | None

    def __init__(
        self, W0, X, G, a, b, band, anchor_dtype="float64", gemm_dtype="float64", defer_band=False
    ):
        self._bind(W0, X, G, a, b, band)
        m, n = self.m, self.n
        self.E = np.zeros((n, self.K))  # cumulative error Σ_{τ<t} err(τ)
        self.anchor_dtype = np.dtype(anchor_dtype)
        self.V = np.empty((m, n)) if self.anchor_dtype == np.float64 else None
        self.seg = np.zeros((m, 5), dtype=np.int64)
        self.nf = np.zeros((m, 6))
        self.nf[:, SIGMA] = SIGMA_UNKNOWN  # computed where a bound first needs it
        self.pool = Pool(m * _config.POOL_ENTRIES_PER_NEURON)
        gemm32 = np.dtype(gemm_dtype) == np.float32
        defer = defer_band and gemm32 and self.V is None and not self.w0.implicit
        if defer:
            self.pending = np.zeros(m, dtype=np.bool_)
        self._anchor_all(gemm32)

    def _bind(self, W0, X, G, a, b, band) -> None:
        self.w0 = StoredWeights(W0) if isinstance(W0, np.ndarray) else W0
        self.X, self.G, self.a, self.b = X, G, a, float(b)
        self.m, self.n, self.K = self.w0.m, X.shape[0], a.shape[1]
        self.band = float(band)
        self.xnorm = np.sqrt(np.einsum("ij,ij->i", X, X))
        self.R = float(self.xnorm.max())
        self._x32: np.ndarray | None = None
        self._buffers: dict[str, np.ndarray] = {}
        self.pending = None
        # the set-up's mean fire count, which scales the band widths (band_widths)
        self.mean_fire = math.nan
        # the lazy trainer's moves since the anchors, (m, d) while it keeps them
        self.move = np.zeros((0, X.shape[1]))

    def buffer(self, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        """Scratch array ``name`` of ``shape``, kept for the next call of that name.

        The big temporaries of the iterations (flip records, re-anchored rows)
        are written at scattered places by parallel kernels.  First touches of
        fresh memory in that order cost more than the work itself, so a new buffer is
        zero-filled in order
        once and reused while it is large enough (when it must grow, it grows
        by 1/4 beyond the request).  The set-up's GEMM blocks are buffers of
        the names re-anchoring uses, so its rows land in memory already touched.
        A buffer lives in small pages (:func:`~._pool.zeros`): numpy asks for
        transparent huge pages for large arrays, and where Linux compacts memory to
        fault one in (its default ``defrag``) the first touch of a 128 MB GEMM block
        took 0.2–1.2 s against 0.02 s in small pages (``docs/design.md``,
        "Measurements behind the choices").
        """
        size = math.prod(shape)
        have = self._buffers.get(name)
        if have is None or have.shape[0] < size or have.dtype != np.dtype(dtype):
            spare = 0 if have is None else size // 4
            have = self._buffers[name] = zeros(size + spare, dtype)
            have.fill(0)
        return have[:size].reshape(shape)

    @property
    def W0(self) -> np.ndarray:
        """``W(0)`` as an array (stored weights only)."""
        return self.w0.W

    @property
    def X32(self) -> np.ndarray:
        """``X`` in float32, for float32 GEMMs (made once)."""
        if self._x32 is None:
            self._x32 = self.X.astype(np.float32)
        return self._x32

    @classmethod
    def from_arrays(
        cls, W0, X, G, a, b, band, anchor_dtype, V, seg, nf, pool, used, E
    ) -> BandState:
        """The state of a run in progress (from a checkpoint, already checked); ``V``
        is ``None`` unless ``anchor_dtype`` is float64."""
        st = cls.__new__(cls)
        st._bind(W0, X, G, a, b, band)
        st.anchor_dtype = np.dtype(anchor_dtype)
        st.V, st.seg, st.nf, st.E = V, seg, nf, E
        st.pool = Pool.from_arrays(pool, used)
        return st

    def _anchor_all(self, gemm32: bool) -> None:
        """Anchor every neuron at ``t = 0``, one GEMM block at a time."""
        w0, X, m = self.w0, self.X, self.m
        d = X.shape[1]
        dtype = np.float32 if gemm32 else np.float64
        block = _config.block_rows(dtype().itemsize * self.n, m, _config.ANCHOR_BLOCK_BYTES)
        rows_in_block = min(block, m)
        if gemm32:
            X32 = self.X32
            w32 = self.buffer("weights32", (rows_in_block, d), np.float32)
        keep = self.V is not None and not gemm32  # the float64 GEMM writes V in place
        # re-anchoring reuses these blocks (memory already touched): same names
        name = "leaves" if gemm32 else "exact_rows"
        buf = None if keep else self.buffer(name, (rows_in_block, self.n), dtype)
        tau = np.empty(rows_in_block)
        # regenerated weights need a block of their own; stored ones are read in place
        w64 = self.buffer("weights", (rows_in_block, d)) if w0.implicit else None
        mean_fire = 0.0
        clock = time.perf_counter
        took = self.setup_s = dict.fromkeys(("generate", "gemm", "scan", "exact"), 0.0)
        for s in range(0, m, block):
            e = min(s + block, m)
            rows = np.arange(s, e, dtype=np.int64)
            t0 = clock()
            W0 = w0.rows(s, e, None if w64 is None else w64[: e - s])
            t1 = clock()
            if gemm32:
                self.nf[s:e, LEAF_ERR] = float32_error(W0, self.R, w32[: e - s])
                A, B = w32[: e - s], X32
            else:
                A, B = W0, X
            rows_out = self.V[s:e] if keep and self.V is not None else buf[: e - s]  # type: ignore[index]  # buf exists unless keep
            U = np.matmul(A, B.T, out=rows_out)
            if self.V is not None and gemm32:  # float64 rows holding the float32 products
                self.V[s:e] = U
            t2 = clock()
            leaf_err = self.nf[s:e, LEAF_ERR]
            fires = fire_counts(U, self.b)
            if s == 0:  # the mean fire count of the first block sets the scale
                mean_fire = self.mean_fire = max(1.0, float(fires.mean()))
            self.nf[s:e, BETA] = band_widths(fires, self.band, mean_fire)
            tau[: e - s] = self.b - self.nf[s:e, BETA]
            counts = count_candidates(U, tau[: e - s], leaf_err)
            if s == 0:  # size the pool from the first block, with room to re-anchor
                per = Pool.segment_caps(counts, tight=w0.implicit).mean()
                self.pool.reserve(int(_config.POOL_RESERVE * per * m))
            self.pool.place(self.seg, rows, counts, tight=w0.implicit)
            fill_new_anchors(U, rows, tau[: e - s], leaf_err, self.seg, self.pool.arrays, self.b)
            t3 = clock()
            if gemm32:  # the float32 values only chose the entries: recompute them
                window = np.empty((0, 2))  # all of them, or (pending) those that may fire
                if self.pending is not None:
                    window = _windows(self.b, leaf_err, above=True)
                    self.pending[s:e] = True
                args = (self.seg, self.pool.arrays, s, dot_chunk(rows.shape[0]), window)
                exact_entries_from_w(W0, X, rows, *args)
                reorder_after_exact(rows, self.seg, self.pool.arrays, self.b)
            t4 = clock()
            for key, dt in zip(took, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                took[key] += dt

    def settle_band(self, drop: bool) -> None:
        """Make every entry exact again after a ``defer_band`` set-up: recompute the
        float32 values of the pending neurons' band in float64 (:meth:`__init__`), or,
        with ``drop``, keep only the entries of those that fire (``β_r = 0``: any move
        re-anchors them, at their first visit, with the band :func:`band_widths` gives
        their fire counts).  Exact either way; ``drop`` saves the band's dot products
        where the first step re-anchors nearly every neuron anyway (the caller judges,
        :meth:`~.kernel.KernelTrainer._start`).  O(d·pending entries), or O(m)."""
        if self.pending is None:
            return
        rows = np.flatnonzero(self.pending)
        if drop:
            fire = rows[self.seg[rows, SUPP] > 0]
            self.seg[fire, CNT] = self.seg[fire, SUPP]
            self.nf[fire, BETA] = 0.0
            self.pending[fire] = False
        m, d = self.m, self.X.shape[1]
        block = _config.block_rows(8 * d, m, _config.ANCHOR_BLOCK_BYTES)
        for s in range(0, m, block):
            e = min(s + block, m)
            rows = s + np.flatnonzero(self.pending[s:e])
            if rows.shape[0]:
                window = _windows(self.b, self.nf[rows, LEAF_ERR], above=False)
                args = (self.seg, self.pool.arrays, s, dot_chunk(rows.shape[0]), window)
                exact_entries_from_w(self.w0.rows(s, e, None), self.X, rows, *args)
        self.pending = None

    def intended_widths(self, rows: np.ndarray) -> np.ndarray:
        """The band half-widths ``rows`` are re-anchored with: ``nf[:, BETA]``, or, where
        :meth:`settle_band` dropped their band (``β = 0``), :func:`band_widths` of their
        fire counts (the set-up's scale; after a resume, that of the fire counts now)."""
        beta = self.nf[rows, BETA]
        zero = beta == 0.0
        if zero.any():
            mean = self.mean_fire
            if math.isnan(mean):
                fires = self.seg[:, NFIRE]
                mean = max(1.0, float(fires[fires > 0].mean())) if fires.any() else 1.0
            beta[zero] = band_widths(self.seg[rows[zero], NFIRE], self.band, mean)
        return beta

    @property
    def nbytes(self) -> int:
        rows = 0 if self.V is None else self.V.nbytes
        return rows + self.pool.nbytes + self.seg.nbytes + self.move.nbytes

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
        out = self.w0.rows(start, stop, np.empty((stop - start, self.X.shape[1])))
        self.update_weights(out, start, eta_s)
        return out

    def weights_of(
        self, rows: np.ndarray, eta_s: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``W(t)[rows]``, in ``out`` if given (else a new array).
        O(d·Σ_{r ∈ rows} |prefix_r|)."""
        out = self.w0.take(rows, out)
        materialize(out, rows, self.X, self.seg, self.pool.arrays, self.a, self.E, eta_s)
        return out

    def update_weights(self, out: np.ndarray, start: int, eta_s: float) -> None:
        """``out -= C X`` for rows ``start : start + len(out)``: ``W(0)`` of those rows
        in ``out`` becomes ``W(t)``.  O(d·Σ_r |prefix_r|)."""
        rows = np.arange(start, start + out.shape[0], dtype=np.int64)
        materialize(out, rows, self.X, self.seg, self.pool.arrays, self.a, self.E, eta_s)
