"""The NTK matrix of the current fire sets, and ``lr="auto"``.

For K outputs the matrix is ``H`` of size ``nK × nK`` with entries
``H[(i,k), (j,l)] = (1/m) · Σ_r a_rk · a_rl · F_ri · F_rj · G_ij``, ``F`` the
fire indicator and ``G = X Xᵀ``; for ``K = 1`` it is
``(FᵀF / m) ∘ G``.  Index ``(i, k)`` is ``i·K + k``, the row-major order of an
``(n, K)`` array.  Everything is computed from the sparse fire sets, in
``O(Σ_r k̃_r²·K²)`` time, never from an ``m × n`` dense array.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
from numba import njit, prange

from .. import _config
from ._sparse import transpose_csr

__all__ = [
    "dense_top_eigenvalue",
    "lambda_max",
    "lr_from_lambda",
    "ntk_matrix",
    "ntk_matvec",
    "top_eigenvalue",
]


@njit(cache=True, parallel=True)
def _ntk_dense(indptr_r, idx_r, indptr_i, idx_i, G, a, m):
    n = indptr_i.shape[0] - 1
    K = a.shape[1]
    H = np.zeros((n * K, n * K))
    for i in prange(n):
        for p in range(indptr_i[i], indptr_i[i + 1]):
            r = idx_i[p]
            for q in range(indptr_r[r], indptr_r[r + 1]):
                j = idx_r[q]
                for k in range(K):
                    for ll in range(K):
                        H[i * K + k, j * K + ll] += a[r, k] * a[r, ll]
        for j in range(n):
            g = G[i, j] / m
            for k in range(K):
                for ll in range(K):
                    H[i * K + k, j * K + ll] *= g
    return H


@njit(cache=True, parallel=True)
def _ntk_matvec(indptr_r, idx_r, indptr_i, idx_i, G, a, m, v):
    """``H v`` for ``v`` of shape ``(n, K)``; O(Σ_r k̃_r·(k̃_r + K))."""
    n = indptr_i.shape[0] - 1
    K = a.shape[1]
    q = np.empty(idx_r.shape[0])  # q[(r, j)] = a_r · v_j
    for r in prange(indptr_r.shape[0] - 1):
        for p in range(indptr_r[r], indptr_r[r + 1]):
            s = 0.0
            for k in range(K):
                s += a[r, k] * v[idx_r[p], k]
            q[p] = s
    out = np.zeros((n, K))
    for i in prange(n):
        for p in range(indptr_i[i], indptr_i[i + 1]):
            r = idx_i[p]
            s = 0.0
            for p2 in range(indptr_r[r], indptr_r[r + 1]):
                s += G[i, idx_r[p2]] * q[p2]
            for k in range(K):
                out[i, k] += a[r, k] * s
        for k in range(K):
            out[i, k] /= m
    return out


def ntk_matrix(
    indptr_r: np.ndarray, idx_r: np.ndarray, G: np.ndarray, a: np.ndarray, width: int | None = None
) -> np.ndarray:
    """Dense ``H`` (``nK × nK``) from r-major fire sets; O(Σ_r k̃_r²·K² + n²K²).

    ``width`` is the network's width ``m`` in ``1/m`` (default: the rows of ``a``;
    a shard's neurons give its share of ``H``, and the shares sum to ``H``).
    """
    n = G.shape[0]
    indptr_i, idx_i = transpose_csr(indptr_r, idx_r, n)
    m = float(a.shape[0] if width is None else width)
    return _ntk_dense(indptr_r, idx_r, indptr_i, idx_i, G, a, m)


@njit(cache=True, parallel=True)
def _pair_values(indptr_r, idx_r, X, a, v):
    """``c[p] = <x_j, z_r>`` for every firing pair ``p = (r, j)``, with
    ``z_r = Σ_{l ∈ S̃_r} <a_r, v_l> x_l``: the Gram sums of the NTK mat-vec as two
    passes over X, O(d) per pair, contiguous and vectorized."""
    d = X.shape[1]
    K = a.shape[1]
    c = np.empty(idx_r.shape[0])
    for r in prange(indptr_r.shape[0] - 1):
        lo, hi = indptr_r[r], indptr_r[r + 1]
        if lo == hi:
            continue
        z = np.zeros(d)
        for p in range(lo, hi):
            j = idx_r[p]
            s = 0.0
            for k in range(K):
                s += a[r, k] * v[j, k]
            for t in range(d):
                z[t] += s * X[j, t]
        for p in range(lo, hi):
            j = idx_r[p]
            s = 0.0
            for t in range(d):
                s += X[j, t] * z[t]
            c[p] = s
    return c


@njit(cache=True, parallel=True)
def _gather_pairs(t_indptr, t_r, t_pos, c, a, m, n):
    """``out[i] = (1/m) Σ_{pairs p of point i} a_{r(p)} c[p]`` (point-major)."""
    K = a.shape[1]
    out = np.zeros((n, K))
    for i in prange(n):
        for q in range(t_indptr[i], t_indptr[i + 1]):
            r, p = t_r[q], t_pos[q]
            for k in range(K):
                out[i, k] += a[r, k] * c[p]
        for k in range(K):
            out[i, k] /= m
    return out


@njit(cache=True)
def _transpose_positions(indptr_r, idx_r, n):
    """Point-major CSR of the pairs: for each point, its neurons and the pairs'
    positions in the neuron-major arrays."""
    t_indptr = np.zeros(n + 1, dtype=np.int64)
    for p in range(idx_r.shape[0]):
        t_indptr[idx_r[p] + 1] += 1
    for i in range(n):
        t_indptr[i + 1] += t_indptr[i]
    fill = t_indptr[:-1].copy()
    t_r = np.empty(idx_r.shape[0], dtype=np.int64)
    t_pos = np.empty(idx_r.shape[0], dtype=np.int64)
    for r in range(indptr_r.shape[0] - 1):
        for p in range(indptr_r[r], indptr_r[r + 1]):
            i = idx_r[p]
            t_r[fill[i]] = r
            t_pos[fill[i]] = p
            fill[i] += 1
    return t_indptr, t_r, t_pos


def ntk_matvec(
    indptr_r: np.ndarray,
    idx_r: np.ndarray,
    G: np.ndarray,
    a: np.ndarray,
    width: int | None = None,
    X: np.ndarray | None = None,
):
    """``v -> H v`` on flat vectors of length ``nK``, from the sparse fire sets;
    ``width`` as in :func:`ntk_matrix`.

    Two ways, whichever costs less: the Gram sums read from ``G``
    (O(Σ_r k̃_r²) scattered reads), or, with ``X`` given, rebuilt from the data
    (O(d·Σ_r k̃_r) contiguous, vectorized flops; a scattered read costs about
    :data:`~corrtree._config.SCATTER_COST` flops).
    """
    n, K = G.shape[0], a.shape[1]
    m = float(a.shape[0] if width is None else width)
    k = np.diff(indptr_r)
    if X is not None and _config.SCATTER_COST * float(np.dot(k, k)) > 2.0 * X.shape[1] * k.sum():
        t_indptr, t_r, t_pos = _transpose_positions(indptr_r, idx_r, n)

        def by_data(v: np.ndarray) -> np.ndarray:
            c = _pair_values(indptr_r, idx_r, X, a, v.reshape(n, K))
            return _gather_pairs(t_indptr, t_r, t_pos, c, a, m, n).ravel()

        return by_data
    indptr_i, idx_i = transpose_csr(indptr_r, idx_r, n)

    def by_gram(v: np.ndarray) -> np.ndarray:
        return _ntk_matvec(indptr_r, idx_r, indptr_i, idx_i, G, a, m, v.reshape(n, K)).ravel()

    return by_gram


def top_eigenvalue(order: int, matvec=None, H: np.ndarray | None = None) -> float:
    """Largest eigenvalue of a symmetric positive semi-definite operator of ``order``:
    LAPACK on the dense ``H`` when given, else Lanczos (ARPACK, tolerance 1e-4, a
    fixed random start vector, so the result is deterministic) on ``matvec``."""
    if H is not None:
        return float(scipy.linalg.eigvalsh(H, subset_by_index=[order - 1, order - 1])[0])
    op = scipy.sparse.linalg.LinearOperator((order, order), matvec=matvec, dtype=np.float64)
    # A generic start vector is not confined to an invariant subspace the way a
    # constant vector can be.
    v0 = np.random.default_rng(0).standard_normal(order)
    val = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=v0, tol=1e-4, return_eigenvectors=False)
    return float(val[0])


def lambda_max(
    indptr_r: np.ndarray,
    idx_r: np.ndarray,
    G: np.ndarray,
    a: np.ndarray,
    H: np.ndarray | None = None,
    width: int | None = None,
    X: np.ndarray | None = None,
) -> float:
    """Largest eigenvalue of the NTK matrix ``H`` of the given fire sets.

    Up to order :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT` ``H`` is formed (or
    taken from ``H``, which must be :func:`ntk_matrix` of the same fire sets) and
    LAPACK gives the eigenvalue; up to
    :data:`~corrtree._config.NTK_DENSE_MATVEC_LIMIT` Lanczos runs on the formed
    matrix (one BLAS mat-vec a step); beyond, Lanczos runs on the sparse mat-vec
    (:func:`top_eigenvalue`, :func:`ntk_matvec`; ``X`` lets it rebuild Gram sums
    from the data when that is cheaper).  The result is deterministic for given inputs.
    """
    order = G.shape[0] * a.shape[1]
    if idx_r.shape[0] == 0:
        return 0.0
    if H is None and order <= _config.NTK_DENSE_MATVEC_LIMIT:
        H = ntk_matrix(indptr_r, idx_r, G, a, width)
    if H is not None:
        return dense_top_eigenvalue(H)
    return top_eigenvalue(order, ntk_matvec(indptr_r, idx_r, G, a, width, X))


def dense_top_eigenvalue(H: np.ndarray) -> float:
    """``λ_max`` of a formed NTK matrix: LAPACK up to order
    :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT`, else Lanczos with one BLAS
    mat-vec per step."""
    order = H.shape[0]
    if order <= _config.NTK_DENSE_EIG_LIMIT:
        return top_eigenvalue(order, H=H)
    return top_eigenvalue(order, lambda v: H @ v)


def lr_from_lambda(lam: float) -> float:
    """``1 / λ_max``, or a ValueError when no pair fires (``λ_max = 0``)."""
    if not lam > 0:
        raise ValueError(
            "lr='auto' needs at least one firing pair (no neuron fires on the data at "
            "initialization); give lr explicitly or lower the threshold b"
        )
    return 1.0 / lam
