"""Keys and clocks: every band trainer's keys of its tracked pairs from their values
(:func:`set_keys`), and the kernel trainer's clocks, when a neuron's certificate may
expire, on the global clock ``P`` or on its own (``docs/design.md``, "The kernel
trainer")."""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from ._pairs import (
    by_data,
    dot_row,
    entry_key,
    sigma,
    trace_sigma,
)
from ._pool import BETA, CNT, DRIFT, KEY, MINKEY, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP

__all__ = [
    "anchor_keys",
    "entry_key",
    "heap_key",
    "lookahead",
    "own_clocks",
    "refresh_keys",
    "set_keys",
    "sigma_of",
]

_ROUND_UP = _config.ROUND_UP
_U64 = _config.U64
_EVALUATE_CHUNKS = _config.EVALUATE_CHUNKS


@njit(cache=True, inline="always")
def sigma_of(r, seg, nf, pool, G, xnorm, d, scatter):
    """``σ_r`` (``nf[r, SIGMA]``), computed if unknown: :func:`~._pairs.trace_sigma` for a
    neuron whose values come from the data (:func:`~._pairs.by_data`), else the
    Gershgorin bound :func:`~._pairs.sigma`."""
    if nf[r, SIGMA] == SIGMA_UNKNOWN:
        if by_data(d, seg[r, SUPP], scatter):
            nf[r, SIGMA] = trace_sigma(r, seg, pool, xnorm)
        else:
            nf[r, SIGMA] = sigma(r, seg, pool, G)
    return nf[r, SIGMA]


@njit(cache=True, inline="always")
def heap_key(r, nf, anchor_drift, R, P, per_p):
    """The value of ``P`` at which the drift of ``r`` may first reach the smallest key of
    its entries (``nf[r, MINKEY]``) or its band (``β/R`` past ``anchor_drift[r]``): the
    drift grows at most ``per_p·σ_r`` per unit of ``P``."""
    drift = nf[r, DRIFT]
    slack = min(nf[r, MINKEY] - drift, nf[r, BETA] / R - (drift - anchor_drift[r]))
    rate = per_p * nf[r, SIGMA]
    return P + max(slack, 0.0) / rate if rate > 0 else np.inf


@njit(cache=True, parallel=True)
def anchor_keys(rows, seg, nf, pool, G, xnorm, d, sc, drifts):
    """Keys of freshly anchored neurons ``rows`` (all values current): every entry's, the
    neuron's (:func:`heap_key`), ``drifts.anchor[r]``, its drift now, and
    ``drifts.residual[r] = 0``: no residual move since the anchor yet (``sc``:
    :data:`~._records.VisitScalars`)."""
    ej, val, key = pool.j, pool.val, pool.key
    b, R, P, per_p, scatter = sc.b, sc.R, sc.P, sc.per_p, sc.scatter
    anchor_drift, res_drift = drifts.anchor, drifts.residual
    for k in prange(rows.shape[0]):
        r = rows[k]
        drift = nf[r, DRIFT]
        best = np.inf
        s0 = seg[r, START]
        for q in range(s0, s0 + seg[r, CNT]):
            key[q] = entry_key(drift, val[q], b, xnorm[ej[q]])
            best = min(best, key[q])
        nf[r, MINKEY] = best
        anchor_drift[r] = drift
        res_drift[r] = 0.0
        sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
        nf[r, KEY] = heap_key(r, nf, anchor_drift, R, P, per_p)


