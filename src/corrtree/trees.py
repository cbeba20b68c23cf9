"""The paper's correlation trees: :class:`CorrelationDTree` and :class:`CorrelationWTree`.

Both store every product ``<w_r, x_i>`` once, in one 2-D float64 array computed
by a single BLAS GEMM, and put a blocked max tree (:mod:`corrtree._maxtree`) on
each row.  The DTree has one tree per data point (``n`` trees of ``m`` leaves,
rows of ``X Wᵀ``); the WTree one tree per neuron (``m`` trees of ``n`` leaves,
rows of ``W Xᵀ``).
"""

from __future__ import annotations

import numpy as np

from . import _config, _maxtree
from ._validation import (
    as_matrix,
    as_vector,
    check_index,
    check_indices,
    check_memory,
    check_real,
    check_rows,
    check_shape_2d,
    readonly,
)

__all__ = ["CorrelationDTree", "CorrelationWTree"]


def _last_occurrence(rs: np.ndarray) -> np.ndarray:
    """Positions of the last occurrence of each distinct value of ``rs``."""
    _, first_in_reversed = np.unique(rs[::-1], return_index=True)
    return rs.shape[0] - 1 - first_in_reversed


def _sizes(X: object, W: object) -> tuple[int, int, int]:
    """``(n, m, d)`` of data ``X`` and weights ``W`` with the same number of columns."""
    n, d = check_shape_2d("X", X)
    m, d_w = check_shape_2d("W", W)
    if d_w != d:
        raise ValueError(f"W has {d_w} columns but X has d={d}")
    return n, m, d


