"""The lazy trainer: exact gradient descent with drift-certified fire sets.

Beyond the paper (``DESIGN.md`` §4).  Weights stay implicit
(``W(t) = W(0) - C X``, materialized at the end), products of moved neurons
are updated through the Gram identity (cost per product: the number of pairs
of the neuron that ever fired, not ``d``), and a pair's product is only
recomputed when a certificate says it may have crossed ``b``:

* every iteration, each moved neuron evaluates its pairs that ever fired
  (which hold its fire set; their values feed the forward pass) as one
  symmetric product with ``G[P, P]``; its drift ``D_r`` grows by a bound on
  its step, ``(η/sqrt m)·σ_r·||(a_r·err_l)_l||`` over the points it fires
  on, with ``σ_r² >= λ_max(G_SS)`` a Gershgorin bound refreshed when its
  fire set changes;
* any other tracked pair, last evaluated at drift ``D`` with value
  ``v < b``, cannot fire before ``D_r`` reaches ``D + (b - v)/||x_j||``: it
  is evaluated again only then;
* an untracked pair has an anchored product below ``b - β``: it cannot fire
  while ``||w_r(t) - w_r(anchor)||·R < β`` (exact, from the same symmetric
  product); past that the neuron is re-anchored (its row recomputed exactly,
  written to its WTree row, and its tracked pairs queried again at
  ``b - β``).  ``β`` is the re-anchoring budget (:func:`default_band`).

Per iteration: O(Σ_r |ever_r|² / 2 + evaluations of expiring pairs), where
``ever_r`` are the pairs of ``r`` that ever fired (about ``k̃_r``): no d.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from .._validation import available_memory
from ._band import (
    BETA,
    NFIRE,
    START,
    SUPP,
    BandState,
    evaluate_neuron,
    prefetch_block,
    refresh_keys,
    update_sigma,
)
from ._base import Trainer

__all__ = ["LazyTrainer", "default_band"]

_CHUNKS = 64  # fixed partition of neurons for deterministic parallel sums


def default_band(n: int, m: int, d: int) -> float:
    """Half-width ``β`` of the tracked band: 0.5 (in units of ``||w||·||x||`` drift)."""
    return 0.5


def _float_kind(name: str, value: Any) -> str:
    """``value`` as ``"float32"`` or ``"float64"``, or a ValueError naming ``name``."""
    try:
        kind = np.dtype(value).name
    except TypeError:
        kind = None
    if kind not in ("float32", "float64"):
        raise ValueError(f"{name} must be 'float32' or 'float64', got {value!r}")
    return kind


def choose_storage(n: int, m: int, gemm_dtype: str) -> str:
    """Storage of the anchored rows: float32 when the preprocessing GEMM is float32
    (float64 leaves would hold the same float32 values), and also when float64 rows
    would take more than a quarter of free memory (they share it with W, the tracked
    pairs and the preprocessing blocks); float64 otherwise."""
    if np.dtype(gemm_dtype) == np.float32 or 8.0 * n * m > 0.25 * available_memory():
        return "float32"
    return "float64"


@njit(cache=True, parallel=True)
def _evaluate(moved, seg, nf, pool, scratch, a, E, err, G, xnorm, eta_s, b, R, cert, flips,
              reanchor):
    """Bring the moved neurons to ``t+1`` (:func:`evaluate_neuron`), flip, and flag
    those whose band may be exceeded.  ``E`` must already be ``E(t+1)``."""
    ej = pool[0]
    none_j = np.empty(0, dtype=np.int64)
    none_v = np.empty(0)
    none_on = np.empty(0, dtype=np.bool_)
    for k in prange(moved.shape[0]):
        r = moved[k]
        if k + 1 < moved.shape[0]:
            prefetch_block(moved[k + 1], seg, ej, G)
        nflip, since_anchor = evaluate_neuron(r, seg, nf, pool, scratch, a, E, err, G, xnorm,
                                              eta_s, b, cert, none_j, none_v, none_on, 0)
        flips[k] = nflip
        reanchor[k] = since_anchor * R >= nf[r, BETA]


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


class BandTrainer(Trainer):
    """What the lazy and kernel trainers share: anchored products, tracked pairs,
    implicit weights, and outputs computed once from the exact firing values.

    Options
    -------
    band : float, optional
        Half-width ``β`` of the tracked band around ``b`` (default
        :func:`default_band`), the re-anchoring budget: a larger band tracks
        more pairs and re-anchors less often.
    anchor_dtype : {"float64", "float32"}, optional
        Storage of the anchored products (default :func:`choose_storage`:
        float32 with the default float32 GEMM, float64 with a float64 GEMM
        unless the n×m rows would take over a quarter of free memory).  Leaves
        carry their rounding error into every query, so both give the same
        trajectory.
    gemm_dtype : {"float32", "float64"}
        Precision of the preprocessing GEMM (default float32, twice as fast);
        every product within the float32 error bound of the band is
        recomputed in float64, so the trajectory is the same.
    _certificate_scale : float
        Multiplies the drift bounds.  Only for testing that the tests catch a
        certificate that is too tight: any value below 1 can miss crossings.
    """

    def __init__(self, model, X, Y, G, band: float | None = None,
                 anchor_dtype: str | None = None, gemm_dtype: str = "float32",
                 _certificate_scale: float = 1.0) -> None:
        super().__init__(model, X, Y, G)
        n, d = X.shape
        band = default_band(n, self.m, d) if band is None else float(band)
        if not band > 0:
            raise ValueError(f"band must be > 0, got {band}")
        gemm_dtype = _float_kind("gemm_dtype", gemm_dtype)
        anchor_dtype = (choose_storage(n, self.m, gemm_dtype) if anchor_dtype is None
                        else _float_kind("anchor_dtype", anchor_dtype))
        self.state = st = BandState(model._W, X, G, self.a, self.b, band, anchor_dtype,
                                    gemm_dtype)
        update_sigma(np.arange(self.m), st.seg, st.nf, st.pool.arrays, G)
        self.u = forward(np.flatnonzero(st.seg[:, NFIRE]).astype(np.int64), st.seg,
                         st.pool.arrays, self.a, self.b, self.scale, n)
        self.flips = 0
        self.scratch = np.empty((2, st.pool.capacity))  # per-entry coefficient changes
        self.cert = float(_certificate_scale)
        self.info.update(band=band, anchor_dtype=str(np.dtype(anchor_dtype)),
                         gemm_dtype=gemm_dtype)

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self.state.firing_csr()

    def _scratch(self) -> np.ndarray:
        if self.scratch.shape[1] < self.state.pool.capacity:
            self.scratch = np.empty((2, self.state.pool.capacity))
        return self.scratch

    def final_loss(self) -> float:
        return self._loss(self.u)[1]

    def finish(self) -> None:
        self.state.eta_s = self.lr * self.scale
        self.state.materialize(self.model._W)


class LazyTrainer(BandTrainer):
    """Exact GD whose per-iteration cost does not depend on ``d`` (see module docs;
    options: :class:`BandTrainer`)."""

    name = "lazy"

    def __init__(self, model, X, Y, G, **options: Any) -> None:
        super().__init__(model, X, Y, G, **options)
        st = self.state
        refresh_keys(np.arange(self.m), st.seg, st.nf, st.pool.arrays, st.xnorm, st.b)
        self.moved = np.flatnonzero(st.seg[:, NFIRE]).astype(np.int64)

    def step(self) -> dict[str, Any]:
        st = self.state
        err, loss = self._loss(self.u)
        row = {"loss": loss, "fired_pairs": st.fired_pairs(), "moved_neurons": len(self.moved),
               "flips": self.flips, "band_pairs": st.entries()}
        st.eta_s = self.lr * self.scale
        with self.timer("query"):
            st.E += err
            flips = np.zeros(self.moved.shape[0], dtype=np.int64)
            again = np.zeros(self.moved.shape[0], dtype=np.bool_)
            _evaluate(self.moved, st.seg, st.nf, st.pool.arrays, self._scratch(), self.a, st.E, err,
                      self.G, st.xnorm, st.eta_s, st.b, st.R, self.cert, flips, again)
            self.flips = int(flips.sum())
        with self.timer("update"):
            rows = self.moved[again]
            if rows.shape[0]:
                self.flips += st.reanchor(rows)[0].shape[0]
                refresh_keys(rows, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b)
                update_sigma(rows, st.seg, st.nf, st.pool.arrays, self.G)
        with self.timer("forward"):
            self.u = forward(self.moved, st.seg, st.pool.arrays, self.a, self.b, self.scale,
                             self.X.shape[0])
            self.moved = np.flatnonzero(st.seg[:, NFIRE]).astype(np.int64)
        row["reanchored"] = int(rows.shape[0])
        row.update(self.timer.pop())
        return row