@njit(cache=True, parallel=True)
def own_clocks(seg, nf, pool, a, err, xnorm, sc, anchor_drift, clock, due, X, move):
    """Advance every neuron's own clock by a bound on its step under the error ``err``,
    and mark in ``due`` the neurons it may have brought to an entry's key or to their band.

    While the fire set ``S`` of ``r`` is constant its step ``eta_s·Σ_{l ∈ S} e_l x_l``,
    ``e_l = <a_r, err_l>``, has norm at most ``eta_s·min(σ_r·||e_S||, Σ_S |e_l|·||x_l||)``
    (Cauchy–Schwarz, the triangle inequality): the errors on the neuron's own fire set,
    where the global clock ``P`` can only use ``sqrt(K)·||err||_F``.  ``clock[r]``, the
    drift at the last visit plus these bounds since (``cert`` times, with their
    rounding), bounds the drift the neuron may have reached; it is due once that reaches
    ``nf[r, MINKEY]`` or ``anchor_drift[r] + β/R`` (always, while ``clock[r]`` is
    infinite).  ``sc``: :data:`~._records.VisitScalars`.  O(fired pairs·K).

    With ``move`` the step's own norm is a third bound: ``s = Σ_S e_l x_l`` formed from
    the data ``X`` (``d`` more multiply-adds a fired pair), ``||s||`` with its rounding
    (each entry of ``s`` off by at most ``γ_P·Σ |e_l||x_lt|``, so the vector by
    ``γ_P·Σ |e_l|·||x_l||``).  On low-dimensional data the errors of a fitted model are
    nearly orthogonal to the features, and ``||s||`` is a small share of the triangle
    bound (a tenth on scikit-learn's diabetes set): far fewer neurons are due.  With
    ``K > 1`` the rounding of each ``e_l`` (``γ_K·Σ_k |a_rk·err_lk|``) is added too.
    O(fired pairs·(K + d)).
    """
    eta_s, cert, R = sc.eta_s, sc.cert, sc.R
    ej, fire = pool.j, pool.fire
    m = seg.shape[0]
    d, K = X.shape[1], a.shape[1]
    chunks = min(m, _EVALUATE_CHUNKS)
    for c in prange(chunks):
        s = np.zeros(d if move else 0)
        for r in range(c * m // chunks, (c + 1) * m // chunks):
            if seg[r, NFIRE]:
                s0 = seg[r, START]
                ns = seg[r, SUPP]
                sq = 0.0
                tri = 0.0
                tra = 0.0
                if move:
                    s[:] = 0.0
                for q in range(s0, s0 + ns):
                    if fire[q]:
                        j = ej[q]
                        e = dot_row(a, r, err, j)
                        sq += e * e
                        tri += abs(e) * xnorm[j]
                        if move:
                            for t in range(d):
                                s[t] += e * X[j, t]
                            if K > 1:  # e's own rounding: γ_K·Σ_k |a_rk·err_jk|
                                ea = 0.0
                                for k in range(K):
                                    ea += abs(a[r, k] * err[j, k])
                                tra += ea * xnorm[j]
                step = tri
                if nf[r, SIGMA] >= 0.0:
                    step = min(step, nf[r, SIGMA] * math.sqrt(sq))
                if move:
                    ss = 0.0
                    for t in range(d):
                        ss += s[t] * s[t]
                    own = math.sqrt(ss) * (1.0 + (d + 4) * _U64)
                    own += 2.0 * (ns + 4) * _U64 * tri + 2.0 * (K + 2) * _U64 * tra
                    step = min(step, own)
                clock[r] += cert * eta_s * step * (1.0 + (ns + 4) * _U64) * _ROUND_UP
            due[r] = clock[r] >= min(nf[r, MINKEY], anchor_drift[r] + nf[r, BETA] / R)


def lookahead(after: float, before: float) -> float:
    """How far, in steps like the last, a neuron is still expected to move: ``ρ/(1 - ρ)``
    with ``ρ = after/before`` the contraction of the error norm by this step (before its
    flips), or 0 when ``ρ`` exceeds :data:`~corrtree._config.LOOKAHEAD_CONTRACTION`.

    On isotropic data with ``lr = 1/λ_max`` the error shrinks 3-5 times a step, so a
    neuron's first step is most of its whole path (W4: the first step takes 0.8 of the
    band, the whole path 1.3): a visit that finds its step, plus what is still to come,
    beyond its band re-anchors it at once, without computing the values the
    re-anchoring recomputes, and the fresh anchor then holds to the end instead of being
    replaced one step later.  Only the time of a re-anchoring changes, not the result.
    """
    if not before > 0 or not after < _config.LOOKAHEAD_CONTRACTION * before:
        return 0.0
    rho = after / before
    return rho / (1.0 - rho)


@njit(cache=True)
def set_keys(r, seg, nf, pool, xnorm, b, prefix):
    """Keys of the tracked pairs of ``r`` outside its ever-fired prefix (with ``prefix``:
    of all its pairs that do not fire), and their minimum, from current values (the
    drift is ``nf[r, DRIFT]``)."""
    ej, val, key, fire = pool.j, pool.val, pool.key, pool.fire
    s0 = seg[r, START]
    drift = nf[r, DRIFT]
    best = np.inf
    for q in range(s0 if prefix else s0 + seg[r, SUPP], s0 + seg[r, CNT]):
        if fire[q]:
            continue
        key[q] = entry_key(drift, val[q], b, xnorm[ej[q]])
        best = min(best, key[q])
    nf[r, MINKEY] = best


@njit(cache=True, parallel=True)
def refresh_keys(rows, seg, nf, pool, xnorm, b, prefix=False):
    """:func:`set_keys` for every neuron of ``rows``."""
    for k in prange(rows.shape[0]):
        set_keys(rows[k], seg, nf, pool, xnorm, b, prefix)
