"""The paper's lower bound, executable: ℤ-Max-IP and Orthogonal Vectors solved through DDFN.

Theorem "Lower Bound for Dynamic Detection of Firing Neurons" reduces the
bichromatic maximum inner product problem to DDFN: append a coordinate ``t``
to every ``x_i`` and ``-1`` to every ``y_j``, so that with threshold ``b = 0``

    <(x_i, t), (y_j, -1)> >= 0   ⟺   <x_i, y_j> >= t,

and binary-search the largest ``t`` for which some pair fires, each round
being one batch of updates (every ``x_i`` gets its new ``t``) and one query
that only needs to know whether any pair fires (a query with ``limit=0``
stops as soon as one does).  A fast DDFN structure would therefore give a
fast Max-IP algorithm, which SETH/OVC rule out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import check_shape_2d
from .detector import FiringDetector, TooManyFiring

__all__ = ["MaxIPResult", "max_inner_product", "orthogonal_vectors"]


@dataclass(frozen=True)
class MaxIPResult:
    """Outcome of :func:`max_inner_product`.

    Attributes
    ----------
    value : int
        ``max_{i,j} <x_i, y_j>``.
    witness : tuple of int
        A pair ``(i, j)`` reaching it (the lexicographically smallest).
    updates : int
        Point updates sent to the firing detector (``n`` per round).
    queries : int
        Queries sent to the firing detector (one per round, plus one for the witness).
    rounds : int
        Binary-search rounds, at most ``ceil(log2(2B + 1))`` for entries bounded by ``B``.
    """

    value: int
    witness: tuple[int, int]
    updates: int
    queries: int
    rounds: int


def _integer_matrix(name: str, A: object) -> np.ndarray:
    check_shape_2d(name, A)
    arr = np.asarray(A)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinite values")
        if not np.array_equal(arr, np.round(arr)):
            raise ValueError(f"{name} must hold integers")
    if np.abs(arr).max() > 2**20:
        raise ValueError(f"{name} has entries beyond ±2^20, too large for exact float64 sums")
    return arr.astype(np.int64)


def max_inner_product(X: np.ndarray, Y: np.ndarray) -> MaxIPResult:
    """Solve ℤ-Max-IP exactly through the paper's reduction to DDFN.

    Parameters
    ----------
    X : array_like of int, shape (n, d)
    Y : array_like of int, shape (m, d)

    Returns
    -------
    MaxIPResult

    Notes
    -----
    The firing detector holds the ``m`` fixed points ``(y_j, -1)`` and the
    ``n`` dynamic points ``(x_i, t)``.  Each of the ``O(log B)`` rounds costs
    one batched update of the ``n`` dynamic points (O(n·m·d)) and an O(m)
    emptiness query.  All products are integers below 2^53 in magnitude, so
    float64 arithmetic is exact.

    Examples
    --------
    >>> from corrtree.lowerbound import max_inner_product
    >>> r = max_inner_product([[1, 2], [0, -1]], [[3, 0], [1, 1]])
    >>> r.value, r.witness
    (3, (0, 0))
    """
    X = _integer_matrix("X", X)
    Y = _integer_matrix("Y", Y)
    n, d = X.shape
    if Y.shape[1] != d:
        raise ValueError(f"Y has {Y.shape[1]} columns but X has d={d}")
    bound = int(np.abs(X).sum(axis=1).max() * np.abs(Y).max())
    if bound >= 2**52:
        raise ValueError("entries too large: inner products must stay below 2^52")
    fixed = np.hstack([Y, -np.ones((Y.shape[0], 1), dtype=np.int64)]).astype(np.float64)
    moving = np.hstack([X, np.zeros((n, 1), dtype=np.int64)]).astype(np.float64)
    det = FiringDetector(fixed, moving, b=0.0, limit=0)
    rows = np.arange(n)
    updates = queries = rounds = 0

    def any_pair_at_least(t: int) -> bool:
        nonlocal updates, queries
        moving[:, -1] = t
        det.update_many(rows, moving)
        updates += n
        queries += 1
        try:
            det.query()  # limit 0: raises as soon as one pair fires
        except TooManyFiring:
            return True
        return False

    lo, hi = -bound, bound  # the maximum lies in [lo, hi]; some pair is >= lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        rounds += 1
        if any_pair_at_least(mid):
            lo = mid
        else:
            hi = mid - 1
    moving[:, -1] = lo
    det.update_many(rows, moving)
    updates += n
    det.limit = None
    pairs = det.query()
    queries += 1
    j, i = (int(v) for v in pairs[np.lexsort((pairs[:, 0], pairs[:, 1]))[0]])
    return MaxIPResult(int(lo), (i, j), updates, queries, rounds)


def orthogonal_vectors(X: np.ndarray, Y: np.ndarray) -> tuple[int, int] | None:
    """Find ``(i, j)`` with ``<x_i, y_j> = 0`` for 0/1 vectors, via Max-IP.

    Each coordinate ``k`` is mapped to two: ``x̂ = (x_k, 1 - x_k)`` and
    ``ŷ = (1 - y_k, 1)``, so that ``<x̂, ŷ> = Σ_k (1 - x_k y_k) = d - <x, y>``:
    an orthogonal pair exists iff the maximum inner product of the mapped
    vectors is ``d``.

    Returns
    -------
    tuple of int or None
        An orthogonal pair (the lexicographically smallest in ``(i, j)``), or
        ``None`` if there is none.

    Examples
    --------
    >>> from corrtree.lowerbound import orthogonal_vectors
    >>> orthogonal_vectors([[1, 0, 1], [1, 1, 0]], [[0, 1, 1], [0, 1, 0]])
    (0, 1)
    """
    X = _integer_matrix("X", X)
    Y = _integer_matrix("Y", Y)
    for name, A in (("X", X), ("Y", Y)):
        if not np.isin(A, (0, 1)).all():
            raise ValueError(f"{name} must hold only 0 and 1")
    if Y.shape[1] != X.shape[1]:
        raise ValueError(f"Y has {Y.shape[1]} columns but X has d={X.shape[1]}")
    d = X.shape[1]
    Xh = np.hstack([X, 1 - X])
    Yh = np.hstack([1 - Y, np.ones_like(Y)])
    res = max_inner_product(Xh, Yh)
    return res.witness if res.value == d else None
