"""Sums over the firing pairs of the band trainers, and the weights their coefficients
give: the outputs ``Σ_r a_r (U_rj - b)`` in fixed chunks (the same bits whatever the
threads), ``W(t) = W(0) - C X`` by rows (``docs/design.md``, "Implicit weights") and
``C`` itself in CSR.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from ._pairs import coef
from ._pool import START, SUPP

__all__ = ["add_firing", "coefficients", "firing_sums", "forward", "materialize", "sum_parts"]

_CHUNKS = _config.FORWARD_CHUNKS


def forward(neurons, seg, pool, a, b, scale, n):
    """``u = scale · Σ_r a_r (U_rj - b)`` over the firing pairs of ``neurons``.

    Summed in fixed chunks (:func:`firing_sums`, :func:`sum_parts`) so the result does
    not depend on thread scheduling.  O(Σ_r |prefix_r|·K).
    """
    parts = firing_sums(neurons, seg, pool, a, b, n)
    return sum_parts(parts, parts[:0], scale)


@njit(cache=True, inline="always")
def add_firing(part, r, seg, ej, val, fire, a, b):
    """``part[j] += a_r·(U_rj - b)`` over the firing pairs of neuron ``r`` (its
    ever-fired prefix, in pool order).  O(|prefix_r|·K)."""
    s0 = seg[r, START]
    for q in range(s0, s0 + seg[r, SUPP]):
        if fire[q]:
            z = val[q] - b
            j = ej[q]
            for kk in range(a.shape[1]):
                part[j, kk] += a[r, kk] * z


@njit(cache=True, parallel=True)
def firing_sums(neurons, seg, pool, a, b, n):
    """``Σ_r a_r (U_rj - b)`` over the firing pairs of ``neurons``, unscaled, in
    ``min(len(neurons), FORWARD_CHUNKS)`` fixed chunks (at least one): an array
    ``(chunks, n, K)`` for :func:`sum_parts`.  O(Σ_r |prefix_r|·K)."""
    ej, val, fire = pool.j, pool.val, pool.fire
    count = neurons.shape[0]
    chunks = max(1, min(count, _CHUNKS))
    parts = np.empty((chunks, n, a.shape[1]))
    for c in prange(chunks):
        part = parts[c]
        part[:] = 0.0
        for k in range(c * count // chunks, (c + 1) * count // chunks):
            add_firing(part, neurons[k], seg, ej, val, fire, a, b)
    return parts


@njit(cache=True, parallel=True)
def sum_parts(parts, more, scale):
    """``u = scale·(Σ_c parts[c] + Σ_c more[c])``, the chunks in a fixed order (the
    result does not depend on thread scheduling).  O((chunks)·n·K)."""
    n, K = parts.shape[1], parts.shape[2]
    u = np.empty((n, K))
    for j in prange(n):
        for kk in range(K):
            t = 0.0
            for c in range(parts.shape[0]):
                t += parts[c, j, kk]
            for c in range(more.shape[0]):
                t += more[c, j, kk]
            u[j, kk] = t * scale
    return u


@njit(cache=True, parallel=True, fastmath={"contract"})
def materialize(out, rows, X, seg, pool, a, E, eta_s):
    """``out[k] -= Σ_l C_{r,l} x_l`` for ``r = rows[k]`` over the ever-fired pairs.

    ``out`` holds ``W(0)[rows]`` on entry and ``W(t)[rows]`` on return.
    O(d · Σ_r |prefix_r|).  A pair whose coefficient is zero adds ``0·x = 0``.
    """
    ej, kappa, fire = pool.j, pool.kappa, pool.fire
    d = X.shape[1]
    for k in prange(out.shape[0]):
        r = rows[k]
        q = seg[r, START]
        end = q + seg[r, SUPP]
        while q + 8 <= end:  # eight pairs a pass: an eighth of the loads and stores of out
            c0 = coef(q, r, kappa, fire, ej, a, E, eta_s)
            c1 = coef(q + 1, r, kappa, fire, ej, a, E, eta_s)
            c2 = coef(q + 2, r, kappa, fire, ej, a, E, eta_s)
            c3 = coef(q + 3, r, kappa, fire, ej, a, E, eta_s)
            c4 = coef(q + 4, r, kappa, fire, ej, a, E, eta_s)
            c5 = coef(q + 5, r, kappa, fire, ej, a, E, eta_s)
            c6 = coef(q + 6, r, kappa, fire, ej, a, E, eta_s)
            c7 = coef(q + 7, r, kappa, fire, ej, a, E, eta_s)
            j0, j1, j2, j3 = ej[q], ej[q + 1], ej[q + 2], ej[q + 3]
            j4, j5, j6, j7 = ej[q + 4], ej[q + 5], ej[q + 6], ej[q + 7]
            for i in range(d):
                out[k, i] -= ((c0 * X[j0, i] + c1 * X[j1, i]) + (c2 * X[j2, i] + c3 * X[j3, i])) + (
                    (c4 * X[j4, i] + c5 * X[j5, i]) + (c6 * X[j6, i] + c7 * X[j7, i])
                )
            q += 8
        while q + 4 <= end:  # four pairs a pass: a quarter of the loads and stores of out
            c0 = coef(q, r, kappa, fire, ej, a, E, eta_s)
            c1 = coef(q + 1, r, kappa, fire, ej, a, E, eta_s)
            c2 = coef(q + 2, r, kappa, fire, ej, a, E, eta_s)
            c3 = coef(q + 3, r, kappa, fire, ej, a, E, eta_s)
            j0, j1, j2, j3 = ej[q], ej[q + 1], ej[q + 2], ej[q + 3]
            for i in range(d):
                out[k, i] -= (c0 * X[j0, i] + c1 * X[j1, i]) + (c2 * X[j2, i] + c3 * X[j3, i])
            q += 4
        while q < end:
            c = coef(q, r, kappa, fire, ej, a, E, eta_s)
            j = ej[q]
            for i in range(d):
                out[k, i] -= c * X[j, i]
            q += 1


@njit(cache=True, parallel=True)
def coefficients(seg, pool, a, E, eta_s, indptr, cols, out):
    """``C`` in CSR: ``cols[q']``, ``out[q']`` for the ever-fired pairs of neuron ``r`` at
    ``indptr[r] .. indptr[r+1]`` (``indptr`` from ``seg[:, SUPP]``), in the order
    :func:`materialize` sums them.  O(m + Σ_r |prefix_r|)."""
    ej, kappa, fire = pool.j, pool.kappa, pool.fire
    for r in prange(seg.shape[0]):
        s0 = seg[r, START]
        p = indptr[r]
        for q in range(s0, s0 + seg[r, SUPP]):
            cols[p] = ej[q]
            out[p] = coef(q, r, kappa, fire, ej, a, E, eta_s)
            p += 1
