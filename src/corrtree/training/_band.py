"""Anchored products, drift bands and implicit weights: the machinery of the
``lazy`` and ``kernel`` trainers.

Implicit weights
    ``W(t) = W(0) - C(t) X`` with ``C[r, l](t) = η/sqrt(m) · Σ_{τ<t} F_rl(τ) (a_r·err_l(τ))``.
    While a pair fires, ``C[r, l](t) = κ_rl + η/sqrt(m) · a_r·E_l(t)`` with
    ``E(t) = Σ_{τ<t} err(τ)`` the cumulative error; when it stops firing its
    ``C`` is frozen into ``κ_rl``.  Only pairs that ever fired have ``C ≠ 0``.

Anchors
    Each neuron ``r`` has an anchor time ``t_a``: its products at ``t_a``
    (the *anchored row*) are the leaves of tree ``r`` of a WTree-like store
    (m max trees of n leaves, float64, or float32 to save memory).  Its
    *entries* are the pairs ``(r, j)`` whose exact product is tracked: every
    ``j`` with an anchored product ``>= b - β_r`` (a WTree query at that
    lowered threshold) plus every pair that ever fired.  For an entry, the
    exact product at time ``t`` follows from the Gram identity
    ``U[r, j](t) = U[r, j](t_a) - Σ_l (C_rl(t) - C_rl(t_a)) G[l, j]`` with
    ``G = X Xᵀ`` -- O(#pairs that ever fired) per value, no ``d``.

Certificate
    ``|U[r, j](t) - U[r, j](t')| <= ||w_r(t) - w_r(t')|| · ||x_j||``.  A pair that
    is not an entry has an anchored product ``< b - β_r`` and cannot fire while
    the drift since the anchor stays below ``β_r / R`` (``R = max_j ||x_j||``);
    when it may have passed, the neuron is *re-anchored*: its whole row is
    recomputed exactly at the current time, written to its tree, and its
    entries are chosen again.  The trainers keep (lazy) or bound (kernel) the
    drift and decide which entries must be evaluated.

Layout
    Entries live in a pool of flat arrays; neuron ``r`` owns the segment
    ``[seg[r, START], seg[r, START] + seg[r, CNT])`` (capacity ``seg[r, CAP]``),
    whose first ``seg[r, SUPP]`` entries are the pairs that ever fired.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.typed import List

from .. import _maxtree
from .._prefetch import prefetch2d

# columns of the per-neuron integer table ``seg``
START, CNT, CAP, SUPP, NFIRE = range(5)
# columns of the per-neuron float table ``nf``
DRIFT, MINKEY, BETA, LEAF_ERR, KEY, SIGMA = range(6)

_U32 = 2.0**-24  # unit roundoff of float32


# ---------------------------------------------------------------------------
# Pool
# ---------------------------------------------------------------------------


class Pool:
    """Growable arrays of entries (one row per tracked pair)."""

    FIELDS = (
        ("j", np.int32),  # data point
        ("uref", np.float64),  # exact product at the neuron's anchor
        ("val", np.float64),  # exact product at the last evaluation
        ("key", np.float64),  # lazy: drift at which the entry must be re-evaluated
        ("kappa", np.float64),  # coefficient (see module docstring)
        ("cref", np.float64),  # coefficient at the anchor
        ("fire", np.bool_),  # firing now
        ("clast", np.float64),  # coefficient at the neuron's last evaluation
    )

    def __init__(self, capacity: int) -> None:
        capacity = max(16, int(capacity))
        self.arrays = tuple(np.zeros(capacity, dtype=dt) for _, dt in self.FIELDS)
        self.used = 0

    @property
    def capacity(self) -> int:
        return self.arrays[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more entries at the end (amortized doubling)."""
        need = self.used + int(extra)
        if need <= self.capacity:
            return
        new_cap = max(need, int(self.capacity * 1.5))
        grown = []
        for a in self.arrays:
            b = np.zeros(new_cap, dtype=a.dtype)
            b[: self.used] = a[: self.used]
            grown.append(b)
        self.arrays = tuple(grown)


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _dot_row(a, r, E, j):
    s = 0.0
    for k in range(a.shape[1]):
        s += a[r, k] * E[j, k]
    return s


