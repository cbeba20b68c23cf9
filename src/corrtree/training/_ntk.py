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
    "auto_lr",
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


def ntk_matvec(
    indptr_r: np.ndarray, idx_r: np.ndarray, G: np.ndarray, a: np.ndarray, width: int | None = None
):
    """``v -> H v`` on flat vectors of length ``nK``, from the sparse fire sets
    (O(Σ_r k̃_r·(k̃_r + K)) per product, parallel); ``width`` as in :func:`ntk_matrix`."""
    n, K = G.shape[0], a.shape[1]
    indptr_i, idx_i = transpose_csr(indptr_r, idx_r, n)
    m = float(a.shape[0] if width is None else width)

    def matvec(v: np.ndarray) -> np.ndarray:
        return _ntk_matvec(indptr_r, idx_r, indptr_i, idx_i, G, a, m, v.reshape(n, K)).ravel()

    return matvec


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
) -> float:
    """Largest eigenvalue of the NTK matrix ``H`` of the given fire sets.

    Up to order :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT` ``H`` is formed (or
    taken from ``H``, which must be :func:`ntk_matrix` of the same fire sets) and
    LAPACK gives the eigenvalue; beyond, Lanczos runs on the sparse mat-vec
    (:func:`top_eigenvalue`).  The result is deterministic for given inputs.
    """
    order = G.shape[0] * a.shape[1]
    if idx_r.shape[0] == 0:
        return 0.0
    if order <= _config.NTK_DENSE_EIG_LIMIT:
        return top_eigenvalue(order, H=ntk_matrix(indptr_r, idx_r, G, a, width) if H is None else H)
    return top_eigenvalue(order, ntk_matvec(indptr_r, idx_r, G, a, width))


def lr_from_lambda(lam: float) -> float:
    """``1 / λ_max``, or a ValueError when no pair fires (``λ_max = 0``)."""
    if not lam > 0:
        raise ValueError(
            "lr='auto' needs at least one firing pair (no neuron fires on the data at "
            "initialization); give lr explicitly or lower the threshold b"
        )
    return 1.0 / lam


def auto_lr(
    indptr_r: np.ndarray,
    idx_r: np.ndarray,
    G: np.ndarray,
    a: np.ndarray,
    H: np.ndarray | None = None,
    width: int | None = None,
) -> float:
    """``lr="auto"``: ``1 / λ_max`` of the NTK matrix of the fire sets (see :func:`lambda_max`).

    Raises
    ------
    ValueError
        If no pair fires (``λ_max = 0``).
    """
    return lr_from_lambda(lambda_max(indptr_r, idx_r, G, a, H, width))
