"""Brute-force references that the fast kernels are tested against."""

from __future__ import annotations

import numpy as np

from corrtree.training._pool import START, SUPP


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


def band_widths(U: np.ndarray, b: float, band: float, exponent: float) -> np.ndarray:
    """Each anchored row's band half-width: ``band·(f_r / mean f)^exponent`` within
    ``[band/2, 2·band]``, ``f_r`` its products ``>= b`` (at least 1; the mean at least 1)."""
    f = [sum(1 for v in row if v >= b) for row in U]
    mean = max(1.0, sum(f) / len(f))
    widths = [band * (max(c, 1) / mean) ** exponent for c in f]
    return np.array([min(max(w, band / 2), 2 * band) for w in widths])


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


def sgd(W, a, b, X, Y, lr, batches, factors, momentum=0.0, nesterov=False, weight_decay=0.0):
    """Mini-batch SGD as ``torch.optim.SGD`` documents it, from the formulas: for each
    batch ``B`` (index array) and lr factor, ``d = ∇L_B + λw``, ``v = μv + d`` (``v = d``
    the first time), ``w -= lr·factor·(d + μv if nesterov else v)``.  Returns ``W``
    and the batch losses."""
    W = W.copy()
    a = a.reshape(W.shape[0], -1)
    Y = Y.reshape(X.shape[0], -1)
    m = W.shape[0]
    V = None
    losses = []
    for B, f in zip(batches, factors, strict=True):
        Xb, Yb = X[B], Y[B]
        U = np.einsum("rd,id->ri", W, Xb)
        err = relu_net_outputs(W, a, b, Xb) - Yb
        losses.append(0.5 * float(np.sum(err**2)))
        coef = (U >= b) * np.einsum("rk,ik->ri", a, err) / np.sqrt(m)
        d = np.einsum("ri,id->rd", coef, Xb) + weight_decay * W
        if momentum:
            V = d.copy() if V is None else momentum * V + d
            d = d + momentum * V if nesterov else V
        W = W - lr * f * d
    return W, losses


# -- band trainers: brute-force twins of the kernels in corrtree.training._pairs ------


def coefficients(seg, pool, a, E, eta_s, m, n):
    """Dense ``C`` (m×n) of the implicit weights ``W = W0 - C X``, one entry at a time:
    ``kappa`` plus ``eta_s·<a_r, E_j>`` while the pair fires, over the ever-fired prefix."""
    C = np.zeros((m, n))
    for r in range(m):
        start, supp = seg[r, START], seg[r, SUPP]
        for q in range(start, start + supp):
            c = pool.kappa[q]
            if pool.fire[q]:
                c += eta_s * float(np.dot(a[r], E[pool.j[q]]))
            C[r, pool.j[q]] = c
    return C


def gershgorin_sigma(G, points):
    """``sqrt`` of the largest absolute row sum of ``G[S, S]``."""
    if len(points) == 0:
        return 0.0
    sub = np.abs(G[np.ix_(points, points)])
    return float(np.sqrt(max(sub.sum(axis=1))))


def outputs_from_values(pairs, a, b, n, m):
    """``u_j = (1/sqrt m)·Σ a_r (v - b)`` over firing ``(r, j, v)`` triples."""
    u = np.zeros((n, a.shape[1]))
    for r, j, v in pairs:
        u[j] += a[r] * (v - b)
    return u / np.sqrt(m)


def ntk(F, G, a):
    """``H[(i,k),(j,l)] = (1/m)·Σ_r a_rk a_rl F_ri F_rj G_ij`` from a dense mask F (m×n)."""
    m, n = F.shape
    K = a.shape[1]
    H = np.zeros((n * K, n * K))
    for r in range(m):
        on = np.flatnonzero(F[r])
        for i in on:
            for j in on:
                H[i * K : (i + 1) * K, j * K : (j + 1) * K] += np.outer(a[r], a[r]) * G[i, j]
    return H / m


def sparse_step(W, F, X, a, err, step):
    """``w_r - step·Σ_{i: F_ri} <a_r, err_i>·x_i`` for every neuron."""
    out = W.copy()
    for r in range(W.shape[0]):
        for i in np.flatnonzero(F[r]):
            out[r] -= step * float(np.dot(a[r], err[i])) * X[i]
    return out


def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox-4×32-10 from the definition (Salmon et al., SC 2011), Python integers."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    mask = 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & mask, (p0 >> 32) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return c0, c1, c2, c3


def implicit_weight(seed: int, r: int, c: int) -> float:
    """``W(0)[r, c]`` of the counter-based generator from its definition
    (``corrtree/_philox.py``): Philox of counter ``(c // 2, r mod 2³², r div 2³², 0)``
    under the key ``(seed mod 2³², seed div 2³²)``, two 53-bit uniforms, Box–Muller."""
    import math

    x0, x1, x2, x3 = philox4x32_10(
        (c // 2, r & 0xFFFFFFFF, r >> 32, 0), (seed & 0xFFFFFFFF, seed >> 32)
    )
    u1 = ((x0 >> 5) * 2**26 + (x1 >> 6) + 1) / 2**53
    u2 = ((x2 >> 5) * 2**26 + (x3 >> 6)) / 2**53
    rad = math.sqrt(-2.0 * math.log(u1))
    return rad * (math.cos if c % 2 == 0 else math.sin)(2.0 * math.pi * u2)
