"""State of the band trainers and its preprocessing: anchored rows, the entries
chosen from them, and the cumulative error of the implicit weights.

Anchors (``docs/design.md``, "Anchors and bands")
    Each neuron ``r`` has an anchor time ``t_a``: its products at ``t_a`` (the
    *anchored row*) are computed in GEMM blocks and scanned once, as they are
    made, for its entries: every ``j`` with an anchored product ``>= b - β_r``
    plus every pair that ever fired.  Only float64 storage keeps the rows
    (``V``), for re-anchoring by the Gram identity; float32 rows are scanned
    and dropped, and re-anchoring recomputes them from ``w_r(t)``.

Bands chosen with the learning rate
    At set-up ``β_r`` is not final: how far a neuron moves depends on ``lr``,
    known only once the fire sets gave ``λ_max``.  The set-up scan therefore
    makes only the pairs at ``b`` entries and *reserves* the products down to
    ``b - widest`` (points and values, O(1) bytes each); :meth:`BandState.fill_bands`
    then makes each neuron's band from its reserve (``BandTrainer._start``).

Certificate
    ``|U[r, j](t) - U[r, j](t')| <= ||w_r(t) - w_r(t')|| · ||x_j||``: a pair
    that is not an entry cannot fire while the drift since the anchor stays
    below ``β_r / R`` (``R = max_j ||x_j||``); past that the neuron is
    re-anchored (:mod:`._reanchor`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import _config
from ._pairs import by_data, dot_row, firing_csr, materialize
from ._pool import BETA, CAP, CNT, LEAF_ERR, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP, Pool

__all__ = [
    "BandState",
    "count_candidates",
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
    returns the position after the last.  O(n), streaming (the row was just made)."""
    for j in range(row.shape[0]):
        if row[j] >= thr:
            out[pos] = j
            pos += 1
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


def band_widths(fires: np.ndarray, band: float, mean_fire: float) -> np.ndarray:
    """Half-width of each fresh anchor's band:
    ``β_r = band·(f_r / mean_fire)^e`` (``e`` = :data:`~corrtree._config.BAND_FIRE_EXPONENT`,
    ``f_r = max(fires[r], 1)``) within ``[band/2, BAND_WIDEST·band]``.  A neuron firing on more
    points moves more per step (its step sums more errors): it gets room for that
    instead of a re-anchoring.  Any ``β_r > 0`` is exact; the counts may come from
    float32 rows."""
    w = band * (np.maximum(fires, 1) / mean_fire) ** _config.BAND_FIRE_EXPONENT
    return np.clip(w, 0.5 * band, _config.BAND_WIDEST * band)


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


@njit(cache=True, parallel=True)
def count_set_up(U, tau, low, leaf_err):
    """For each row ``U[k]`` of a set-up block: how many products reach the query
    threshold of ``tau[k]`` (its entries) and how many lie between the query
    thresholds of ``low`` and ``tau[k]`` (its reserve).  One pass, O(n) a row."""
    nr = U.shape[0]
    at_tau = np.empty(nr, dtype=np.int64)
    kept = np.empty(nr, dtype=np.int64)
    for k in prange(nr):
        hi = query_threshold(tau[k], leaf_err[k])
        lo = query_threshold(low, leaf_err[k])
        c = e = 0
        for j in range(U.shape[1]):
            v = U[k, j]
            c += v >= hi
            e += lo <= v < hi
        at_tau[k], kept[k] = c, e
    return at_tau, kept


