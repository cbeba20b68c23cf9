"""The kernel-space trainer: exact gradient descent through the NTK recurrence.

Beyond the paper (``DESIGN.md`` §4b).  With ``H(t)`` the NTK matrix of the
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
re-anchors the neuron if its band may be exceeded, and gives it a new key.
Per iteration: O((nK)² + work on the keyed neurons) -- no ``d``, and the
second term vanishes as the error decays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from .._validation import available_memory
from ._band import (
    BETA,
    CNT,
    DRIFT,
    KEY,
    MINKEY,
    NFIRE,
    SIGMA,
    START,
    SUPP,
    evaluate_neuron,
    prefetch_block,
    set_keys,
    update_sigma,
)
from ._ntk import ntk_matrix
from .lazy import BandTrainer

__all__ = ["KernelTrainer"]

_SAFE = 1.0 + 1e-12  # rounding margin on computed drifts


# ---------------------------------------------------------------------------
# A binary min-heap of (key, neuron), in flat arrays
# ---------------------------------------------------------------------------


@njit(cache=True)
def _less(keys, ids, i, j):
    return keys[i] < keys[j] or (keys[i] == keys[j] and ids[i] < ids[j])


@njit(cache=True)
def heap_push(keys, ids, size, key, r):
    i = size
    keys[i] = key
    ids[i] = r
    while i > 0:
        parent = (i - 1) // 2
        if _less(keys, ids, i, parent):
            keys[i], keys[parent] = keys[parent], keys[i]
            ids[i], ids[parent] = ids[parent], ids[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _sift_down(keys, ids, size, i):
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _less(keys, ids, left + 1, left):
            child = left + 1
        if _less(keys, ids, child, i):
            keys[i], keys[child] = keys[child], keys[i]
            ids[i], ids[child] = ids[child], ids[i]
            i = child
        else:
            break


@njit(cache=True)
def heapify(keys, ids, size):
    """Make ``keys[:size]`` a heap in O(size)."""
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(keys, ids, size, i)


@njit(cache=True)
def heap_pop(keys, ids, size):
    """Remove the top; returns the new size (the popped id is ``ids[size - 1]`` before)."""
    size -= 1
    keys[0], keys[size] = keys[size], keys[0]
    ids[0], ids[size] = ids[size], ids[0]
    _sift_down(keys, ids, size, 0)
    return size


@njit(cache=True)
def _count_due(keys, size, limit, cap):
    """``min(cap, number of keys <= limit)``, visiting only those nodes: O(result)."""
    if size == 0 or keys[0] > limit:
        return 0
    stack = np.empty(cap + 2, dtype=np.int64)
    stack[0] = 0
    top = 1
    count = 0
    while top > 0:
        top -= 1
        i = stack[top]
        count += 1
        if count >= cap:
            break
        for c in (2 * i + 1, 2 * i + 2):
            if c < size and keys[c] <= limit:
                stack[top] = c
                top += 1
    return count


@njit(cache=True)
def pop_due(keys, ids, size, limit):
    """Pop every neuron whose key is ``<= limit``; returns (sorted neurons, new size).

    O(k log size) for k due neurons, or O(size) (a filter and a heapify) when
    k > size/16, whichever is less.
    """
    cap = size // 16 + 1
    if _count_due(keys, size, limit, cap) < cap:
        k = 0
        due = np.empty(cap, dtype=np.int64)
        while size > 0 and keys[0] <= limit:
            due[k] = ids[0]
            k += 1
            size = heap_pop(keys, ids, size)
    else:
        due = np.empty(size, dtype=np.int64)
        k = 0
        keep = 0
        for i in range(size):
            if keys[i] <= limit:
                due[k] = ids[i]
                k += 1
            else:
                keys[keep] = keys[i]
                ids[keep] = ids[i]
                keep += 1
        size = keep
        heapify(keys, ids, size)
    due = due[:k].copy()
    due.sort()
    return due, size


@njit(cache=True)
def push_all(keys, ids, size, rows, nf):
    """Push the neurons of ``rows`` with a finite key: one by one, or appended and
    heapified (O(size)) when they are more than size/16."""
    bulk = rows.shape[0] > size // 16
    for k in range(rows.shape[0]):
        key = nf[rows[k], KEY]
        if np.isfinite(key):
            if bulk:
                keys[size] = key
                ids[size] = rows[k]
                size += 1
            else:
                size = heap_push(keys, ids, size, key, rows[k])
    if bulk:
        heapify(keys, ids, size)
    return size


# ---------------------------------------------------------------------------
# Processing the due neurons
# ---------------------------------------------------------------------------


@njit(cache=True)
def _new_key(r, seg, nf, pool, xnorm, b, R, P, per_p, since_anchor):
    """Key of neuron ``r``: the ``P`` at which one of its pairs may first change side.

    In drift units the neuron has this much room left: up to the next key of
    a pair outside its ever-fired prefix (``nf[r, MINKEY] - D_r``), to the
    nearest ever-fired pair (``|v - b|/||x_j||``, values just computed), and to
    its band (``(β - ||w_r - w_r(anchor)||·R)/R``).  The drift grows at most
    ``per_p·σ_r`` per unit of ``P``.
    """
    ej, val = pool[0], pool[2]
    s0 = seg[r, START]
    slack = min(nf[r, MINKEY] - nf[r, DRIFT], (nf[r, BETA] - since_anchor * R) / R)
    for q in range(s0, s0 + seg[r, SUPP]):
        xn = xnorm[ej[q]]
        if xn > 0:
            slack = min(slack, abs(val[q] - b) / xn)
    rate = per_p * nf[r, SIGMA]
    return P + max(slack, 0.0) / rate if rate > 0 else np.inf


@njit(cache=True, parallel=True)
def process(due, seg, nf, pool, scratch, a, E, G, xnorm, eta_s, b, R, P, per_p, cert,
            fbuf_ptr, f_j, f_v, f_on, reanchor):
    """Bring the due neurons up to date at the current time.

    :func:`~._band.evaluate_neuron` evaluates and flips the pairs that may
    have changed side, writing the flips of ``due[k]`` to
    ``f_*[fbuf_ptr[k]:]`` (−1 ends the list).  The neuron is flagged for
    re-anchoring if its band may be exceeded, else it gets a new key.
    """
    ej = pool[0]
    no_err = np.empty((0, a.shape[1]))
    for k in prange(due.shape[0]):
        r = due[k]
        if k + 1 < due.shape[0]:
            prefetch_block(due[k + 1], seg, ej, G)
        pos, since_anchor = evaluate_neuron(r, seg, nf, pool, scratch, a, E, no_err, G, xnorm,
                                            eta_s, b, cert, f_j, f_v, f_on, fbuf_ptr[k])
        if pos < fbuf_ptr[k + 1]:
            f_j[pos] = -1
        reanchor[k] = since_anchor * R >= nf[r, BETA]
        if not reanchor[k]:
            nf[r, KEY] = _new_key(r, seg, nf, pool, xnorm, b, R, P, per_p, since_anchor)


@njit(cache=True, inline="always")
def _add_pair(H, a, r, j, i, g):
    K = a.shape[1]
    for k in range(K):
        for k2 in range(K):
            c = g * a[r, k] * a[r, k2]
            H[j * K + k, i * K + k2] += c
            H[i * K + k2, j * K + k] += c


@njit(cache=True, inline="always")
def _add_diag(H, a, r, j, g):
    K = a.shape[1]
    for k in range(K):
        for k2 in range(K):
            H[j * K + k, j * K + k2] += g * a[r, k] * a[r, k2]


@njit(cache=True)
def apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m):
    """Add flips (grouped by neuron, already applied to the pool) to ``u`` and ``H``.

    For each neuron the fire set before its flips is rebuilt from the pool,
    then the flips are added one by one: turning ``j`` on adds, for every
    point ``l`` then firing with ``r``, ``G[j, l]/m·a_r a_rᵀ`` to the
    ``(j, l)`` and ``(l, j)`` blocks of ``H`` (and ``G[j, j]/m`` to
    ``(j, j)``); turning it off removes the same.  Returns the changes of the
    fired-pair and moved-neuron counts.
    """
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
        s0 = seg[r, START]
        cur = np.empty(seg[r, NFIRE] + (stop - i), dtype=np.int64)
        nc = 0
        for q in range(s0, s0 + seg[r, SUPP]):  # fire set after the flips
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
        before = nc
        for f in range(i, stop):
            j = fj[f]
            if fon[f]:
                sign = 1.0
            else:
                sign = -1.0
                for c in range(nc):  # leave the set first
                    if cur[c] == j:
                        cur[c] = cur[nc - 1]
                        nc -= 1
                        break
            for c in range(nc):
                _add_pair(H, a, r, j, cur[c], sign * G[j, cur[c]] / m)
            _add_diag(H, a, r, j, sign * G[j, j] / m)
            if fon[f]:
                cur[nc] = j
                nc += 1
            z = sign * scale * (fv[f] - b)
            for k in range(K):
                u[j, k] += a[r, k] * z
        d_fired += nc - before
        d_moved += (nc > 0) - (before > 0)
        i = stop
    return d_fired, d_moved


@njit(cache=True, parallel=True)
def anchor_keys(rows, seg, nf, pool, xnorm, b, R, P, per_p):
    """Pair keys and neuron keys of freshly anchored neurons (all values current)."""
    for k in prange(rows.shape[0]):
        r = rows[k]
        set_keys(r, seg, nf, pool, xnorm, b)
        nf[r, KEY] = _new_key(r, seg, nf, pool, xnorm, b, R, P, per_p, 0.0)


@njit(cache=True)
def gather_flips(due, fbuf_ptr, f_j, f_v, f_on):
    """The flips written by :func:`process`, as neuron-grouped arrays."""
    n = 0
    for k in range(due.shape[0]):
        for p in range(fbuf_ptr[k], fbuf_ptr[k + 1]):
            if f_j[p] < 0:
                break
            n += 1
    fr = np.empty(n, dtype=np.int64)
    fj = np.empty(n, dtype=np.int64)
    fv = np.empty(n)
    fo = np.empty(n, dtype=np.bool_)
    i = 0
    for k in range(due.shape[0]):
        for p in range(fbuf_ptr[k], fbuf_ptr[k + 1]):
            if f_j[p] < 0:
                break
            fr[i] = due[k]
            fj[i] = f_j[p]
            fv[i] = f_v[p]
            fo[i] = f_on[p]
            i += 1
    return fr, fj, fv, fo


class KernelTrainer(BandTrainer):
    """Exact GD whose per-iteration cost grows with neither ``m`` nor ``d`` (module docs;
    options: :class:`~.lazy.BandTrainer`)."""

    name = "kernel"

    def __init__(self, model, X, Y, G, **options: Any) -> None:
        n, K = X.shape[0], model.outputs
        need = 8.0 * (n * K) ** 2
        if need > 0.5 * available_memory():
            raise MemoryError(f"method='kernel' needs {need / 2**30:.2f} GiB for the "
                              f"{n * K}×{n * K} NTK matrix; use method='lazy'")
        super().__init__(model, X, Y, G, **options)
        st = self.state
        self.H = ntk_matrix(*st.firing_csr(), G, self.a)
        self.P = 0.0
        self.fired = st.fired_pairs()
        self.moved = st.moved_neurons()
        self.entries = st.entries()
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_size = -1  # filled at the first step, once lr is known

    def ntk(self) -> np.ndarray:
        return self.H

    def _per_p(self) -> float:
        return self.lr * self.scale * math.sqrt(self.a.shape[1]) * self.cert * _SAFE

    def step(self) -> dict[str, Any]:
        st = self.state
        st.eta_s = self.lr * self.scale
        if self.heap_size < 0:
            every = np.arange(self.m)
            anchor_keys(every, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b, st.R, self.P,
                        self._per_p())
            self.heap_size = push_all(self.heap_keys, self.heap_ids, 0, every, st.nf)
        err, loss = self._loss(self.u)
        row = {"loss": loss, "fired_pairs": self.fired, "moved_neurons": self.moved,
               "flips": self.flips, "band_pairs": self.entries}
        with self.timer("forward"):
            self.u -= self.lr * (self.H @ err.ravel()).reshape(self.u.shape)
            st.E += err
            self.P += float(np.sqrt(np.einsum("ik,ik->", err, err))) * _SAFE
        with self.timer("query"):
            due, self.heap_size = pop_due(self.heap_keys, self.heap_ids, self.heap_size,
                                          self.P)
            fbuf = np.zeros(due.shape[0] + 1, dtype=np.int64)
            np.cumsum(st.seg[due, CNT], out=fbuf[1:])
            f_j = np.empty(fbuf[-1], dtype=np.int64)
            f_v = np.empty(fbuf[-1])
            f_on = np.empty(fbuf[-1], dtype=np.bool_)
            again = np.zeros(due.shape[0], dtype=np.bool_)
            process(due, st.seg, st.nf, st.pool.arrays, self._scratch(), self.a, st.E, self.G,
                    st.xnorm, st.eta_s, st.b, st.R, self.P, self._per_p(), self.cert, fbuf,
                    f_j, f_v, f_on, again)
        with self.timer("update"):
            self.flips = self._apply(gather_flips(due, fbuf, f_j, f_v, f_on))
            rows = due[again]
            if rows.shape[0]:
                before = int(st.seg[rows, CNT].sum())
                self.flips += self._apply(st.reanchor(rows))
                update_sigma(rows, st.seg, st.nf, st.pool.arrays, self.G)
                anchor_keys(rows, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b, st.R, self.P,
                            self._per_p())
                self.entries += int(st.seg[rows, CNT].sum()) - before
            self.heap_size = push_all(self.heap_keys, self.heap_ids, self.heap_size, due, st.nf)
        row["reanchored"] = int(rows.shape[0])
        row.update(self.timer.pop())
        return row

    def _apply(self, flips: tuple[np.ndarray, ...]) -> int:
        """Add flips to ``u`` and ``H`` and to the counts; returns their number."""
        fr, fj, fv, fon = flips
        d_fired, d_moved = apply_flips(fr, fj, fv, fon, self.state.seg, self.state.pool.arrays,
                                       self.u, self.H, self.a, self.G, self.b, self.scale,
                                       float(self.m))
        self.fired += d_fired
        self.moved += d_moved
        return int(fr.shape[0])