class _CorrelationTrees:
    """Shared storage and validation of the two correlation trees."""

    _per_data_point: bool  # True: one tree per x_i (DTree); False: one per w_r (WTree)

    def __init__(self, X: np.ndarray, W: np.ndarray) -> None:
        n, m, d = _sizes(X, W)
        n_trees, n_leaves = (n, m) if self._per_data_point else (m, n)
        off = _maxtree.level_offsets(n_leaves)  # only to size the memory check
        check_memory(
            8.0 * ((n + m) * d + n_trees * (n_leaves + int(off[-1]))),
            f"{type(self).__name__}(n={n}, m={m}, d={d})",
        )
        self._X = as_matrix("X", X)
        self._W = as_matrix("W", W)
        # one GEMM (matmul's own output allocation faults its pages in faster than
        # a np.dot into a fresh np.empty)
        self._set_products(self._X @ self._W.T if self._per_data_point else self._W @ self._X.T)

    def _set_products(self, V: np.ndarray) -> None:
        self._off = _maxtree.level_offsets(V.shape[1])
        self._V = V
        self._inner = np.empty((V.shape[0], int(self._off[-1])), dtype=np.float64)
        _maxtree.build(self._V, self._inner, self._off)

    @classmethod
    def from_products(cls, X: np.ndarray, W: np.ndarray, V: np.ndarray):
        """A structure over products ``V`` already known (e.g. read from a checkpoint):
        no GEMM, O(nm) for the tree levels.

        ``V`` must have the layout of :attr:`products`; it is taken as the
        stored products as they are (a tree updated in place may hold values
        that differ from a fresh GEMM in the last bits).
        """
        n, m, _ = _sizes(X, W)
        want = (n, m) if cls._per_data_point else (m, n)
        if np.shape(V) != want:
            raise ValueError(f"V must have shape {want}, got {np.shape(V)}")
        obj = cls.__new__(cls)
        obj._X = as_matrix("X", X)
        obj._W = as_matrix("W", W)
        obj._set_products(as_matrix("V", V))
        return obj

    # -- read-only views -------------------------------------------------------
    @property
    def X(self) -> np.ndarray:
        """Data points, shape ``(n, d)`` (read-only view)."""
        return readonly(self._X)

    @property
    def W(self) -> np.ndarray:
        """Current weights, shape ``(m, d)`` (read-only view)."""
        return readonly(self._W)

    @property
    def products(self) -> np.ndarray:
        """The stored products (read-only view): ``<w_r, x_i>`` at ``[i, r]`` for the
        DTree (``n × m``), at ``[r, i]`` for the WTree (``m × n``)."""
        return readonly(self._V)

    @property
    def n(self) -> int:
        """Number of data points."""
        return self._X.shape[0]

    @property
    def m(self) -> int:
        """Number of weights (neurons)."""
        return self._W.shape[0]

    @property
    def d(self) -> int:
        """Dimension."""
        return self._X.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the products and the internal tree levels."""
        return self._V.nbytes + self._inner.nbytes + self._off.nbytes

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, m={self.m}, d={self.d})"

    # -- shared operations -----------------------------------------------------
    def _query_tree(self, t: int, tau: float) -> np.ndarray:
        return _maxtree.query_row(self._V, self._inner, self._off, t, tau)

    def query_all(self, tau: float) -> tuple[np.ndarray, np.ndarray]:
        """Report every product ``>= tau`` of every tree, CSR style.

        Returns
        -------
        indptr : ndarray of int64, shape (n_trees + 1,)
        indices : ndarray of int64
            ``indices[indptr[t]:indptr[t + 1]]`` are the sorted leaves of tree
            ``t`` whose product is ``>= tau``.

        Notes
        -----
        Output-sensitive: ``O(|output| · depth · BRANCH + n_trees)`` time, run in
        parallel over trees (one counting and one filling pass).
        """
        tau = check_real("tau", tau, allow_inf=True)
        counts = _maxtree.count_all(self._V, self._inner, self._off, tau)
        indptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        out = np.empty((int(indptr[-1]), 1), dtype=np.int64)
        _maxtree.fill_all(self._V, self._inner, self._off, tau, indptr, out)
        return indptr, out[:, 0]

    def _tree_max(self, t: int) -> float:
        return float(self._inner[t, self._off[-2]])

    def update(self, r: int, z: np.ndarray) -> None:
        """Set weight ``w_r`` to ``z`` and update every product it takes part in."""
        r = check_index("r", r, self.m)
        z = as_vector("z", z, self.d)
        self._apply(np.array([r], dtype=np.int64), z[None, :])

    def update_many(self, rs: np.ndarray, Z: np.ndarray) -> None:
        """Set ``w_{rs[k]}`` to ``Z[k]`` for every ``k`` (one GEMM for all products).

        If an index repeats, the last of its rows wins, as with successive
        :meth:`update` calls.
        """
        rs = check_indices("rs", rs, self.m)
        Z = check_rows("Z", Z, rs.shape[0], self.d)
        if rs.shape[0]:
            self._apply(rs, Z)

    def _apply(self, rs: np.ndarray, Z: np.ndarray) -> None:
        """Update weights ``rs`` to ``Z`` (trusted input), in chunks whose new
        products take at most :data:`~corrtree._config.TREE_UPDATE_BLOCK_BYTES`."""
        chunk = _config.block_rows(8 * self.n, rs.shape[0], _config.TREE_UPDATE_BLOCK_BYTES)
        for s in range(0, rs.shape[0], chunk):
            self._apply_chunk(rs[s : s + chunk], Z[s : s + chunk])

    def _apply_chunk(self, rs: np.ndarray, Z: np.ndarray) -> None:
        raise NotImplementedError


class CorrelationDTree(_CorrelationTrees):
    """Correlation DTree: ``n`` max trees, tree ``i`` over ``<w_r, x_i>`` for all ``r``.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Data points (copied as C-contiguous float64).
    W : array_like, shape (m, d)
        Weights (copied as C-contiguous float64).

    Notes
    -----
    Init: one GEMM ``X Wᵀ`` (O(nmd)) plus O(nm) to build the trees; memory
    ``8·n·m·(1 + 1/15)`` bytes besides the copies of X and W.
    Update of one weight: O(n·(d + BRANCH·log_B m)).  Query: output-sensitive.

    Examples
    --------
    >>> import numpy as np, corrtree as ct
    >>> X = np.eye(3); W = np.array([[1.0, 0, 0], [0, 2.0, 0]])
    >>> tree = ct.CorrelationDTree(X, W)
    >>> tree.query(1, 1.5)
    array([1])
    >>> tree.update(0, [0.0, 5.0, 0.0])
    >>> tree.query(1, 1.5), tree.max(1)
    (array([0, 1]), 5.0)
    """

    _per_data_point = True

    def query(self, i: int, tau: float) -> np.ndarray:
        """Sorted int64 array of every ``r`` with ``<w_r, x_i> >= tau``.

        ``O(|output| · BRANCH · log_B m)``.
        """
        i = check_index("i", i, self.n)
        return self._query_tree(i, check_real("tau", tau, allow_inf=True))

    def max(self, i: int) -> float:
        """``max_r <w_r, x_i>`` in O(1)."""
        return self._tree_max(check_index("i", i, self.n))

    def _apply_chunk(self, rs: np.ndarray, Z: np.ndarray) -> None:
        keep = _last_occurrence(rs)
        self._W[rs[keep]] = Z[keep]
        P = np.dot(self._X, Z.T)
        _maxtree.set_columns(self._V, self._inner, self._off, rs, P)


class CorrelationWTree(_CorrelationTrees):
    """Correlation WTree: ``m`` max trees, tree ``r`` over ``<w_r, x_i>`` for all ``i``.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Data points (copied as C-contiguous float64).
    W : array_like, shape (m, d)
        Weights (copied as C-contiguous float64).

    Notes
    -----
    Init: one GEMM ``W Xᵀ`` (O(nmd)) plus O(nm) for the trees.  Update of one
    weight rebuilds its tree: O(nd).  Query: output-sensitive.

    Examples
    --------
    >>> import numpy as np, corrtree as ct
    >>> X = np.eye(3); W = np.array([[1.0, 2.0, 0], [0, 2.0, 0]])
    >>> ct.CorrelationWTree(X, W).query(0, 1.0)
    array([0, 1])
    """

    _per_data_point = False

    def query(self, r: int, tau: float) -> np.ndarray:
        """Sorted int64 array of every ``i`` with ``<w_r, x_i> >= tau``.

        ``O(|output| · BRANCH · log_B n)``.
        """
        r = check_index("r", r, self.m)
        return self._query_tree(r, check_real("tau", tau, allow_inf=True))

    def max(self, r: int) -> float:
        """``max_i <w_r, x_i>`` in O(1)."""
        return self._tree_max(check_index("r", r, self.m))

    def _apply_chunk(self, rs: np.ndarray, Z: np.ndarray) -> None:
        keep = _last_occurrence(rs)
        rows, Z = rs[keep], Z[keep]
        self._W[rows] = Z
        _maxtree.set_rows(self._V, self._inner, self._off, rows, np.dot(Z, self._X.T))
