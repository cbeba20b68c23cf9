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


def relu_net_outputs(W: np.ndarray, a: np.ndarray, b: float, X: np.ndarray) -> np.ndarray:
    """``f(x_i)`` of 2NN(m, b) by the defining sum, shape ``(n, K)``."""
    a = a.reshape(W.shape[0], -1)
    U = np.einsum("rd,id->ri", W, X)
    return np.einsum("rk,ri->ik", a, np.maximum(U - b, 0.0)) / np.sqrt(W.shape[0])


def gradient_descent(W, a, b, X, Y, lr, iters):
    """The paper's GD, written from its formulas; returns ``W(T)`` and the losses."""
    W = W.copy()
    a = a.reshape(W.shape[0], -1)
    Y = Y.reshape(X.shape[0], -1)
    m = W.shape[0]
    losses = []
    for _ in range(iters):
        U = np.einsum("rd,id->ri", W, X)
        err = relu_net_outputs(W, a, b, X) - Y
        losses.append(0.5 * float(np.sum(err**2)))
        coef = (U >= b) * np.einsum("rk,ik->ri", a, err) / np.sqrt(m)
        W -= lr * np.einsum("ri,id->rd", coef, X)
    return W, losses
