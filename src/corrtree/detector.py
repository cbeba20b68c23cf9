"""Dynamic Detection of Firing Neurons (the paper's DDFN problem)."""

from __future__ import annotations

import math

import numpy as np

from . import _maxtree
from ._validation import (
    as_vector,
    check_index,
    check_indices,
    check_positive_int,
    check_real,
    check_rows,
    readonly,
)
from .trees import CorrelationDTree

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
    Built on a :class:`~corrtree.CorrelationDTree` (one max tree per ``x_i``)
    plus the number of firing leaves of every tree, kept exact on every
    update.  Init O(nmd); update O(n·(d + log m)) per row; query
    O(n) to detect an overflow, else O(|Q|) output-sensitive.

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

    def __init__(
        self, X: np.ndarray, Y: np.ndarray, b: float, limit: int | str | None = "auto"
    ) -> None:
        b = check_real("b", b)
        self._tree = CorrelationDTree(X, Y, _names=("X", "Y"))
        n, m = self._tree.n, self._tree.m
        if limit == "auto":
            self._limit: int | None = math.ceil(m**0.8 * n)
        elif limit is None:
            self._limit = None
        else:
            self._limit = check_positive_int("limit", limit, minimum=0)
        self._b = b
        self._counts = _maxtree.count_all(self._tree._V, self._tree._inner, self._tree._off, b)

    @property
    def X(self) -> np.ndarray:
        """Fixed points, shape ``(n, d)`` (read-only)."""
        return self._tree.X

    @property
    def Y(self) -> np.ndarray:
        """Current dynamic points, shape ``(m, d)`` (read-only)."""
        return self._tree.W

    @property
    def b(self) -> float:
        """Threshold."""
        return self._b

    @property
    def limit(self) -> int | None:
        """Largest number of pairs :meth:`query` reports before raising."""
        return self._limit

    @property
    def n(self) -> int:
        """Number of fixed points."""
        return self._tree.n

    @property
    def m(self) -> int:
        """Number of dynamic points."""
        return self._tree.m

    @property
    def d(self) -> int:
        """Dimension."""
        return self._tree.d

    @property
    def counts(self) -> np.ndarray:
        """Number of firing ``j`` for each ``x_i`` (read-only, kept exact)."""
        return readonly(self._counts)

    def count(self) -> int:
        """``|Q|``, the number of firing pairs, in O(n)."""
        return int(self._counts.sum())

    def update(self, j: int, z: np.ndarray) -> None:
        """Set ``y_j`` to ``z``.  O(n·(d + BRANCH·log_B m))."""
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
        self._tree._apply(js, Z, self._b, self._counts)

    def query(self) -> np.ndarray:
        """Every firing pair, as an int64 array of shape ``(|Q|, 2)`` sorted lexicographically.

        Raises
        ------
        TooManyFiring
            If ``|Q| > limit``; detected from the per-point counts in O(n)
            time, before any pair is reported.
        """
        counts = self._counts
        if self._limit is not None:
            total = int(counts.sum())
            if total > self._limit:
                raise TooManyFiring(self._limit, total)
        indptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        out = np.empty((int(indptr[-1]), 2), dtype=np.int64)
        tree = self._tree
        _maxtree.fill_all(tree._V, tree._inner, tree._off, self._b, indptr, out)
        return out
