"""The lazy trainer: exact gradient descent with drift-certified fire sets.

Beyond the paper (``DESIGN.md`` §4).  Weights stay implicit
(``W(t) = W(0) - C X``, materialized at the end), products of moved neurons
are updated through the Gram identity (cost per product: the number of pairs
of the neuron that ever fired, not ``d``), and a pair's product is only
recomputed when a certificate says it may have crossed ``b``:

* every neuron ``r`` keeps a drift ``D_r >= Σ_τ ||w_r(τ+1) - w_r(τ)||``, the
  running sum of bounds ``(η/sqrt m)·σ_r·||e||`` on its step norms, with
  ``e_l = a_r·err_l`` on the points it fires on and ``σ_r² >= λ_max(G_SS)``
  a Gershgorin bound refreshed when its fire set changes (O(k̃) per step);
* a tracked pair last evaluated at drift ``D`` with value ``v < b`` cannot
  fire before ``D_r`` reaches ``D + (b - v)/||x_j||``: it is evaluated again
  then (and every firing pair is evaluated each iteration for the forward
  pass);
* an untracked pair has an anchored product below ``b - β``: it cannot fire
  while ``D_r - D_r(anchor) < β/R``; past that the neuron is re-anchored
  (its row recomputed exactly, written to its WTree row, and its tracked
  pairs queried again at ``b - β``).

Per iteration: O(Σ_r k̃_r·|ever_r| + evaluations of expiring pairs), where
``ever_r`` are the pairs of ``r`` that ever fired (about ``k̃_r``), independent
of d.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from .._prefetch import prefetch2d
from .._validation import available_memory
from ._band import (
    BETA,
    CNT,
    DRIFT,
    DRIFT_ANCHOR,
    MINKEY,
    NFIRE,
    SIGMA,
    START,
    SUPP,
    BandState,
    _dot_row,
    _flip,
    _gram_sum,
    sigma,
    update_sigma,
)
from ._base import Trainer

__all__ = ["LazyTrainer", "default_band"]

_CHUNKS = 64  # fixed partition of neurons for deterministic parallel sums
_SAFE = 1.0 + 1e-12  # rounding margin on computed drifts


def default_band(n: int, m: int, d: int) -> float:
    """Half-width ``β`` of the tracked band: 0.5 (in units of ``||w||·||x||`` drift)."""
    return 0.5


def choose_storage(n: int, m: int, d: int, K: int) -> str:
    """float64 anchored rows unless they would take more than 40% of free memory."""
    return "float64" if 8.0 * n * m <= 0.4 * available_memory() else "float32"


@njit(cache=True, parallel=True)
def _step_drift(moved, seg, nf, pool, a, err, eta_s, scale):
    """``D_r += (η/sqrt m)·σ_r·||e||``, a bound on ``||w_r(t+1) - w_r(t)||``.

    ``e_l = a_r·err_l`` over the points ``r`` fires on at ``t`` and ``σ_r``
    bounds ``sqrt(λ_max(G_SS))`` (:func:`sigma`): O(k̃_r·K) per neuron.
    """
    ej, fire = pool[0], pool[6]
    for k in prange(moved.shape[0]):
        r = moved[k]
        s0 = seg[r, START]
        acc = 0.0
        for p in range(seg[r, SUPP]):
            if fire[s0 + p]:
                e = _dot_row(a, r, err, ej[s0 + p])
                acc += e * e
        nf[r, DRIFT] += eta_s * nf[r, SIGMA] * math.sqrt(acc) * scale


@njit(cache=True, parallel=True)
def _evaluate(moved, seg, nf, pool, scratch, a, E, G, xnorm, eta_s, b, R, flips, reanchor):
    """Evaluate the moved neurons' pairs that may have changed side at ``t+1``; apply flips.

    The ever-fired pairs (which hold every firing pair) are all evaluated,
    as one symmetric product with ``G[P, P]`` (``|P|(|P|+1)/2`` reads of
    ``G``); any other tracked pair only once its deadline has passed.
    ``E`` must already be ``E(t+1)``.  Writes per-neuron flip counts and
    re-anchor flags.
    """
    ej, uref, val, key, kappa, cref, fire = pool
    for k in prange(moved.shape[0]):
        r = moved[k]
        s0 = seg[r, START]
        ns = seg[r, SUPP]
        end = s0 + seg[r, CNT]
        drift = nf[r, DRIFT]
        if k + 1 < moved.shape[0]:  # start fetching the next neuron's block of G
            r2 = moved[k + 1]
            t0 = seg[r2, START]
            t1 = t0 + seg[r2, SUPP]
            for q in range(t0, t1):
                for q2 in range(q, t1):
                    prefetch2d(G, ej[q], ej[q2])
        for q in range(s0, s0 + ns):  # coefficient changes since the anchor
            c = kappa[q]
            if fire[q]:
                c += eta_s * _dot_row(a, r, E, ej[q])
            scratch[q] = c - cref[q]
            val[q] = uref[q]
        for q in range(s0, s0 + ns):  # val -= G[P, P] dc, reading each G[p, q] once
            jp = ej[q]
            dp = scratch[q]
            ap = G[jp, jp] * dp
            for q2 in range(q + 1, s0 + ns):
                g = G[jp, ej[q2]]
                ap += g * scratch[q2]
                val[q2] -= g * dp
            val[q] -= ap
        nflip = 0
        for q in range(s0, s0 + ns):
            now = val[q] >= b
            if now != fire[q]:
                _flip(r, q, seg, pool, a, E, eta_s, now)
                nflip += 1
        if drift >= nf[r, MINKEY]:  # some other tracked pair may have crossed
            best = np.inf
            for q in range(s0 + ns, end):  # increasing order: see _flip
                if key[q] <= drift:
                    # positions below s0 + ns keep their pairs even after flips
                    val[q] = uref[q] - _gram_sum(G, ej[q], ej, scratch, s0, ns)
                    if val[q] >= b:
                        _flip(r, q, seg, pool, a, E, eta_s, True)
                        nflip += 1
                        continue
                    xn = xnorm[ej[q]]
                    key[q] = drift + (b - val[q]) / xn if xn > 0 else np.inf
                best = min(best, key[q])
            nf[r, MINKEY] = best
        flips[k] = nflip
        if nflip:
            nf[r, SIGMA] = sigma(r, seg, pool, G)
        reanchor[k] = drift >= nf[r, DRIFT_ANCHOR] + nf[r, BETA] / R


@njit(cache=True)
def _set_keys(r, seg, nf, pool, xnorm, b):
    """Drift at which each tracked pair of ``r`` outside the ever-fired prefix must
    be evaluated again, and their minimum (all values of ``r`` must be current)."""
    ej, val, key = pool[0], pool[2], pool[3]
    s0 = seg[r, START]
    drift = nf[r, DRIFT]
    best = np.inf
    for q in range(s0 + seg[r, SUPP], s0 + seg[r, CNT]):
        xn = xnorm[ej[q]]
        key[q] = drift + (b - val[q]) / xn if xn > 0 else np.inf
        best = min(best, key[q])
    nf[r, MINKEY] = best


@njit(cache=True, parallel=True)
def refresh_keys(rows, seg, nf, pool, xnorm, b):
    for k in prange(rows.shape[0]):
        _set_keys(rows[k], seg, nf, pool, xnorm, b)


@njit(cache=True, parallel=True)
def forward(neurons, seg, pool, a, b, scale, n):
    """``u = scale · Σ_r a_r (U_rj - b)`` over the firing pairs of ``neurons``.

    Summed in a fixed number of chunks so the result does not depend on
    thread scheduling.
    """
    ej, val, fire = pool[0], pool[2], pool[6]
    K = a.shape[1]
    parts = np.zeros((_CHUNKS, n, K))
    size = (neurons.shape[0] + _CHUNKS - 1) // _CHUNKS
    for c in prange(_CHUNKS):
        for k in range(c * size, min((c + 1) * size, neurons.shape[0])):
            r = neurons[k]
            s0 = seg[r, START]
            for p in range(seg[r, SUPP]):
                q = s0 + p
                if fire[q]:
                    z = val[q] - b
                    for kk in range(K):
                        parts[c, ej[q], kk] += a[r, kk] * z
    u = np.zeros((n, K))
    for c in range(_CHUNKS):
        u += parts[c]
    return u * scale


class LazyTrainer(Trainer):
    """Exact GD whose per-iteration cost does not depend on ``d`` (see module docs).

    Options
    -------
    band : float, optional
        Half-width ``β`` of the tracked band around ``b`` (default
        :func:`default_band`); a larger band tracks more pairs and re-anchors
        less often.
    anchor_dtype : {"float64", "float32"}, optional
        Storage of the anchored products (default: float64 when the n×m rows
        take under 40% of free memory).
    gemm_dtype : {"float32", "float64"}
        Precision of the preprocessing GEMM (default float32, twice as fast);
        every product within the float32 error bound of the band is
        recomputed in float64, so the trajectory is the same.
    _certificate_scale : float
        Multiplies the drift bounds.  Only for testing that the tests catch a
        certificate that is too tight: any value below 1 can miss crossings.
    """

    name = "lazy"

    def __init__(self, model, X, Y, G, band: float | None = None,
                 anchor_dtype: str | None = None, gemm_dtype: str = "float32",
                 _certificate_scale: float = 1.0) -> None:
        super().__init__(model, X, Y, G)
        n, d = X.shape
        band = default_band(n, self.m, d) if band is None else float(band)
        if not band > 0:
            raise ValueError(f"band must be > 0, got {band}")
        anchor_dtype = anchor_dtype or choose_storage(n, self.m, d, self.a.shape[1])
        self.state = BandState(model._W, X, G, self.a, self.b, band, anchor_dtype, gemm_dtype)
        st = self.state
        every = np.arange(self.m)
        refresh_keys(every, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b)
        update_sigma(every, st.seg, st.nf, st.pool.arrays, G)
        self.moved = np.flatnonzero(st.seg[:, NFIRE]).astype(np.int64)
        self.u = forward(self.moved, st.seg, st.pool.arrays, self.a, self.b, self.scale, n)
        self.flips = 0
        self.scratch = np.empty(st.pool.capacity)  # per-entry coefficient changes
        self.drift_scale = _SAFE * float(_certificate_scale)
        self.info.update(band=band, anchor_dtype=str(np.dtype(anchor_dtype)),
                         gemm_dtype=gemm_dtype)

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self.state.firing_csr()

    def step(self) -> dict[str, Any]:
        st = self.state
        err, loss = self._loss(self.u)
        row = {"loss": loss, "fired_pairs": st.fired_pairs(), "moved_neurons": len(self.moved),
               "flips": self.flips, "band_pairs": st.entries()}
        st.eta_s = self.lr * self.scale
        with self.timer("update"):
            _step_drift(self.moved, st.seg, st.nf, st.pool.arrays, self.a, err, st.eta_s,
                        self.drift_scale)
            st.E += err
        with self.timer("query"):
            flips = np.zeros(self.moved.shape[0], dtype=np.int64)
            again = np.zeros(self.moved.shape[0], dtype=np.bool_)
            if self.scratch.shape[0] < st.pool.capacity:
                self.scratch = np.empty(st.pool.capacity)
            _evaluate(self.moved, st.seg, st.nf, st.pool.arrays, self.scratch, self.a, st.E,
                      self.G, st.xnorm, st.eta_s, st.b, st.R, flips, again)
            self.flips = int(flips.sum())
            rows = self.moved[again]
            if rows.shape[0]:
                st.nf[rows, DRIFT_ANCHOR] = st.nf[rows, DRIFT]
                fr = st.reanchor(rows)[0]
                self.flips += fr.shape[0]
                refresh_keys(rows, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b)
                update_sigma(rows, st.seg, st.nf, st.pool.arrays, self.G)
        with self.timer("forward"):
            self.u = forward(self.moved, st.seg, st.pool.arrays, self.a, self.b, self.scale,
                             self.X.shape[0])
            self.moved = np.flatnonzero(st.seg[:, NFIRE]).astype(np.int64)
        row["reanchored"] = int(rows.shape[0])
        row.update(self.timer.pop())
        return row

    def final_loss(self) -> float:
        return self._loss(self.u)[1]

    def finish(self) -> None:
        self.state.eta_s = self.lr * self.scale
        self.state.materialize(self.model._W)