@njit(cache=True, inline="always")
def _coef(q, r, pool, a, E, eta_s):
    """The coefficient ``C_rl`` of entry ``q`` now (see the module docstring)."""
    c = pool[4][q]
    if pool[6][q]:
        c += eta_s * _dot_row(a, r, E, pool[0][q])
    return c


@njit(cache=True, inline="always")
def _gram_sum(G, j, ej, dc, s0, ns):
    """``Σ_{p<ns} dc[s0+p] · G[j, ej[s0+p]]`` with four accumulators (fixed order)."""
    a0 = a1 = a2 = a3 = 0.0
    p = 0
    while p + 4 <= ns:
        q = s0 + p
        a0 += dc[q] * G[j, ej[q]]
        a1 += dc[q + 1] * G[j, ej[q + 1]]
        a2 += dc[q + 2] * G[j, ej[q + 2]]
        a3 += dc[q + 3] * G[j, ej[q + 3]]
        p += 4
    while p < ns:
        a0 += dc[s0 + p] * G[j, ej[s0 + p]]
        p += 1
    return (a0 + a1) + (a2 + a3)


@njit(cache=True)
def sigma(r, seg, pool, G):
    """``sqrt`` of a Gershgorin bound on ``λ_max(G[S, S])``, ``S`` the points ``r`` fires on.

    For any coefficients ``c`` on ``S``: ``||Σ_l c_l x_l|| <= sigma · ||c||``.
    """
    ej, fire = pool[0], pool[6]
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    best = 0.0
    for p in range(ns):
        if fire[s0 + p]:
            jp = ej[s0 + p]
            row = 0.0
            for q in range(ns):
                if fire[s0 + q]:
                    row += abs(G[jp, ej[s0 + q]])
            best = max(best, row)
    return math.sqrt(best)


@njit(cache=True, parallel=True)
def update_sigma(rows, seg, nf, pool, G):
    for k in prange(rows.shape[0]):
        nf[rows[k], SIGMA] = sigma(rows[k], seg, pool, G)


@njit(cache=True)
def prefetch_block(r, seg, ej, G):
    """Ask for the ``G[P, P]`` entries (upper triangle) of neuron ``r`` ahead of use."""
    t0 = seg[r, START]
    t1 = t0 + seg[r, SUPP]
    for q in range(t0, t1):
        for q2 in range(q, t1):
            prefetch2d(G, ej[q], ej[q2])


@njit(cache=True, inline="always")
def _safe_norm(sq, l1, gmax):
    """``sqrt`` of a computed quadratic form ``cᵀ G c``, enlarged to cover its rounding
    (at most ~ (number of terms)·2^-53·(Σ|c|)²·max G, far below 1e-13 of that)."""
    return math.sqrt(max(sq, 0.0) + 1e-13 * l1 * l1 * gmax) * (1.0 + 1e-12)


@njit(cache=True)
def eval_ever(r, seg, pool, scratch, a, E, G, eta_s, want_step):
    """Exact current values of the ever-fired pairs ``P`` of neuron ``r``.

    With ``C`` their coefficients now, ``dc = C - cref`` (since the anchor,
    kept in ``scratch[0]``): ``val[P] = uref[P] - G[P, P] dc``, reading each
    ``G[p, q]`` once (``|P|(|P|+1)/2`` reads).  Returns bounds on
    ``||w_r(t) - w_r(anchor)||`` and, if ``want_step``, on
    ``||w_r(t) - w_r(last evaluation)||`` (from ``dl = C - clast``; ``clast``
    becomes ``C``; only kept up to date by callers that want the step), else
    0: the quadratic forms ``dcᵀ G dc``, ``dlᵀ G dl`` plus their rounding.
    """
    ej, uref, val, cref, clast = pool[0], pool[1], pool[2], pool[5], pool[7]
    dc, dl = scratch[0], scratch[1]
    s0 = seg[r, START]
    end = s0 + seg[r, SUPP]
    l1_a = 0.0
    l1_s = 0.0
    for q in range(s0, end):
        c = _coef(q, r, pool, a, E, eta_s)
        dc[q] = c - cref[q]
        val[q] = uref[q]
        l1_a += abs(dc[q])
        if want_step:
            dl[q] = c - clast[q]
            clast[q] = c
            l1_s += abs(dl[q])
    sq_s = 0.0
    gmax = 0.0
    for q in range(s0, end):
        jp = ej[q]
        dp = dc[q]
        g = G[jp, jp]
        gmax = max(gmax, g)
        ap = g * dp
        if want_step:
            lp = dl[q]
            sq_s += g * lp * lp
            for q2 in range(q + 1, end):
                g = G[jp, ej[q2]]
                ap += g * dc[q2]
                val[q2] -= g * dp
                sq_s += 2.0 * g * lp * dl[q2]
        else:
            for q2 in range(q + 1, end):
                g = G[jp, ej[q2]]
                ap += g * dc[q2]
                val[q2] -= g * dp
        val[q] -= ap
    sq_a = 0.0  # dcᵀ G dc = Σ_p dc_p (uref_p - val_p)
    for q in range(s0, end):
        sq_a += dc[q] * (uref[q] - val[q])
    step = _safe_norm(sq_s, l1_s, gmax) if want_step else 0.0
    return _safe_norm(sq_a, l1_a, gmax), step