@njit(cache=True, parallel=True)
def fill_set_up(U, rows, fires, tau, leaf_err, seg, pool, b, low, ptr, rj, rv):
    """Write the set-up entries of freshly anchored ``rows`` (no ever-fired pairs
    yet) and their reserves, counted by :func:`count_set_up`, in one pass a row.

    ``U[k]`` is the anchored row of ``rows[k]``, erring by at most
    ``leaf_err[k]``, with ``fires[k]`` products ``>= b``; segments must already
    be placed with enough capacity.  The entries are the products at the query
    threshold of ``tau[k]``, the firing ones first (they form the ever-fired
    prefix); the reserve, the products down to the query threshold of ``low``,
    goes to ``rj``/``rv`` from ``ptr[k]`` on.
    """
    # numba does not write through a namedtuple's fields inside prange: bind them first
    ej, uref, val, key, kappa, cref, fire, clast, vel = pool
    for k in prange(rows.shape[0]):
        r = rows[k]
        hi = query_threshold(tau[k], leaf_err[k])
        lo = query_threshold(low, leaf_err[k])
        s0 = seg[r, START]
        pf, pb, pr = s0, s0 + fires[k], ptr[k]
        for j in range(U.shape[1]):
            v = U[k, j]
            if v >= b:
                ej[pf] = j
                pf += 1
            elif v >= hi:
                ej[pb] = j
                pb += 1
            elif v >= lo:
                rj[pr] = j
                rv[pr] = v
                pr += 1
        for q in range(s0, pb):
            v = U[k, ej[q]]
            uref[q] = v
            val[q] = v
            key[q] = 0.0
            kappa[q] = 0.0
            cref[q] = 0.0
            clast[q] = 0.0
            if vel.shape[0]:
                vel[q] = 0.0
            fire[q] = v >= b
        seg[r, CNT] = pb - s0
        seg[r, SUPP] = fires[k]
        seg[r, NFIRE] = fires[k]


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
def exact_entries_from_w(W, X, rows, first, seg, pool):
    """Recompute ``uref`` and ``val`` of the entries of ``rows[k]`` from the
    ``first[k]``-th of its segment on as float64 dot products,
    :data:`~corrtree._config.DOT_ROWS` neurons at a time (:func:`pair_dots`)."""
    ej, uref, val = pool.j, pool.uref, pool.val
    nr = rows.shape[0]
    for c in prange((nr + _DOT_ROWS - 1) // _DOT_ROWS):
        lo, hi = c * _DOT_ROWS, min((c + 1) * _DOT_ROWS, nr)
        total = 0
        for k in range(lo, hi):
            total += seg[rows[k], CNT] - first[k]
        wi = np.empty(total, dtype=np.int64)
        qs = np.empty(total, dtype=np.int64)
        p = 0
        for k in range(lo, hi):
            s0 = seg[rows[k], START]
            for q in range(s0 + first[k], s0 + seg[rows[k], CNT]):
                wi[p] = rows[k]
                qs[p] = q
                p += 1
        out = np.empty(total)
        pair_dots(W, wi, X, ej[qs], out)
        for p in range(total):
            uref[qs[p]] = out[p]
            val[qs[p]] = out[p]


@njit(cache=True, parallel=True)
def count_reserve(rows, first, ptr, rv, tau, leaf_err):
    """How many reserved products of ``r = rows[k]`` (``rv[ptr[i]:ptr[i+1]]``,
    ``i = r - first``: the reserve of a block whose rows start at ``first``) reach
    the query threshold of ``tau[k]``."""
    out = np.empty(rows.shape[0], dtype=np.int64)
    for k in prange(rows.shape[0]):
        thr = query_threshold(tau[k], leaf_err[k])
        i = rows[k] - first
        c = 0
        for p in range(ptr[i], ptr[i + 1]):
            c += rv[p] >= thr
        out[k] = c
    return out


@njit(cache=True, parallel=True)
def move_and_extend(rows, first, old_seg, old, seg, pool, ptr, rj, rv, tau, leaf_err):
    """Copy the entries of ``rows[k]`` from its ``old_seg`` segment of ``old`` to its
    segment of ``pool`` (large enough; the same place is a no-op), then append its
    reserved products that reach the query threshold of ``tau[k]`` as non-firing
    entries (``first``, ``ptr``, ``rj``, ``rv`` as in :func:`count_reserve`; the
    reserve lies below the set-up band, so below ``b``).  At the set-up anchor every
    key and coefficient is zero, as are fresh places of a pool: only points, values
    and flags move."""
    # numba does not write through a namedtuple's fields inside prange: bind them first
    ej, uref, val, fire = pool.j, pool.uref, pool.val, pool.fire
    for k in prange(rows.shape[0]):
        r = rows[k]
        src, cnt = old_seg[r, START], old_seg[r, CNT]
        dst = seg[r, START]
        for i in range(cnt):
            ej[dst + i] = old.j[src + i]
            uref[dst + i] = old.uref[src + i]
            val[dst + i] = old.val[src + i]
            fire[dst + i] = old.fire[src + i]
        thr = query_threshold(tau[k], leaf_err[k])
        pos = dst + cnt
        i = r - first
        for p in range(ptr[i], ptr[i + 1]):
            if rv[p] >= thr:
                ej[pos] = rj[p]
                uref[pos] = rv[p]
                val[pos] = rv[p]
                pos += 1
        seg[r, CNT] = pos - dst


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def first_steps(seg, pool, a, err, X, G, scatter):
    """``||Σ_{l ∈ S_r} <a_r, err_l>·x_l||`` for every neuron ``r``, ``S_r`` its fire set:
    its first step, over ``η/sqrt(m)``.  From the data (O(d·|S_r|)) or as the
    quadratic form over ``G[S_r, S_r]`` (O(|S_r|²) scattered reads), whichever
    costs less (:func:`~._pairs.by_data`).  Only chooses band widths: vectorized
    sums, no rounding bound."""
    m, d = seg.shape[0], X.shape[1]
    out = np.zeros(m)
    runs = min(m, _CHUNKS)
    for c in prange(runs):
        v = np.empty(d)
        cs = np.empty(0)
        for r in range(c * m // runs, (c + 1) * m // runs):
            s0, ns = seg[r, START], seg[r, SUPP]
            if ns == 0:
                continue
            if cs.shape[0] < ns:
                cs = np.empty(2 * ns)
            for p in range(ns):
                q = s0 + p
                cs[p] = dot_row(a, r, err, pool.j[q]) if pool.fire[q] else 0.0
            sq = 0.0
            if by_data(d, ns, scatter):
                v[:] = 0.0
                for p in range(ns):
                    row = pool.j[s0 + p]
                    for t in range(d):
                        v[t] += cs[p] * X[row, t]
                for t in range(d):
                    sq += v[t] * v[t]
            else:
                for p in range(ns):
                    jp = pool.j[s0 + p]
                    inner = 0.0
                    for p2 in range(ns):
                        inner += cs[p2] * G[jp, pool.j[s0 + p2]]
                    sq += cs[p] * inner
            out[r] = math.sqrt(max(sq, 0.0))
    return out


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
    """Anchored products, entries and implicit weights of one run.

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

    Notes
    -----
    Preprocessing: one GEMM (O(nmd), in blocks of
    :data:`~corrtree._config.ANCHOR_BLOCK_BYTES`), four scans of each block as
    it is made (O(nm)) and, after a float32
    GEMM, a float64 dot product per entry (O(d·entries)); :meth:`fill_bands`
    once.  Memory: ~61 bytes per entry, plus ``8·n·m`` for float64 anchored
    rows, plus 8–12 bytes per reserved product until :meth:`fill_bands`.
    """

    def __init__(self, W0, X, G, a, b, band, anchor_dtype="float64", gemm_dtype="float64"):
        m, n = W0.shape[0], X.shape[0]
        self._bind(W0, X, G, a, b, band)
        self.E = np.zeros((n, self.K))  # cumulative error Σ_{τ<t} err(τ)
        self.anchor_dtype = np.dtype(anchor_dtype)
        self.V = np.empty((m, n)) if self.anchor_dtype == np.float64 else None
        self.seg = np.zeros((m, 5), dtype=np.int64)
        self.nf = np.zeros((m, 6))
        self.nf[:, SIGMA] = SIGMA_UNKNOWN  # computed where a bound first needs it
        self.pool = Pool(m * _config.POOL_ENTRIES_PER_NEURON)
        self._anchor_all(np.dtype(gemm_dtype) == np.float32)

    def _bind(self, W0, X, G, a, b, band) -> None:
        self.W0, self.X, self.G, self.a, self.b = W0, X, G, a, float(b)
        self.m, self.n, self.K = W0.shape[0], X.shape[0], a.shape[1]
        self.band = float(band)
        self.widest = _config.BAND_WIDEST * self.band
        self._reserve: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] | None = None
        self.xnorm = np.sqrt(np.einsum("ij,ij->i", X, X))
        self.R = float(self.xnorm.max())
        self._x32: np.ndarray | None = None
        self._buffers: dict[str, np.ndarray] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        """Scratch array ``name`` of ``shape``, kept for the next call of that name.

        The big temporaries of the iterations (flip records, re-anchored rows)
        are written at scattered places by parallel kernels.  First touches of
        fresh memory in that order cost far more than the work (W1's first
        iteration: 0.5 s against 0.2 s), so a new buffer is zero-filled in order
        once and reused while it is large enough (when it must grow, it grows
        by 1/4 beyond the request).  The set-up's GEMM blocks are buffers of
        the names re-anchoring uses, so its rows land in memory already touched.
        """
        size = math.prod(shape)
        have = self._buffers.get(name)
        if have is None or have.shape[0] < size or have.dtype != np.dtype(dtype):
            spare = 0 if have is None else size // 4
            have = self._buffers[name] = np.empty(size + spare, dtype=dtype)
            have.fill(0)
        return have[:size].reshape(shape)

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
        W0, X, m = self.W0, self.X, self.m
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
        low = self.b - self.widest  # the reserve: products down to b - widest
        self._reserve = []
        mean_fire = 0.0
        for s in range(0, m, block):
            e = min(s + block, m)
            rows = np.arange(s, e, dtype=np.int64)
            if gemm32:
                self.nf[s:e, LEAF_ERR] = float32_error(W0[s:e], self.R, w32[: e - s])
                A, B = w32[: e - s], X32
            else:
                A, B = W0[s:e], X
            U = np.matmul(A, B.T, out=self.V[s:e] if keep else buf[: e - s])
            if self.V is not None and gemm32:  # float64 rows holding the float32 products
                self.V[s:e] = U
            leaf_err = self.nf[s:e, LEAF_ERR]
            fires = fire_counts(U, self.b)
            if s == 0:  # the mean fire count of the first block sets the scale
                mean_fire = max(1.0, float(fires.mean()))
            self.nf[s:e, BETA] = band_widths(fires, self.band, mean_fire)
            tau = self.b - self.nf[s:e, BETA]
            counts, kept = count_set_up(U, tau, low, leaf_err)
            if s == 0:  # size the pool from the first block, with a margin
                per = (counts.sum() + _config.SEGMENT_SLACK_ADD * rows.shape[0]) / rows.shape[0]
                self.pool.reserve(int(_config.POOL_FIRST_BLOCK_MARGIN * per * m))
            self.pool.place(self.seg, rows, counts)
            ptr = np.zeros(e - s + 1, dtype=np.int64)
            np.cumsum(kept, out=ptr[1:])
            rj = np.empty(ptr[-1], dtype=np.int32)
            rv = np.empty(ptr[-1], dtype=U.dtype)
            pool = self.pool.arrays
            fill_set_up(U, rows, fires, tau, leaf_err, self.seg, pool, self.b, low, ptr, rj, rv)
            self._reserve.append((s, e, ptr, rj, rv))
            if gemm32:  # the float32 values only chose the entries: recompute them
                exact_entries_from_w(W0, X, rows, np.zeros_like(rows), self.seg, pool)
                reorder_after_exact(rows, self.seg, pool, self.b)

    def widen_bands(self, beta: np.ndarray) -> int:
        """Widen the band of every neuron ``r`` to half-width ``beta[r]`` (at least its
        set-up width, at most :attr:`widest`) at its set-up anchor, once; returns how
        many neurons widened.  Their new entries are their reserved products down to
        ``b - beta[r]`` (widened by their error bound), with exact values, appended
        in place or in a fresh segment; when more than
        :data:`~corrtree._config.RELAYOUT_SHARE` of the neurons widen, the pool is
        laid out anew, neuron after neuron, instead of leaving the old segments as
        holes.  The reserve is dropped.  O(reserve + d·(new entries) after a float32
        GEMM, + entries when laid out anew)."""
        if self._reserve is None:
            raise RuntimeError("the bands were already widened")
        beta = np.asarray(beta, dtype=np.float64)
        if (
            beta.shape != (self.m,)
            or not ((beta >= self.nf[:, BETA]) & (beta <= self.widest)).all()
        ):
            raise ValueError(
                f"beta must hold {self.m} half-widths from the set-up ones to {self.widest}"
            )
        reserve, self._reserve = self._reserve, None
        wide = np.flatnonzero(beta > self.nf[:, BETA])
        if wide.shape[0] == 0:
            return 0
        anew = wide.shape[0] > _config.RELAYOUT_SHARE * self.m
        rows = np.arange(self.m, dtype=np.int64) if anew else wide
        old_seg, old = self.seg.copy(), self.pool.arrays
        leaf_err, tau = self.nf[:, LEAF_ERR], self.b - beta
        parts = [(s, rows[(rows >= s) & (rows < e)], ptr, rj, rv) for s, e, ptr, rj, rv in reserve]
        need = old_seg[rows, CNT].copy()
        at = 0
        for s, part, ptr, _, rv in parts:
            need[at : at + part.shape[0]] += count_reserve(
                part, s, ptr, rv, tau[part], leaf_err[part]
            )
            at += part.shape[0]
        if anew:
            self.pool = Pool(0)
            self.pool.place(self.seg, rows, need)
        else:
            grow = need > old_seg[rows, CAP]
            self.pool.place(self.seg, rows[grow], need[grow])
        for s, part, ptr, rj, rv in parts:
            move_and_extend(
                part,
                s,
                old_seg,
                old,
                self.seg,
                self.pool.arrays,
                ptr,
                rj,
                rv,
                tau[part],
                leaf_err[part],
            )
        if (leaf_err > 0).any():  # reserved float32 products: their exact values
            exact_entries_from_w(
                self.W0, self.X, rows, old_seg[rows, CNT], self.seg, self.pool.arrays
            )
        self.nf[wide, BETA] = beta[wide]
        return int(wide.shape[0])

    @property
    def nbytes(self) -> int:
        rows = 0 if self.V is None else self.V.nbytes
        return rows + self.pool.nbytes + self.seg.nbytes

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

    def weights_of(
        self, rows: np.ndarray, eta_s: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``W(t)[rows]``, in ``out`` if given (else a new array).
        O(d·Σ_{r ∈ rows} |prefix_r|)."""
        # rows are in range: mode='clip' only spares the copy np.take buffers through
        out = np.take(self.W0, rows, axis=0, out=out, mode="clip")
        materialize(out, rows, self.X, self.seg, self.pool.arrays, self.a, self.E, eta_s)
        return out
