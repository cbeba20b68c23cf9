"""Dynamic Detection of Firing Neurons (the paper's DDFN problem)."""

from __future__ import annotations

import math

import numpy as np

from . import _bittree
from ._validation import (
    as_matrix,
    as_vector,
    check_index,
    check_indices,
    check_memory,
    check_positive_int,
    check_real,
    check_rows,
    check_shape_2d,
    readonly,
)

__all__ = ["FiringDetector", "TooManyFiring"]


class TooManyFiring(RuntimeError):
    """Raised by :meth:`FiringDetector.query` when more than ``limit`` pairs fire.

    Attributes
    ----------
    limit : int
        The limit that was exceeded.
    count : int
        The number of firing pairs.
    """

    def __init__(self, limit: int, count: int) -> None:
        super().__init__(f"{count} pairs fire, more than the limit of {limit}")
        self.limit = limit
        self.count = count


class FiringDetector:
    """Report every pair ``(i, j)`` with ``<x_i, y_j> >= b`` while the ``y_j`` change.

    The paper's Definition "Dynamic Detection of Firing Neurons": ``X`` is
    fixed, ``Y`` is updated one row (or a batch of rows) at a time, and a
    query returns all firing pairs or reports that there are more than
    ``limit`` of them.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Fixed points.
    Y : array_like, shape (m, d)
        Initial dynamic points (the neurons' weights).
    b : float
        Threshold; ties fire.
    limit : int, "auto" or None, default "auto"
        ``"auto"`` is ``ceil(m^(4/5) · n)``, the paper's bound; ``None`` disables it.

    Notes
    -----
    This is the Correlation DTree specialised to its one threshold: tree
    ``i`` is a max tree over the indicators ``[<x_i, y_j> >= b]``, whose
    internal nodes are therefore ORs, stored as 64-ary bit trees
    (``corrtree._bittree``; ``n·m/8`` bytes in all, not the ``8·n·m`` of
    the products).  An update computes the ``n`` new products of ``y_j``
    (one GEMM for a batch) and touches the tree paths of the pairs whose
    indicator changes.  The number of firing pairs of each ``x_i`` is kept
    exact, so an overflow is detected in O(n).

    Init O(nmd) (blocked GEMM); update O(n·d) per row plus O(log_64 m) per
    changed pair; query ``O(n + |Q|·log_64 m)``.

    Examples
    --------
    >>> import numpy as np, corrtree as ct
    >>> det = ct.FiringDetector(np.eye(2), np.array([[1.0, 0.0], [0.5, 0.5]]), b=0.5)
    >>> det.query()
    array([[0, 0],
           [0, 1],
           [1, 1]])
    >>> det.update(1, [0.0, 0.0])
    >>> det.query().tolist()
    [[0, 0]]
    """

    _BLOCK = 8192  # columns of products computed per GEMM at init (a multiple of 64)

    def __init__(
        self, X: np.ndarray, Y: np.ndarray, b: float, limit: int | str | None = "auto"
    ) -> None:
        b = check_real("b", b)
        n, d = check_shape_2d("X", X)
        m, d_y = check_shape_2d("Y", Y)
        if d_y != d:
            raise ValueError(f"Y has {d_y} columns but X has d={d}")
        self._m_n = (m, n)
        self.limit = limit
        off = _bittree.level_offsets(m)
        block = min(m, self._BLOCK)
        check_memory(
            8.0 * ((n + m) * d + n * int(off[-1]) + n * block),
            f"FiringDetector(n={n}, m={m}, d={d})",
        )
        self._X = as_matrix("X", X)
        self._Y = as_matrix("Y", Y)
        self._b = b
        self._off = off
        self._bits = np.zeros((n, int(off[-1])), dtype=np.uint64)
        self._counts = np.zeros(n, dtype=np.int64)
        P = np.empty((n, block))  # reused by every full block
        for c0 in range(0, m, block):
            Yb = self._Y[c0 : c0 + block]
            if Yb.shape[0] == block:
                np.matmul(self._X, Yb.T, out=P)
                _bittree.pack(P, b, self._bits, c0, self._counts)
            else:
                _bittree.pack(self._X @ Yb.T, b, self._bits, c0, self._counts)
        _bittree.build_summaries(self._bits, off)

    @property
    def X(self) -> np.ndarray:
        """Fixed points, shape ``(n, d)`` (read-only)."""
        return readonly(self._X)

    @property
    def Y(self) -> np.ndarray:
        """Current dynamic points, shape ``(m, d)`` (read-only)."""
        return readonly(self._Y)

    @property
    def b(self) -> float:
        """Threshold."""
        return self._b

    @property
    def limit(self) -> int | None:
        """Largest number of pairs :meth:`query` reports before raising (settable:
        an int >= 0, ``"auto"`` for ``ceil(m^(4/5)·n)``, or ``None`` for no limit)."""
        return self._limit

    @limit.setter
    def limit(self, limit: int | str | None) -> None:
        m, n = self._m_n
        if limit == "auto":
            self._limit: int | None = math.ceil(m**0.8 * n)
        elif limit is None:
            self._limit = None
        else:
            self._limit = check_positive_int("limit", limit, minimum=0)

    @property
    def n(self) -> int:
        """Number of fixed points."""
        return self._X.shape[0]

    @property
    def m(self) -> int:
        """Number of dynamic points."""
        return self._Y.shape[0]

    @property
    def d(self) -> int:
        """Dimension."""
        return self._X.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the bit trees and the per-point counts."""
        return self._bits.nbytes + self._counts.nbytes

    @property
    def counts(self) -> np.ndarray:
        """Number of firing ``j`` for each ``x_i`` (read-only, kept exact)."""
        return readonly(self._counts)

    def count(self) -> int:
        """``|Q|``, the number of firing pairs, in O(n)."""
        return int(self._counts.sum())

    def __repr__(self) -> str:
        return f"FiringDetector(n={self.n}, m={self.m}, d={self.d}, b={self.b!r})"

    def update(self, j: int, z: np.ndarray) -> None:
        """Set ``y_j`` to ``z``.  O(n·d + changed pairs · log_64 m)."""
        j = check_index("j", j, self.m)
        z = as_vector("z", z, self.d)
        self._apply(np.array([j], dtype=np.int64), z[None, :])

    def update_many(self, js: np.ndarray, Z: np.ndarray) -> None:
        """Set ``y_{js[k]}`` to ``Z[k]`` for every ``k``; a repeated index keeps its last row."""
        js = check_indices("js", js, self.m)
        Z = check_rows("Z", Z, js.shape[0], self.d)
        if js.shape[0]:
            self._apply(js, Z)

    def _apply(self, js: np.ndarray, Z: np.ndarray) -> None:
        for j, z in zip(js, Z, strict=True):  # in order: the last row of a repeated j wins
            self._Y[j] = z
        P = np.dot(self._X, Z.T)
        _bittree.apply_columns(self._bits, self._off, js, P, self._b, self._counts)

    def query(self) -> np.ndarray:
        """Every firing pair, as an int64 array of shape ``(|Q|, 2)`` sorted lexicographically.

        Raises
        ------
        TooManyFiring
            If ``|Q| > limit``; detected from the per-point counts in O(n)
            time, before any pair is reported.
        """
        counts = self._counts
        total = int(counts.sum())
        if self._limit is not None and total > self._limit:
            raise TooManyFiring(self._limit, total)
        indptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        out = np.empty((total, 2), dtype=np.int64)
        _bittree.fill_pairs(self._bits, self._off, indptr, out)
        return out