@njit(cache=True)
def evaluate_neuron(r, seg, nf, pool, scratch, a, E, err, G, xnorm, eta_s, b, cert,
                    f_j, f_v, f_on, fpos):
    """Evaluate the pairs of neuron ``r`` that may have changed side, and flip them.

    The drift ``D_r = nf[r, DRIFT]`` grows by (``cert`` times) a bound on the
    distance ``w_r`` moved since its last evaluation: the exact one from
    :func:`eval_ever`, or, when ``err`` (the error of the step just taken,
    the neuron's last evaluation being just before it) is non-empty, the
    cheaper ``(η/sqrt m)·σ_r·||(a_r·err_l)_{l fires}||``.  For a pair last
    evaluated at drift ``D`` with value ``v``, ``|U - v| <= (D_r - D)·||x_j||``.
    A pair outside the ever-fired prefix is evaluated only once ``D_r``
    reaches its key ``D + |v - b|/||x_j||`` (keys and their minimum
    ``nf[r, MINKEY]`` are refreshed); the ever-fired pairs, which hold every
    firing pair, are always evaluated.  Flips are applied to the pool and, if
    ``f_j`` is non-empty, recorded from ``fpos`` on as ``(j, value, on)``, and
    ``σ_r`` is recomputed.  Returns ``(fpos + #flips, bound on
    ||w_r - w_r(anchor)||)``.
    """
    ej, uref, val, key, _, _, fire = pool[:7]
    record = f_j.shape[0] > 0
    first = fpos
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    end = s0 + seg[r, CNT]
    bound_step = err.shape[0] > 0
    if bound_step:  # fire flags are still those of the step
        sq = 0.0
        for q in range(s0, s0 + ns):
            if fire[q]:
                e = _dot_row(a, r, err, ej[q])
                sq += e * e
        step = eta_s * nf[r, SIGMA] * math.sqrt(sq) * (1.0 + 1e-12)
    since_anchor, exact_step = eval_ever(r, seg, pool, scratch, a, E, G, eta_s, not bound_step)
    if not bound_step:
        step = exact_step
    drift = nf[r, DRIFT] + cert * step
    nf[r, DRIFT] = drift
    for q in range(s0, s0 + ns):  # ever-fired pairs never move in the pool
        now = val[q] >= b
        if now != fire[q]:
            if record:
                f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], val[q], now
            fpos += 1
            _flip(r, q, seg, pool, a, E, eta_s, now)
    if drift >= nf[r, MINKEY]:  # some other tracked pair may have crossed
        best = np.inf
        dc = scratch[0]
        for q in range(s0 + ns, end):  # increasing order: see _flip
            if key[q] <= drift:
                # positions below s0 + ns keep their pairs even after flips
                val[q] = uref[q] - _gram_sum(G, ej[q], ej, dc, s0, ns)
                if val[q] >= b:
                    if record:
                        f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], val[q], True
                    fpos += 1
                    _flip(r, q, seg, pool, a, E, eta_s, True)
                    continue
                xn = xnorm[ej[q]]
                key[q] = drift + (b - val[q]) / xn if xn > 0 else np.inf
            best = min(best, key[q])
        nf[r, MINKEY] = best
    if fpos > first:  # the fire set changed
        nf[r, SIGMA] = sigma(r, seg, pool, G)
    return fpos, since_anchor


