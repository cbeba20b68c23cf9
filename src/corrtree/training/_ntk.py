"""The NTK matrix of the current fire sets, and ``lr="auto"``.

For K outputs the matrix is ``H`` of size ``nK × nK`` with entries
``H[(i,k), (j,l)] = (1/m) · Σ_r a_rk · a_rl · F_ri · F_rj · G_ij``, ``F`` the
fire indicator and ``G = X Xᵀ``; for ``K = 1`` it is
``(FᵀF / m) ∘ G``.  Index ``(i, k)`` is ``i·K + k``, the row-major order of an
``(n, K)`` array.  Everything is computed from the sparse fire sets, in
``O(Σ_r k̃_r²·K²)`` time, never from an ``m × n`` dense array; where the fire sets
are dense (one output), the counts ``FᵀF`` come from float32 GEMMs of blocks of their
0/1 rows instead (:func:`ntk_cost`).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
from numba import prange

from .. import _config
from .._jit import njit
from ._sparse import transpose_csr

__all__ = [
    "NTKOperator",
    "dense_top_eigenvalue",
    "gemm_adds",
    "lambda_max",
    "lr_from_lambda",
    "ntk_cost",
    "ntk_matrix",
    "ntk_matvec",
    "top_eigenvalue",
    "warm_start",
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


@njit(cache=True, parallel=True)
def _fire_rows(indptr_r, idx_r, start, out):
    """``out[k]`` = the 0/1 fire row of neuron ``start + k`` (float32).  O(rows·n)."""
    for k in prange(out.shape[0]):
        out[k, :] = 0.0
        r = start + k
        for p in range(indptr_r[r], indptr_r[r + 1]):
            out[k, idx_r[p]] = 1.0


def ntk_cost(a: np.ndarray, n: int, pairs_sq: float) -> tuple[float, bool]:
    """What :func:`ntk_matrix` costs, in scattered additions, and whether it counts
    ``FᵀF`` by float32 GEMMs of 0/1 rows: ``2·m·n²`` flops at
    :data:`~corrtree._config.NTK_COUNT_GEMM_FLOPS`, against ``pairs_sq = Σ_r k̃_r²·K²``
    additions at :data:`~corrtree._config.NTK_COUNT_ADDS`.  The GEMMs only with one
    output whose weights are all ``±1`` (the counts are then ``H``'s factor, as the
    additions make it), and they pay where the fire sets are dense (low-dimensional
    tabular data: a neuron fires on a fifth of the points).  O(m)."""
    gemm = gemm_adds(a, n)
    return min(gemm, pairs_sq), gemm < pairs_sq


def gemm_adds(a: np.ndarray, n: int) -> float:
    """The GEMMs' cost in :func:`ntk_cost`'s additions, ``inf`` where they may not be used
    (more than one output, or weights other than ``±1``): it depends on the output
    weights only, so a trainer reads it once.  O(m)."""
    m, K = a.shape
    if K != 1 or not bool((a[:, 0] * a[:, 0] == 1.0).all()):
        return np.inf
    return 2.0 * m * n * n * _config.NTK_COUNT_ADDS / _config.NTK_COUNT_GEMM_FLOPS


def _counts_gemm(indptr_r: np.ndarray, idx_r: np.ndarray, n: int) -> np.ndarray:
    """``FᵀF`` (float64, ``n × n``) of the 0/1 fire matrix, by float32 GEMMs of blocks of
    rows: a block has fewer than ``2^24`` rows, so its counts are integers float32
    holds exactly, and their float64 sum is exact.  O(m·n²) flops, O(block·n) memory."""
    m = indptr_r.shape[0] - 1
    rows = _config.block_rows(4.0 * n, m, _config.NTK_COUNT_BLOCK_BYTES)
    rows = min(rows, 2**24 - 1)
    block = np.empty((rows, n), dtype=np.float32)
    N = np.zeros((n, n))
    for s in range(0, m, rows):
        part = block[: min(rows, m - s)]
        _fire_rows(indptr_r, idx_r, s, part)
        N += part.T @ part
    return N


def ntk_matrix(
    indptr_r: np.ndarray, idx_r: np.ndarray, G: np.ndarray, a: np.ndarray, width: int | None = None
) -> np.ndarray:
    """Dense ``H`` (``nK × nK``) from r-major fire sets; O(Σ_r k̃_r²·K² + n²K²), or with
    one output of weights ``±1`` and dense fire sets O(m·n²) float32 GEMM flops
    (:func:`ntk_cost`): the same integer counts times ``G/m``, so the same matrix bit
    for bit.

    ``width`` is the network's width ``m`` in ``1/m`` (default: the rows of ``a``;
    a shard's neurons give its share of ``H``, and the shares sum to ``H``).
    """
    n = G.shape[0]
    m = float(a.shape[0] if width is None else width)
    k = np.diff(indptr_r).astype(np.float64)
    if ntk_cost(a, n, float(np.dot(k, k)))[1]:
        return _counts_gemm(indptr_r, idx_r, n) * (G / m)
    indptr_i, idx_i = transpose_csr(indptr_r, idx_r, n)
    return _ntk_dense(indptr_r, idx_r, indptr_i, idx_i, G, a, m)


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _ntk_matvec_data(indptr_r, idx_r, X32, a32, v32, bounds, m):
    """``H v`` with the Gram sums rebuilt from the data, in float32: for each neuron
    ``z_r = Σ_{l ∈ S̃_r} <a_r, v_l> x_l`` and then ``<x_j, z_r>`` for its points,
    O(d + K) per pair, contiguous and vectorized.

    Chunk ``c`` (neurons ``bounds[c]:bounds[c + 1]``) adds its pairs into its own
    float64 buffer, and the buffers are summed in chunk order: no write races, and
    the result does not depend on the number of threads.
    """
    n, d = X32.shape
    K = a32.shape[1]
    chunks = bounds.shape[0] - 1
    part = np.zeros((chunks, n, K))
    for c in prange(chunks):
        z = np.empty(d, dtype=np.float32)
        for r in range(bounds[c], bounds[c + 1]):
            lo, hi = indptr_r[r], indptr_r[r + 1]
            if lo == hi:
                continue
            z[:] = 0.0
            for p in range(lo, hi):
                j = idx_r[p]
                s = np.float32(0.0)
                for k in range(K):
                    s += a32[r, k] * v32[j, k]
                for t in range(d):
                    z[t] += s * X32[j, t]
            for p in range(lo, hi):
                j = idx_r[p]
                s = np.float32(0.0)
                for t in range(d):
                    s += X32[j, t] * z[t]
                for k in range(K):
                    part[c, j, k] += a32[r, k] * s
    out = np.zeros((n, K))
    for i in prange(n):
        for c in range(chunks):
            for k in range(K):
                out[i, k] += part[c, i, k]
        for k in range(K):
            out[i, k] /= m
    return out


def _work_bounds(indptr_r: np.ndarray, chunks: int) -> np.ndarray:
    """Neuron boundaries of ``chunks`` runs with about equal numbers of pairs."""
    targets = np.linspace(0, indptr_r[-1], chunks + 1)
    bounds = np.searchsorted(indptr_r, targets).astype(np.int64)
    bounds[0], bounds[-1] = 0, indptr_r.shape[0] - 1
    return bounds


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
    :func:`~corrtree._config.scatter_cost` flops).  The second way computes in
    float32, twice the throughput of float64: its relative error, about
    ``d·2⁻²⁴``, is far below the 1e-4 tolerance of :func:`top_eigenvalue`, and it
    is deterministic, so every method gets the same ``lr``.
    """
    n, K = G.shape[0], a.shape[1]
    m = float(a.shape[0] if width is None else width)
    k = np.diff(indptr_r)
    if X is not None and _config.scatter_cost(n) * float(np.dot(k, k)) > 2.0 * X.shape[1] * k.sum():
        X32, a32 = X.astype(np.float32), a.astype(np.float32)
        bounds = _work_bounds(indptr_r, _config.NTK_MATVEC_CHUNKS)

        def by_data(v: np.ndarray) -> np.ndarray:
            v32 = v.reshape(n, K).astype(np.float32)
            return _ntk_matvec_data(indptr_r, idx_r, X32, a32, v32, bounds, m).ravel()

        return by_data
    indptr_i, idx_i = transpose_csr(indptr_r, idx_r, n)

    def by_gram(v: np.ndarray) -> np.ndarray:
        return _ntk_matvec(indptr_r, idx_r, indptr_i, idx_i, G, a, m, v.reshape(n, K)).ravel()

    return by_gram


