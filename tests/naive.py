"""Brute-force references that the fast kernels are tested against."""

from __future__ import annotations

import numpy as np


def products(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``U[r, i] = <w_r, x_i>``, one dot product at a time (no BLAS blocking)."""
    U = np.empty((W.shape[0], X.shape[0]))
    for r in range(W.shape[0]):
        for i in range(X.shape[0]):
            U[r, i] = float(np.dot(W[r], X[i]))
    return U


def at_least(values: np.ndarray, tau: float) -> np.ndarray:
    """Sorted indices ``j`` with ``values[j] >= tau``."""
    return np.array([j for j, v in enumerate(values) if v >= tau], dtype=np.int64)


def dtree_query(X: np.ndarray, W: np.ndarray, i: int, tau: float) -> np.ndarray:
    return at_least(W @ X[i], tau)


def wtree_query(X: np.ndarray, W: np.ndarray, r: int, tau: float) -> np.ndarray:
    return at_least(X @ W[r], tau)


def firing_pairs(X: np.ndarray, Y: np.ndarray, b: float) -> np.ndarray:
    """All ``(i, j)`` with ``<x_i, y_j> >= b``, lexicographically sorted."""
    pairs = [(i, j) for i in range(X.shape[0]) for j in range(Y.shape[0]) if X[i] @ Y[j] >= b]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)