@njit(cache=True)
def set_keys(r, seg, nf, pool, xnorm, b):
    """Keys of the tracked pairs of ``r`` outside its ever-fired prefix, and their
    minimum, from current values (the drift is ``nf[r, DRIFT]``)."""
    ej, val, key = pool[0], pool[2], pool[3]
    s0 = seg[r, START]
    drift = nf[r, DRIFT]
    best = np.inf
    for q in range(s0 + seg[r, SUPP], s0 + seg[r, CNT]):
        xn = xnorm[ej[q]]
        key[q] = drift + (b - val[q]) / xn if xn > 0 else np.inf
        best = min(best, key[q])
    nf[r, MINKEY] = best


@njit(cache=True, parallel=True)
def refresh_keys(rows, seg, nf, pool, xnorm, b):
    """:func:`set_keys` for every neuron of ``rows``."""
    for k in prange(rows.shape[0]):
        set_keys(rows[k], seg, nf, pool, xnorm, b)


@njit(cache=True)
def _flip(r, q, seg, pool, a, E, eta_s, on):
    """Switch entry ``q`` of neuron ``r`` on or off, keeping ``C`` continuous.

    Turning on: the entry joins the ever-fired prefix if it is not there.
    Returns the (possibly moved) position of the entry.
    """
    ej, uref, val, key, kappa, cref, fire, clast = pool
    drive = eta_s * _dot_row(a, r, E, ej[q])
    if on:
        clast[q] = kappa[q]  # its (frozen) coefficient now
        kappa[q] -= drive
        fire[q] = True
        seg[r, NFIRE] += 1
        dest = seg[r, START] + seg[r, SUPP]
        if q >= dest:  # not yet ever-fired: swap into the prefix
            if q != dest:
                for arr in (uref, val, key, kappa, cref, clast):
                    arr[q], arr[dest] = arr[dest], arr[q]
                ej[q], ej[dest] = ej[dest], ej[q]
                fire[q], fire[dest] = fire[dest], fire[q]
            seg[r, SUPP] += 1
            return dest
        return q
    kappa[q] += drive
    fire[q] = False
    seg[r, NFIRE] -= 1
    return q


@njit(cache=True, parallel=True)
def materialize(W, X, seg, pool, a, E, eta_s):
    """``W[r] -= Σ_l C_rl x_l`` over the ever-fired pairs (W holds ``W(0)``)."""
    ej = pool[0]
    d = X.shape[1]
    for r in prange(seg.shape[0]):
        s0 = seg[r, START]
        for p in range(seg[r, SUPP]):
            q = s0 + p
            c = _coef(q, r, pool, a, E, eta_s)
            if c != 0.0:
                j = ej[q]
                for k in range(d):
                    W[r, k] -= c * X[j, k]


@njit(cache=True)
def firing_csr(seg, pool, n):
    """r-major CSR of the current fire sets, indices sorted."""
    ej, fire = pool[0], pool[6]
    m = seg.shape[0]
    indptr = np.zeros(m + 1, dtype=np.int64)
    for r in range(m):
        indptr[r + 1] = indptr[r] + seg[r, NFIRE]
    idx = np.empty(indptr[m], dtype=np.int64)
    for r in range(m):
        pos = indptr[r]
        s0 = seg[r, START]
        for q in range(s0, s0 + seg[r, CNT]):
            if fire[q]:
                idx[pos] = ej[q]
                pos += 1
        idx[indptr[r] : indptr[r + 1]].sort()
    return indptr, idx


@njit(cache=True)
def _query_threshold(tau, err):
    """Tree threshold catching every anchored product ``>= tau`` when leaves err by ``err``.

    The extra relative 2^-22 covers rounding of float32 leaves and of this
    arithmetic.
    """
    t = tau - err
    return t - 4.0 * _U32 * abs(t) - 1e-300


@njit(cache=True, parallel=True)
def count_candidates(V, inner, off, rows, tau, leaf_err):
    """Number of leaves of tree ``rows[k]`` at or above the query threshold."""
    dummy = np.empty((0, 1), dtype=np.int64)
    out = np.empty(rows.shape[0], dtype=np.int64)
    for k in prange(rows.shape[0]):
        r = rows[k]
        thr = _query_threshold(tau[k], leaf_err[r])
        out[k] = _maxtree.report_row(V[r], inner[r], off, thr, dummy, 0, 0, r)
    return out