def top_eigenvalue(
    order: int, matvec=None, H: np.ndarray | None = None, v0: np.ndarray | None = None
) -> float:
    """Largest eigenvalue of a symmetric positive semi-definite operator of ``order``:
    LAPACK on the dense ``H`` when given, else Lanczos (ARPACK, tolerance 1e-4, a
    basis of :data:`~corrtree._config.NTK_LANCZOS_BASIS` vectors) on ``matvec`` from
    ``v0`` (default: a fixed random vector, so the result is deterministic)."""
    if H is not None:
        return float(scipy.linalg.eigvalsh(H, subset_by_index=[order - 1, order - 1])[0])
    return _lanczos(order, matvec, v0, 1e-4)[0]


def _lanczos(order: int, matvec, v0: np.ndarray | None, tol: float) -> tuple[float, np.ndarray]:
    """Top eigenpair of a symmetric operator by ARPACK's Lanczos to ``tol``; ``order``
    at least 2."""
    op = scipy.sparse.linalg.LinearOperator((order, order), matvec=matvec, dtype=np.float64)
    if v0 is None:
        # A generic start vector is not confined to an invariant subspace the way a
        # constant vector can be.
        v0 = np.random.default_rng(0).standard_normal(order)
    basis = min(order, _config.NTK_LANCZOS_BASIS)
    val, vec = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=v0, tol=tol, ncv=basis)
    return float(val[0]), vec[:, 0]


