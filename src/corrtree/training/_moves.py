"""The lazy trainer's moves route (``docs/design.md``, "The lazy trainer"): up to
:data:`~corrtree._config.LAZY_MOVE_MAX_DIM` features each neuron's move since its anchor is
kept, ``(m, d)`` float64, and stepped exactly; its values are ``uref - <x_j, move_r>``.
The per-pair kernels it shares with the coefficient route are in :mod:`._pairs`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from .._prefetch import prefetch1d, prefetch2d
from ._pairs import data_dot, dot4, dot_row, entry_key, eval_ever_data, flip, needs_reanchor
from ._pool import CNT, DRIFT, MINKEY, SIGMA, SIGMA_UNKNOWN, START, SUPP

__all__ = ["evaluate_by_move", "leave_moves", "prefetch_moved", "step_move"]

_ROUND_UP = _config.ROUND_UP
_CHUNKS = _config.FORWARD_CHUNKS
_U64 = _config.U64


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def leave_moves(seg, nf, pool, a, E, X, xnorm, eta_s, move):
    """Hand every neuron from :func:`evaluate_by_move` back to the coefficient route:
    its ever-fired pairs' values and ``clast`` from the coefficients
    (:func:`eval_ever_data`), and its drift grown by the distance between the two
    representations of its move, ``||Σ_l (C_rl - cref_rl)·x_l - move[r]||`` (rounding
    apart, zero), so that every key stays a certificate.  O(d·Σ|prefix|)."""
    d = X.shape[1]
    for c in prange(_CHUNKS):
        dw = np.empty(d)
        scratch = np.empty((2, X.shape[0]))
        for r in range(c * seg.shape[0] // _CHUNKS, (c + 1) * seg.shape[0] // _CHUNKS):
            if seg[r, SUPP] == 0:
                continue
            eval_ever_data(r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, False)
            sq = 0.0
            size = 0.0
            for t in range(d):
                sq += (dw[t] - move[r, t]) ** 2
                size += dw[t] * dw[t] + move[r, t] * move[r, t]
            # the difference's rounding: u a term, then γ_d on the squares
            gap = math.sqrt(sq + 4.0 * (d + 4) * _U64 * size) * _ROUND_UP
            nf[r, DRIFT] += gap


@njit(cache=True, inline="always")
def prefetch_moved(r, seg, pool, move):
    """:func:`prefetch_segment` for :func:`evaluate_by_move`: the prefix's ``j``,
    ``fire`` and ``uref``, the segment's ``key``, and the neuron's row of ``move``."""
    t0 = seg[r, START]
    t1 = t0 + seg[r, SUPP]
    for q in range(t0, t1 + 7, 8):
        prefetch1d(pool.uref, q)
    for q in range(t0, t1 + 15, 16):
        prefetch1d(pool.j, q)
    for q in range(t0, t1 + 63, 64):
        prefetch1d(pool.fire, q)
    for q in range(t0, t0 + seg[r, CNT] + 7, 8):
        prefetch1d(pool.key, q)
    for t in range(0, move.shape[1] + 7, 8):
        prefetch2d(move, r, t)


@njit(cache=True, inline="always")
def step_move(at, cf, count, ej, X, mv, g):
    """Add a neuron's step to its move since the anchor: ``mv += Σ_p cf[p]·x_{ej[at[p]]}``
    over its ``count`` firing entries ``at[:count]`` (``cf``: their ``η_s·<a_r, err_l>``;
    ``g``: scratch of length ``d``), four rows of ``X`` a pass (a quarter of the loads
    and stores of ``g``, as in :func:`form_move`).

    The move is what the trajectory is: the values are ``uref - <x_j, mv>``.  Returns
    bounds on the norm of the change of the stored ``mv`` (``|fl(m + g) - m - g| <=
    u·|fl(m + g)|`` a coordinate: ``||g|| + u·||mv||``) and on ``||mv||``, each
    enlarged by ``γ_{d+4}`` for the sums of squares.  O(d·count).
    """
    d = X.shape[1]
    g[:] = 0.0
    p = 0
    while p + 4 <= count:
        j0, j1, j2, j3 = ej[at[p]], ej[at[p + 1]], ej[at[p + 2]], ej[at[p + 3]]
        c0, c1, c2, c3 = cf[p], cf[p + 1], cf[p + 2], cf[p + 3]
        for t in range(d):
            g[t] += (c0 * X[j0, t] + c1 * X[j1, t]) + (c2 * X[j2, t] + c3 * X[j3, t])
        p += 4
    while p < count:
        c0, j0 = cf[p], ej[at[p]]
        for t in range(d):
            g[t] += c0 * X[j0, t]
        p += 1
    sq = 0.0
    sqm = 0.0
    for t in range(d):
        v = mv[t] + g[t]
        mv[t] = v
        sq += g[t] * g[t]
        sqm += v * v
    grow = (1.0 + 2.0 * (d + 4) * _U64) * _ROUND_UP
    moved = math.sqrt(sqm) * grow
    return (math.sqrt(sq) * grow + 2.0 * _U64 * moved) * _ROUND_UP, moved


@njit(cache=True, inline="always")
def evaluate_by_move(r, seg, nf, pool, a, E, err, X, xnorm, sc, mv, g, at, cf, part, rec, fpos):
    """:func:`evaluate_neuron` for the lazy trainer's step when the neuron's move since
    its anchor is kept (``mv``, its row of the ``(m, d)`` array; ``g``, ``at``, ``cf``:
    scratch of lengths ``d``, ``n`` and ``n``).

    :func:`step_move` adds the exact step of the pairs that fired (``d`` multiply-adds
    each) and the drift grows by its norm.  The firing pairs are evaluated as ``uref -
    <x_j, mv>``, four at a time, and every other tracked pair — those of the ever-fired
    prefix included, which need no coefficient here — only once the drift reaches its
    key: a pair that stops firing gets a key like any other, and ``MINKEY`` is over all
    pairs that do not fire.  Neither the coefficients nor ``clast`` are read or written,
    nor the value of a pair that keeps firing (nothing reads it: the outputs take it as
    it is made; :func:`leave_moves` restores all three, should a run leave this route).
    With ``part`` of shape ``(n, K)`` (not ``(0, 0)``) the neuron's share of the
    outputs, ``a_r·(U_rj - b)`` over its pairs that fire after the step, is added to it
    as the values are made, unless the neuron must be re-anchored.  Returns what
    :func:`evaluate_neuron` returns.  O(d·(firing pairs + pairs whose key passed)).
    """
    ej, uref, val, key, fire = pool.j, pool.uref, pool.val, pool.key, pool.fire
    eta_s, b, R, cert = sc.eta_s, sc.b, sc.R, sc.cert
    f_j, f_v, f_on = rec.j, rec.value, rec.on
    record = f_j.shape[0] > 0
    K = a.shape[1]
    first = fpos
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    end = s0 + seg[r, CNT]
    count = 0
    for q in range(s0, s0 + ns):
        if fire[q]:
            at[count] = q
            cf[count] = eta_s * dot_row(a, r, err, ej[q])
            count += 1
    step, since_anchor = step_move(at, cf, count, ej, X, mv, g)
    drift = nf[r, DRIFT] + cert * step
    nf[r, DRIFT] = drift
    again = needs_reanchor(r, nf, since_anchor, R)
    add = part.shape[0] > 0 and not again
    p = 0
    while p < count:  # four dot products a pass share the loads of mv
        if p + 4 <= count:
            q0, q1, q2, q3 = at[p], at[p + 1], at[p + 2], at[p + 3]
            t0, t1, t2, t3 = dot4(X, ej[q0], ej[q1], ej[q2], ej[q3], mv)
            cf[p] = uref[q0] - t0
            cf[p + 1] = uref[q1] - t1
            cf[p + 2] = uref[q2] - t2
            cf[p + 3] = uref[q3] - t3
            p += 4
        else:
            q0 = at[p]
            cf[p] = uref[q0] - data_dot(X, ej[q0], mv)
            p += 1
    off = np.inf  # the smallest key of the pairs that stop firing
    for p in range(count):
        q = at[p]
        j = ej[q]
        v = cf[p]
        if v < b:
            val[q] = v
            if record:
                f_j[fpos], f_v[fpos], f_on[fpos] = j, v, False
            fpos += 1
            flip(r, q, seg, pool, a, E, eta_s, False)
            key[q] = entry_key(drift, v, b, xnorm[j])
            off = min(off, key[q])
        elif add:
            for kk in range(K):
                part[j, kk] += a[r, kk] * (v - b)
    evaluated = count
    if drift >= nf[r, MINKEY] and not again:
        best = np.inf
        for q in range(s0, end):  # increasing order: see flip
            if fire[q]:
                continue
            if key[q] <= drift:
                evaluated += 1
                j = ej[q]
                v = uref[q] - data_dot(X, j, mv)
                val[q] = v
                if v >= b:
                    if record:
                        f_j[fpos], f_v[fpos], f_on[fpos] = j, v, True
                    fpos += 1
                    flip(r, q, seg, pool, a, E, eta_s, True)
                    if add:
                        for kk in range(K):
                            part[j, kk] += a[r, kk] * (v - b)
                    continue
                key[q] = entry_key(drift, v, b, xnorm[j])
            best = min(best, key[q])
        nf[r, MINKEY] = best
    else:
        nf[r, MINKEY] = min(nf[r, MINKEY], off)
    if fpos > first:
        nf[r, SIGMA] = SIGMA_UNKNOWN
    return fpos, since_anchor, evaluated