@njit(cache=True, parallel=True)
def fill_new_anchors(V, inner, off, rows, tau, leaf_err, exact, seg, pool, b):
    """Write the entries of freshly anchored neurons ``rows`` (no ever-fired pairs yet).

    ``exact[k]`` is the exact anchored row of ``rows[k]``; segments must
    already be placed with enough capacity.
    """
    ej, uref, val, key, kappa, cref, fire, clast = pool
    for k in prange(rows.shape[0]):
        r = rows[k]
        thr = _query_threshold(tau[k], leaf_err[r])
        s0 = seg[r, START]
        found = np.empty((seg[r, CAP], 1), dtype=np.int64)
        cnt = _maxtree.report_row(V[r], inner[r], off, thr, found, 0, found.shape[0], r)
        # firing pairs first: they form the ever-fired prefix
        pos = s0
        for f in range(cnt):
            j = found[f, 0]
            if exact[k, j] >= b:
                ej[pos] = j
                pos += 1
        nf = pos - s0
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
            fire[q] = v >= b
        seg[r, CNT] = cnt
        seg[r, SUPP] = nf
        seg[r, NFIRE] = nf


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _exact_entries_from_w(W, X, rows, seg, pool):
    """Recompute ``uref`` and ``val`` of the entries of ``rows`` as float64 dot products.

    (Reassociated, i.e. vectorized, sums: float64 accuracy like any GEMM's.)
    """
    ej, uref, val = pool[0], pool[1], pool[2]
    d = X.shape[1]
    for k in prange(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        for q in range(s0, s0 + seg[r, CNT]):
            j = ej[q]
            s = 0.0
            for c in range(d):
                s += W[r, c] * X[j, c]
            uref[q] = s
            val[q] = s


@njit(cache=True, parallel=True)
def _reorder_after_exact(rows, seg, pool, b):
    """After exact values changed, put firing entries first and set the flags."""
    ej, uref, val = pool[0], pool[1], pool[2]
    fire = pool[6]
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
        nf = head - s0
        for q in range(s0, s0 + cnt):
            fire[q] = q < head
        seg[r, SUPP] = nf
        seg[r, NFIRE] = nf


class BandState:
    """Anchored products (tree store), entries and implicit weights of one run.

    Parameters
    ----------
    W0 : ndarray (m, d)
        Initial weights (not modified; ``W(t) = W0 - C X``).
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
    block : int
        Neurons per GEMM block during preprocessing.
    """

    def __init__(self, W0, X, G, a, b, band, anchor_dtype="float64", gemm_dtype="float64",
                 block=None):
        m, d = W0.shape
        n = X.shape[0]
        self.W0, self.X, self.G, self.a, self.b = W0, X, G, a, float(b)
        self.m, self.n, self.K = m, n, a.shape[1]
        self.band = float(band)
        self.xnorm = np.sqrt(np.einsum("ij,ij->i", X, X))
        self.R = float(self.xnorm.max())
        self.anchor_dtype = np.dtype(anchor_dtype)
        self.E = np.zeros((n, self.K))
        self.eta_s = 0.0  # η/sqrt(m), set by the trainer once lr is known
        self.off = _maxtree.level_offsets(n)
        self.V = np.empty((m, n), dtype=self.anchor_dtype)
        self.inner = np.empty((m, int(self.off[-1])), dtype=self.anchor_dtype)
        self.seg = np.zeros((m, 5), dtype=np.int64)
        self.nf = np.zeros((m, 6))
        self.nf[:, BETA] = self.band
        self.pool = Pool(m * 8)
        gemm32 = np.dtype(gemm_dtype) == np.float32
        if gemm32:
            X32 = X.astype(np.float32)
            wnorm = np.sqrt(np.einsum("ij,ij->i", W0, W0))
            gamma = (d + 2) * _U32 / (1.0 - (d + 2) * _U32)
            self.nf[:, LEAF_ERR] = 2.0 * gamma * wnorm * self.R  # safety factor 2
        if block is None:
            block = max(1, min(m, (128 * 2**20) // (8 * n)))
        tau_all = np.full(m, self.b - self.band)
        if gemm32:  # one float32 buffer for the blocks of W0
            w32 = np.empty((min(block, m), d), dtype=np.float32)
        for s in range(0, m, block):
            e = min(s + block, m)
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
            counts = count_candidates(self.V, self.inner, self.off, rows, tau_all[rows],
                                      self.nf[:, LEAF_ERR])
            if s == 0:  # size the pool from the first block, with a margin
                self.pool.reserve(int(1.3 * (counts.sum() + 4 * rows.shape[0]) * m
                                      / rows.shape[0]))
            self._place(rows, counts)
            fill_new_anchors(self.V, self.inner, self.off, rows, tau_all[rows],
                             self.nf[:, LEAF_ERR], U, self.seg, self.pool.arrays, self.b)
            if gemm32:  # the float32 values only chose the entries: recompute them
                _exact_entries_from_w(W0, X, rows, self.seg, self.pool.arrays)
                _reorder_after_exact(rows, self.seg, self.pool.arrays, self.b)

    # -- pool placement -------------------------------------------------------------
    def _place(self, rows: np.ndarray, counts: np.ndarray) -> None:
        """Give each neuron of ``rows`` a fresh segment of capacity >= its count."""
        caps = counts + counts // 4 + 4
        self.pool.reserve(int(caps.sum()))
        starts = self.pool.used + np.concatenate(([0], np.cumsum(caps)[:-1]))
        self.seg[rows, START] = starts
        self.seg[rows, CAP] = caps
        self.seg[rows, CNT] = 0
        self.pool.used += int(caps.sum())

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

    def firing_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return firing_csr(self.seg, self.pool.arrays, self.n)

    def materialize(self, W: np.ndarray) -> None:
        """``W <- W0 - C X`` in place (``W`` holds ``W0`` on entry)."""
        materialize(W, self.X, self.seg, self.pool.arrays, self.a, self.E, self.eta_s)

    # -- re-anchoring ---------------------------------------------------------------
    def reanchor(self, rows: np.ndarray):
        """Re-anchor neurons ``rows`` at the current time.

        Their rows are recomputed exactly (Gram identity from the float64
        anchored rows, or from ``W0`` when the rows are float32), written to
        their trees, and their entries become the ever-fired pairs plus the
        band around ``b``.  A pair outside the band may have crossed ``b``
        once the certificate expired: such flips are applied and returned as
        ``(r, j, value, on)`` arrays for the caller's bookkeeping.
        """
        out = [[] for _ in range(4)]
        chunk = max(1, (64 * 2**20) // (8 * self.n))
        for s in range(0, rows.shape[0], chunk):
            part = rows[s : s + chunk]
            exact = np.empty((part.shape[0], self.n))
            # an anchored row is exact if stored in float64 and not from a float32 GEMM
            from_anchor = (self.nf[part, LEAF_ERR] == 0.0) & (self.anchor_dtype == np.float64)
            exact[from_anchor] = self.V[part[from_anchor]]
            if not from_anchor.all():
                sub = np.flatnonzero(~from_anchor)
                exact[sub] = self.W0[part[sub]] @ self.X.T
            _gram_rows(part, exact, self.seg, self.pool.arrays, self.a, self.E, self.eta_s,
                       self.G, from_anchor)
            _maxtree.set_rows(self.V, self.inner, self.off, part, exact.astype(self.V.dtype))
            self.nf[part, LEAF_ERR] = 0.0
            tau = np.full(part.shape[0], self.b - self.band)
            counts = count_candidates(self.V, self.inner, self.off, part, tau,
                                      self.nf[:, LEAF_ERR])
            need = counts + _ever_not_in_band(part, exact, self.seg, self.pool.arrays,
                                              self.b - self.band)
            old = self.seg[part].copy()
            grow = need > old[:, CAP]
            if grow.any():
                self._place(part[grow], need[grow])
            for acc, arr in zip(out, _rebuild_entries(
                    part, old, exact, tau, self.V, self.inner, self.off, self.nf[:, LEAF_ERR],
                    self.seg, self.pool.arrays, self.a, self.E, self.eta_s, self.b),
                    strict=True):
                acc.append(arr)
        return tuple(np.concatenate(acc) for acc in out)


@njit(cache=True, parallel=True)
def _gram_rows(rows, out, seg, pool, a, E, eta_s, G, from_anchor):
    """Exact current rows by the Gram identity, in place.

    ``out[k]`` holds the anchored row (``from_anchor[k]``): subtract
    ``Σ_l (C_l - cref_l) G[l]``; or ``W0[r] Xᵀ``: subtract ``Σ_l C_l G[l]``.
    """
    ej, cref = pool[0], pool[5]
    n = out.shape[1]
    for k in prange(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        for p in range(seg[r, SUPP]):
            q = s0 + p
            c = _coef(q, r, pool, a, E, eta_s)
            if from_anchor[k]:
                c -= cref[q]
            if c != 0.0:
                g = ej[q]
                for j in range(n):
                    out[k, j] -= c * G[g, j]


@njit(cache=True)
def _ever_not_in_band(rows, exact, seg, pool, tau):
    """Ever-fired pairs of ``rows`` whose new anchored product is below ``tau``."""
    ej = pool[0]
    out = np.zeros(rows.shape[0], dtype=np.int64)
    for k in range(rows.shape[0]):
        r = rows[k]
        s0 = seg[r, START]
        for p in range(seg[r, SUPP]):
            if exact[k, ej[s0 + p]] < tau:
                out[k] += 1
    return out


@njit(cache=True)
def _rebuild_entries(rows, old, exact, tau, V, inner, off, leaf_err, seg, pool, a, E, eta_s, b):
    """Re-create the entries of re-anchored neurons from their exact rows.

    The ever-fired pairs stay (with ``cref`` set to their current
    coefficient); the other entries are the tree query at the lowered
    threshold.  A pair whose exact value disagrees with its firing flag is
    flipped here.  Returns the flips as ``(r, j, value, on)`` arrays.
    """
    ej, uref, val, key, kappa, cref, fire, clast = pool
    n = exact.shape[1]
    out_r = List.empty_list(types.int64)
    out_j = List.empty_list(types.int64)
    out_v = List.empty_list(types.float64)
    out_on = List.empty_list(types.boolean)
    mark = np.full(n, -1, dtype=np.int64)
    found = np.empty((n, 1), dtype=np.int64)
    for k in range(rows.shape[0]):
        r = rows[k]
        o_start, ns = old[k, START], old[k, SUPP]
        # copy the ever-fired pairs out first: the segment may be the same
        keep_j = ej[o_start : o_start + ns].copy()
        keep_kappa = kappa[o_start : o_start + ns].copy()
        keep_fire = fire[o_start : o_start + ns].copy()
        s0 = seg[r, START]
        pos = s0
        nfire = 0
        for p in range(ns):
            j = keep_j[p]
            c = keep_kappa[p]
            if keep_fire[p]:
                c += eta_s * _dot_row(a, r, E, j)
            ej[pos] = j
            uref[pos] = exact[k, j]
            val[pos] = exact[k, j]
            key[pos] = 0.0
            kappa[pos] = keep_kappa[p]
            cref[pos] = c
            clast[pos] = c
            fire[pos] = keep_fire[p]
            nfire += keep_fire[p]
            mark[j] = r
            pos += 1
        thr = _query_threshold(tau[k], leaf_err[r])
        cnt = _maxtree.report_row(V[r], inner[r], off, thr, found, 0, n, r)
        for f in range(cnt):
            j = found[f, 0]
            if mark[j] == r:
                continue
            ej[pos] = j
            uref[pos] = exact[k, j]
            val[pos] = exact[k, j]
            key[pos] = 0.0
            kappa[pos] = 0.0
            cref[pos] = 0.0
            clast[pos] = 0.0
            fire[pos] = False
            pos += 1
        seg[r, CNT] = pos - s0
        seg[r, SUPP] = ns
        seg[r, NFIRE] = nfire
        # the exact row may reveal pairs that crossed b (in increasing position
        # order, so that the swaps of _flip never move a pair still to visit)
        for q in range(s0, pos):
            now = val[q] >= b
            if now != fire[q]:
                j = ej[q]
                v = val[q]
                _flip(r, q, seg, pool, a, E, eta_s, now)
                out_r.append(r)
                out_j.append(j)
                out_v.append(v)
                out_on.append(now)
    k = len(out_r)
    fr = np.empty(k, dtype=np.int64)
    fj = np.empty(k, dtype=np.int64)
    fv = np.empty(k)
    fo = np.empty(k, dtype=np.bool_)
    for i in range(k):
        fr[i] = out_r[i]
        fj[i] = out_j[i]
        fv[i] = out_v[i]
        fo[i] = out_on[i]
    return fr, fj, fv, fo
