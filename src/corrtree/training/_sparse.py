"""Numba kernels over sparse fire sets shared by the trainers.

Fire sets are CSR pairs ``(indptr, idx)``: "r-major" has one row per neuron
(``S̃_r``, the points it fires on), "i-major" one row per data point
(``S_i``, the neurons that fire on it).  Indices inside a row are sorted.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import njit
from ._pool import CNT, NFIRE, START

__all__ = [
    "count_changed",
    "firing_csr",
    "keys_to_csr",
    "outputs_from_products",
    "stepped_rows",
    "transpose_csr",
]


@njit(cache=True)
def keys_to_csr(keys, n_rows, n_cols):
    """CSR of sorted pair keys ``row * n_cols + col``."""
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    idx = np.empty(keys.shape[0], dtype=np.int64)
    for p in range(keys.shape[0]):
        row = keys[p] // n_cols
        idx[p] = keys[p] - row * n_cols
        indptr[row + 1] += 1
    for r in range(n_rows):
        indptr[r + 1] += indptr[r]
    return indptr, idx


@njit(cache=True)
def transpose_csr(indptr, idx, n_cols):
    """The transpose of a CSR pattern (counting sort; rows stay sorted).  O(nnz + n_cols)."""
    n_rows = indptr.shape[0] - 1
    t_indptr = np.zeros(n_cols + 1, dtype=np.int64)
    for p in range(idx.shape[0]):
        t_indptr[idx[p] + 1] += 1
    for c in range(n_cols):
        t_indptr[c + 1] += t_indptr[c]
    fill = t_indptr[:-1].copy()
    t_idx = np.empty(idx.shape[0], dtype=np.int64)
    for r in range(n_rows):
        for p in range(indptr[r], indptr[r + 1]):
            c = idx[p]
            t_idx[fill[c]] = r
            fill[c] += 1
    return t_indptr, t_idx


@njit(cache=True)
def count_changed(indptr_a, idx_a, indptr_b, idx_b):
    """Size of the symmetric difference of two CSR patterns with the same rows."""
    changed = 0
    for r in range(indptr_a.shape[0] - 1):
        p, q = indptr_a[r], indptr_b[r]
        pe, qe = indptr_a[r + 1], indptr_b[r + 1]
        while p < pe and q < qe:
            if idx_a[p] == idx_b[q]:
                p += 1
                q += 1
            elif idx_a[p] < idx_b[q]:
                changed += 1
                p += 1
            else:
                changed += 1
                q += 1
        changed += (pe - p) + (qe - q)
    return changed


@njit(cache=True, parallel=True)
def outputs_from_products(indptr_i, idx_i, V, by_point, a, b, scale):
    """``u[i] = scale · Σ_{r ∈ S_i} a[r] · (U[r, i] - b)`` from stored products.

    ``V`` holds ``U[r, i]`` as ``V[i, r]`` when ``by_point`` (DTree layout) and
    as ``V[r, i]`` otherwise (WTree layout).  O(Σ_i k_i · K).
    """
    n = indptr_i.shape[0] - 1
    K = a.shape[1]
    u = np.zeros((n, K))
    for i in prange(n):
        for p in range(indptr_i[i], indptr_i[i + 1]):
            r = idx_i[p]
            z = (V[i, r] if by_point else V[r, i]) - b
            for k in range(K):
                u[i, k] += a[r, k] * z
        for k in range(K):
            u[i, k] *= scale
    return u


@njit(cache=True, parallel=True)
def stepped_rows(base, rows, indptr_r, idx_r, X, a, err, step):
    """``base[k] - step · Σ_{i ∈ S̃_r} (a_r · err_i) · x_i`` for ``r = rows[k]``, as a
    new ``(len(rows), d)`` array.  O(Σ_r k̃_r · (d + K))."""
    d = X.shape[1]
    K = a.shape[1]
    out = np.empty((rows.shape[0], d))
    for k in prange(rows.shape[0]):
        r = rows[k]
        for q in range(d):
            out[k, q] = base[k, q]
        for p in range(indptr_r[r], indptr_r[r + 1]):
            i = idx_r[p]
            c = 0.0
            for kk in range(K):
                c += a[r, kk] * err[i, kk]
            c *= step
            for q in range(d):
                out[k, q] -= c * X[i, q]
    return out


@njit(cache=True, parallel=True)
def firing_csr(seg, pool, n):
    """r-major CSR of the current fire sets, indices sorted; the neurons in parallel."""
    ej, fire = pool.j, pool.fire
    m = seg.shape[0]
    indptr = np.zeros(m + 1, dtype=np.int64)
    for r in range(m):
        indptr[r + 1] = indptr[r] + seg[r, NFIRE]
    idx = np.empty(indptr[m], dtype=np.int64)
    for r in prange(m):
        pos = indptr[r]
        s0 = seg[r, START]
        for q in range(s0, s0 + seg[r, CNT]):
            if fire[q]:
                idx[pos] = ej[q]
                pos += 1
        idx[indptr[r] : indptr[r + 1]].sort()
    return indptr, idx