@njit(cache=True, parallel=True)
def _fire_set_norms(indptr_r, idx_r, X, u, bounds):
    """``||Σ_{j ∈ S̃_r} u_j x_j||²`` (``= u_Sᵀ G_SS u_S``) for every neuron ``r``, in
    float64; O(d·Σ_r k̃_r), the runs of neurons ``bounds`` in parallel."""
    d = X.shape[1]
    out = np.zeros(indptr_r.shape[0] - 1)
    for c in prange(bounds.shape[0] - 1):
        z = np.empty(d)
        for r in range(bounds[c], bounds[c + 1]):
            z[:] = 0.0
            for p in range(indptr_r[r], indptr_r[r + 1]):
                j = idx_r[p]
                for t in range(d):
                    z[t] += u[j] * X[j, t]
            s = 0.0
            for t in range(d):
                s += z[t] * z[t]
            out[r] = s
    return out


def _csr_rows(
    indptr: np.ndarray, idx: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The CSR pattern of the rows ``rows`` of ``(indptr, idx)``; O(len(rows) + their nnz)."""
    counts = indptr[rows + 1] - indptr[rows]
    sub_ptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=sub_ptr[1:])
    at = np.arange(sub_ptr[-1]) + np.repeat(indptr[rows] - sub_ptr[:-1], counts)
    return sub_ptr, idx[at]


class NTKOperator:
    """The NTK matrix ``H`` of given fire sets as the three products that
    :func:`warm_start` and Lanczos need, each one network's (or one shard's) share:
    the shares of the neurons of a network sum to the network's products.

    Parameters
    ----------
    indptr_r, idx_r : ndarray
        r-major CSR of the fire sets.
    G, a, X : ndarray
        ``X Xᵀ``, the output weights ``(m, K)`` and the data ``(n, d)``.
    width : int, optional
        The network's ``m`` (default: the rows of ``a``), as in :func:`ntk_matrix`.

    Attributes
    ----------
    matvec : callable
        ``v -> H v`` (:func:`ntk_matvec`), ``v`` of length ``nK``.
    sample_matvec : callable
        ``v -> M v`` for the ``n × n`` output-averaged NTK ``M`` of every
        ``width / NTK_WARM_NEURONS``-th neuron: ``(1/m) Σ_r (|a_r|²/K)·F_ri F_rj G_ij``,
        about ``NTK_WARM_NEURONS / m`` the cost of ``matvec``.
    """

    def __init__(
        self,
        indptr_r: np.ndarray,
        idx_r: np.ndarray,
        G: np.ndarray,
        a: np.ndarray,
        X: np.ndarray,
        width: int | None = None,
    ) -> None:
        self._fire, self._a, self._X = (indptr_r, idx_r), a, X
        self._width = a.shape[0] if width is None else width
        self.matvec = ntk_matvec(indptr_r, idx_r, G, a, self._width, X)
        stride = max(1, self._width // _config.NTK_WARM_NEURONS)
        rows = np.arange(0, a.shape[0], stride)
        mean_a = np.sqrt(np.mean(a[rows] ** 2, axis=1))[:, None]
        sample = _csr_rows(indptr_r, idx_r, rows)
        self.sample_matvec = ntk_matvec(*sample, G, mean_a, self._width, X)

    def ritz(self, u: np.ndarray) -> np.ndarray:
        """The ``K × K`` Ritz matrix ``C_kl = (u ⊗ e_k)ᵀ H (u ⊗ e_l)
        = (1/m) Σ_r a_rk a_rl ||Σ_{j ∈ S̃_r} u_j x_j||²`` of a unit ``u`` of length
        ``n``; O(d·Σ_r k̃_r + m·K²)."""
        bounds = _work_bounds(self._fire[0], _config.NTK_MATVEC_CHUNKS)
        norms = _fire_set_norms(*self._fire, self._X, u, bounds)
        return (self._a.T * norms) @ self._a / self._width


def warm_start(n: int, outputs: int, sample_matvec, ritz) -> np.ndarray:
    """A start vector ``u ⊗ c`` for Lanczos on the NTK matrix (order ``n·outputs``),
    from two of the products of :class:`NTKOperator`.

    For wide networks ``H`` is close to ``M ⊗ I_K``, ``M`` the output-averaged NTK:
    its top ``K`` eigenvalues cluster, with eigenvectors near ``u ⊗ c``, ``u`` the
    top eigenvector of ``M``.  ``u`` comes from a sample of the neurons (cheap
    mat-vecs, loose tolerance), ``c`` from the ``K × K`` Ritz matrix of the
    ``u ⊗ e_k``; a share :data:`~corrtree._config.NTK_WARM_NOISE` of a fixed random
    vector keeps the start off any invariant subspace.  Deterministic.
    """
    rng = np.random.default_rng(0)
    u = rng.standard_normal(n)
    u /= np.linalg.norm(u)
    if n >= 2 and sample_matvec(u).any():  # else the sample fires nowhere: keep u
        u = _lanczos(n, sample_matvec, u, _config.NTK_WARM_TOL)[1]
    c = np.linalg.eigh(ritz(u))[1][:, -1]
    noise = rng.standard_normal(n * outputs)
    return np.outer(u, c).ravel() + _config.NTK_WARM_NOISE / np.linalg.norm(noise) * noise


def formed_is_used(H: np.ndarray | None) -> bool:
    """Whether :func:`lambda_max` takes ``λ_max`` from the formed matrix ``H`` alone
    (it is given and of order at most :data:`~corrtree._config.NTK_DENSE_MATVEC_LIMIT`),
    so that the fire sets need not be built."""
    return H is not None and H.shape[0] <= _config.NTK_DENSE_MATVEC_LIMIT


def lambda_max(
    indptr_r: np.ndarray | None,
    idx_r: np.ndarray | None,
    G: np.ndarray,
    a: np.ndarray,
    X: np.ndarray,
    H: np.ndarray | None = None,
    width: int | None = None,
) -> float:
    """Largest eigenvalue of the NTK matrix ``H`` of the given fire sets.

    Up to order :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT` ``H`` is formed (or
    taken from ``H``, which must be :func:`ntk_matrix` of the same fire sets) and
    LAPACK gives the eigenvalue; up to
    :data:`~corrtree._config.NTK_DENSE_MATVEC_LIMIT` Lanczos runs on the formed
    matrix (one BLAS mat-vec a step); beyond, Lanczos runs on the sparse mat-vec from
    a warm start (:func:`warm_start`, :class:`NTKOperator`; the data ``X``
    rebuilds Gram sums when that is cheaper), whether or not ``H`` is given: the sparse
    mat-vec reads far less than ``8·order²`` bytes, and every method then takes
    the same way.  The result is deterministic for given inputs.  The fire sets are
    not read (and may be ``None``) when :func:`formed_is_used` of ``H``.
    """
    order = G.shape[0] * a.shape[1]
    if H is not None and formed_is_used(H):  # H = 0 exactly when no pair fires
        return dense_top_eigenvalue(H) if H.any() else 0.0
    if indptr_r is None or idx_r is None:
        raise ValueError("lambda_max needs the fire sets unless H is formed and used")
    if idx_r.shape[0] == 0:
        return 0.0
    if order > _config.NTK_DENSE_MATVEC_LIMIT:  # even when H is given: one way for all
        op = NTKOperator(indptr_r, idx_r, G, a, X, width)
        v0 = warm_start(G.shape[0], a.shape[1], op.sample_matvec, op.ritz)
        return top_eigenvalue(order, op.matvec, v0=v0)
    return dense_top_eigenvalue(ntk_matrix(indptr_r, idx_r, G, a, width))


def dense_top_eigenvalue(H: np.ndarray) -> float:
    """``λ_max`` of a formed NTK matrix: LAPACK up to order
    :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT`, else Lanczos with one BLAS
    mat-vec per step."""
    order = H.shape[0]
    if order <= _config.NTK_DENSE_EIG_LIMIT:
        return top_eigenvalue(order, H=H)
    return top_eigenvalue(order, lambda v: H @ v)


def lr_from_lambda(lam: float, curvature: float = 1.0) -> float:
    """``1 / (curvature · λ_max)`` (``curvature``: the loss's bound on its Hessian in
    the outputs, :attr:`~.losses.Loss.curvature`), or a ValueError when no pair fires
    (``λ_max = 0``)."""
    if not lam > 0:
        raise ValueError(
            "lr='auto' needs at least one firing pair (no neuron fires on the data at "
            "initialization); give lr explicitly or lower the threshold b"
        )
    return 1.0 / (curvature * lam)
