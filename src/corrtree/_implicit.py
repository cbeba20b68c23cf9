"""Hidden weights that are never stored: ``W = α·(W(0) - C X)``.

``W(0)`` comes from the counter-based generator (:mod:`._philox`), row ``r`` of
the model being row ``offset + r`` of the generator's; training adds a sparse
``C`` (one coefficient per pair ``(r, l)`` that ever fired, CSR over the rows) on
its training points ``X``, and weight decay a factor ``α``.  Any block of rows
is materialized alone (:meth:`ImplicitWeights.rows`, :meth:`ImplicitWeights.take`):
O(d) a row to generate plus O(d) a coefficient.  Storage: 12 bytes a coefficient
(int32 column, float64 value), 8 bytes a row (``indptr``) and ``X``.

:class:`StoredWeights` gives an explicit ``W`` the same two methods, so the band
trainers read ``W(0)`` one way from both.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from . import _config, _philox
from ._jit import njit

__all__ = ["ImplicitWeights", "StoredWeights", "forward_rows"]


@njit(cache=True, parallel=True, fastmath={"contract"})
def _subtract(out, rows, start, indptr, cols, coef, X):
    """``out[k] -= Σ_q coef[q]·X[cols[q]]`` over the coefficients of row
    ``start + k`` (``rows`` empty) or ``rows[k]``, four a pass in the order
    of :func:`~corrtree.training._outputs.materialize` (the same sums, bit for bit).
    O(d · coefficients)."""
    d = X.shape[1]
    for k in prange(out.shape[0]):
        r = rows[k] if rows.shape[0] else start + k
        q = indptr[r]
        end = indptr[r + 1]
        while q + 4 <= end:
            c0, c1, c2, c3 = coef[q], coef[q + 1], coef[q + 2], coef[q + 3]
            j0, j1, j2, j3 = cols[q], cols[q + 1], cols[q + 2], cols[q + 3]
            for i in range(d):
                out[k, i] -= (c0 * X[j0, i] + c1 * X[j1, i]) + (c2 * X[j2, i] + c3 * X[j3, i])
            q += 4
        while q < end:
            c = coef[q]
            j = cols[q]
            for i in range(d):
                out[k, i] -= c * X[j, i]
            q += 1


_NO_ROWS = np.zeros(0, dtype=np.int64)


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _fire_exact(UT, thr, W, X, a, b, out, counts):
    """For every point ``j`` (in parallel) and row ``k`` in order: where the float32
    product ``UT[j, k]`` reaches ``thr[k]`` (``b`` less the row's float32 error bound),
    the float64 product ``u = <W[k], X[j]>``, and if ``u >= b``: ``out[j] += a[k]·(u - b)``,
    ``counts[j] += 1``.  The firing set and values of the float64 products (vectorized
    sums: a float64 GEMM's agree up to rounding, so the two can part only on a product
    within an ulp or so of ``b``); each point's sum in a fixed order.
    O(n·rows + d·candidates)."""
    d = X.shape[1]
    K = a.shape[1]
    for j in prange(UT.shape[0]):
        x = X[j]
        for k in range(UT.shape[1]):
            if UT[j, k] >= thr[k]:
                w = W[k]
                u = 0.0
                for i in range(d):
                    u += w[i] * x[i]
                if u >= b:
                    for c in range(K):
                        out[j, c] += a[k, c] * (u - b)
                    counts[j] += 1


def forward_rows(W, X, X32, R, a, b, out, counts) -> bool:
    """Add the outputs of neurons ``W`` (float64 rows, output weights ``a``) at the
    points ``X`` (``X32``: in float32; ``R``: their largest norm) to ``out`` (before the
    ``1/sqrt m`` scale), and their fire counts to ``counts``: a float32 GEMM, then
    float64 products for the pairs within its error bound of ``b``
    (``γ_{d+2}·||w_r||·R`` with :data:`~corrtree._config.GEMM32_SAFETY`, as at the band
    trainers' set-up).  Returns ``False`` (nothing added) when a bound is too large
    for float32 (:data:`~corrtree._config.FLOAT32_SAFE_ERROR`).  O(n·rows·d) in float32."""
    d = W.shape[1]
    gamma = (d + 2) * _config.U32 / (1.0 - (d + 2) * _config.U32)
    err = _config.GEMM32_SAFETY * gamma * np.sqrt(np.einsum("ij,ij->i", W, W)) * R
    if not (err < _config.FLOAT32_SAFE_ERROR).all():
        return False
    t = b - err
    thr = t - _config.FLOAT32_QUERY_MARGIN * np.abs(t) - 1e-300
    UT = X32 @ W.astype(np.float32).T
    _fire_exact(UT, thr, W, X, a, float(b), out, counts)
    return True


class StoredWeights:
    """An explicit ``W`` (m×d float64) behind the interface of :class:`ImplicitWeights`."""

    implicit = False

    def __init__(self, W: np.ndarray) -> None:
        self.W = W
        self.m, self.d = W.shape

    def rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """``W[start:stop]`` (a view when ``out`` is not given)."""
        if out is None:
            return self.W[start:stop]
        out[...] = self.W[start:stop]
        return out

    def take(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``W[rows]`` (into ``out`` if given).  O(len(rows) · d)."""
        # rows are in range: mode='clip' spares the copy np.take buffers through
        return np.take(self.W, rows, axis=0, out=out, mode="clip")


class ImplicitWeights:
    """``W = α·(W(0) - C X)`` with ``W(0)`` from the generator ``seed`` (module docstring).

    Parameters
    ----------
    seed : int
        Key of the generator, ``0 <= seed < 2**64``.
    m, d : int
        Shape of ``W``.
    offset : int
        Row ``r`` is the generator's row ``offset + r`` (a shard of a wider network).
    update : tuple, optional
        ``(X, indptr, cols, coef, alpha)``: the training points (``(n, d)``), the CSR
        of ``C`` (``indptr`` int64 ``(m+1,)``, ``cols`` int32, ``coef`` float64) and
        ``α``.  ``None``: ``W = W(0)``.
    """

    implicit = True

    def __init__(self, seed: int, m: int, d: int, offset: int = 0, update=None) -> None:
        self.seed, self.m, self.d, self.offset = int(seed), int(m), int(d), int(offset)
        self.update = update

    @property
    def pairs(self) -> int:
        """Number of stored coefficients (pairs that ever fired)."""
        return 0 if self.update is None else int(self.update[2].shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: the update's arrays (``W(0)`` takes none)."""
        return 0 if self.update is None else sum(int(a.nbytes) for a in self.update[:4])

    def rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` of ``W``, float64 (into ``out`` if given).
        O((stop - start)·d + d·coefficients of those rows)."""
        if out is None:
            out = np.empty((stop - start, self.d))
        _philox.normal_rows(self.seed, self.offset + start, out)
        self._apply(out, _NO_ROWS, start)
        return out

    def take(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``W[rows]`` (``rows``: int64), float64 (into ``out`` if given)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if out is None:
            out = np.empty((rows.shape[0], self.d))
        _philox.normal_take(self.seed, self.offset, rows, out)
        self._apply(out, rows, 0)
        return out

    def _apply(self, out: np.ndarray, rows: np.ndarray, start: int) -> None:
        if self.update is None or out.shape[0] == 0:
            return
        X, indptr, cols, coef, alpha = self.update
        _subtract(out, rows, start, indptr, cols, coef, X)
        if alpha != 1.0:
            out *= alpha

    def shard(self, start: int, stop: int) -> ImplicitWeights:
        """Rows ``start:stop`` as a model of their own (their generator rows, their
        coefficients)."""
        update = None
        if self.update is not None:
            X, indptr, cols, coef, alpha = self.update
            lo, hi = int(indptr[start]), int(indptr[stop])
            update = (X, indptr[start : stop + 1] - lo, cols[lo:hi], coef[lo:hi], alpha)
        return ImplicitWeights(self.seed, stop - start, self.d, self.offset + start, update)

    def absorb(self, X: np.ndarray, indptr, cols, coef, alpha: float) -> ImplicitWeights:
        """These weights after a run from them: ``α·(W - C X)``.

        On a fresh ``W(0)`` the run's ``C`` is kept as it is; after an earlier run,
        ``W = α'·(W(0) - C' X')`` and the result is
        ``α·α'·(W(0) - C' X' - (C/α') X)``: one CSR over the points of both runs
        (``X`` once when both runs trained on the same points).
        """
        if self.update is None:
            return ImplicitWeights(
                self.seed, self.m, self.d, self.offset, (X, indptr, cols, coef, float(alpha))
            )
        import scipy.sparse as sp

        Xp, ip, cp, vp, ap = self.update
        n_old = Xp.shape[0]
        before = sp.csr_matrix((vp, cp, ip), shape=(self.m, n_old))
        now = sp.csr_matrix((coef / ap, cols, indptr), shape=(self.m, X.shape[0]))
        if Xp.shape == X.shape and np.array_equal(Xp, X):
            total, points = (before + now).tocsr(), Xp
        else:
            total, points = sp.hstack([before, now], format="csr"), np.vstack([Xp, X])
        total.sort_indices()
        update = (
            points,
            total.indptr.astype(np.int64),
            total.indices.astype(np.int32),
            total.data.astype(np.float64),
            float(alpha) * ap,
        )
        return ImplicitWeights(self.seed, self.m, self.d, self.offset, update)

    # -- persistence: named arrays, checked on the way back --------------------------
    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """The weights as named arrays (O(m + coefficients + n·d), no ``m×d``)."""
        out = {
            f"{prefix}seed": np.array(self.seed, dtype=np.uint64),
            f"{prefix}shape": np.array([self.m, self.d, self.offset], dtype=np.int64),
        }
        if self.update is not None:
            X, indptr, cols, coef, alpha = self.update
            out.update(
                {
                    f"{prefix}X": X,
                    f"{prefix}indptr": indptr,
                    f"{prefix}cols": cols,
                    f"{prefix}coef": coef,
                    f"{prefix}alpha": np.array(alpha, dtype=np.float64),
                }
            )
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str = "") -> ImplicitWeights:
        """The weights of :meth:`arrays`; ``ValueError`` naming the first array that is
        missing, of the wrong dtype or shape, or inconsistent (before any kernel reads
        it)."""

        def get(name: str, kind: str, ndim: int) -> np.ndarray:
            arr = arrays.get(prefix + name)
            if arr is None:
                raise ValueError(f"{prefix}{name} is missing")
            if arr.dtype.kind != kind[0] or arr.dtype.itemsize != int(kind[1]) or arr.ndim != ndim:
                raise ValueError(
                    f"{prefix}{name} must be a {ndim}-d {kind} array, got {arr.ndim}-d {arr.dtype}"
                )
            return arr

        seed = int(get("seed", "u8", 0))
        shape = get("shape", "i8", 1)
        if shape.shape != (3,) or shape[0] < 1 or shape[1] < 1 or shape[2] < 0:
            raise ValueError(f"{prefix}shape must hold m >= 1, d >= 1 and offset >= 0")
        m, d, offset = (int(v) for v in shape)
        if prefix + "indptr" not in arrays:
            return cls(seed, m, d, offset)
        X = get("X", "f8", 2)
        indptr, cols, coef = get("indptr", "i8", 1), get("cols", "i4", 1), get("coef", "f8", 1)
        alpha = float(get("alpha", "f8", 0))
        if X.shape[1] != d or not np.isfinite(X).all():
            raise ValueError(f"{prefix}X must be finite with d={d} columns")
        if indptr.shape[0] != m + 1 or indptr[0] != 0 or (np.diff(indptr) < 0).any():
            raise ValueError(f"{prefix}indptr must rise from 0 over m + 1 = {m + 1} entries")
        if cols.shape != coef.shape or indptr[-1] != cols.shape[0]:
            raise ValueError(f"{prefix}cols and {prefix}coef must hold indptr[-1] entries")
        if cols.shape[0] and (cols.min() < 0 or cols.max() >= X.shape[0]):
            raise ValueError(f"{prefix}cols must index the {X.shape[0]} rows of {prefix}X")
        if not np.isfinite(coef).all() or not (np.isfinite(alpha) and alpha > 0):
            raise ValueError(f"{prefix}coef and {prefix}alpha must be finite (alpha > 0)")
        update = (*(np.ascontiguousarray(a) for a in (X, indptr, cols, coef)), alpha)
        return cls(seed, m, d, offset, update)
