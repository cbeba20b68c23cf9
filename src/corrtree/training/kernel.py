"""The kernel-space trainer: exact gradient descent through the NTK recurrence.

Beyond the paper (``docs/design.md``, "The kernel trainer").  With ``H(t)`` the NTK matrix of the
current fire sets (``nK × nK``: ``(1/m)·Σ_r a_r a_rᵀ ⊗ (F_r F_rᵀ) ∘ G``) the
outputs obey exactly

    u(t+1) = u(t) - η·H(t)·err(t) + Σ_{(r,j) flipped} (a_r/sqrt m)·(U[r,j](t+1) - b)·(F_new - F_old)

so an iteration costs one ``nK × nK`` mat-vec, plus the work on the pairs that
cross ``b``.  Those are found without touching every neuron: while the fire
set of ``r`` is constant its drift obeys

    ||w_r(t') - w_r(t)|| <= (η/sqrt m)·σ_r·sqrt(K)·(P(t') - P(t)),   P(t) = Σ_{τ<t} ||err(τ)||_F

(``σ_r² >= λ_max(G_SS)``, a Gershgorin bound), so each neuron gets a key: the
value of the global, increasing ``P`` at which one of its tracked pairs, or
the band that protects its untracked pairs, could first be reached.  Keys
sit in a heap; an iteration processes only the neurons whose key ``P`` has
passed: it evaluates their tracked pairs exactly (Gram identity on the
anchored products, as in the lazy trainer), applies the flips to ``u`` and
``H`` (each changes a row and column of ``H`` by ``±G[j, S̃_r]/m``),
re-anchors the neuron if its band may be exceeded, and gives it a new key.
Per iteration: O((nK)² + work on the keyed neurons) -- no ``d``, and the
second term vanishes as the error decays.

Mini-batch SGD without momentum or weight decay is this recurrence with an
error that is zero outside the batch.  With momentum or weight decay a pair's
coefficient keeps changing after it stops firing, so ``u(t+1) - u(t)`` is no
longer ``H·err``: those steps are the band trainers' linear step
(:meth:`~.band.BandTrainer._advance_linear`, every moving neuron evaluated),
and ``H`` and the keys are left as they were.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .. import _config
from ._heap import pop_due, push_all
from ._ntk import ntk_matrix
from ._pairs import coef, neuron_key, set_keys
from ._pool import CNT, KEY, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP
from ._state import Field, Scalar, Schema, fail
from .band import BAND_FIELDS, BAND_SCALARS, BandTrainer
from .optim import LinearStep

__all__ = ["KEY", "KernelTrainer", "pop_due", "push_all", "screen"]

_ROUND_UP = _config.ROUND_UP
_U64 = _config.U64


@njit(cache=True, inline="always")
def _add_pair(H, a, r, j, i, G, sign, m, lo, hi):
    """``g·a_r a_rᵀ``, ``g = sign·G[j, i]/m``, into the ``(j, i)`` and ``(i, j)`` blocks of
    ``H``, the rows of points ``lo <= · < hi`` only."""
    K = a.shape[1]
    own_j, own_i = lo <= j < hi, lo <= i < hi
    if not (own_j or own_i):
        return
    g = sign * G[j, i] / m
    for k in range(K):
        for k2 in range(K):
            c = g * a[r, k] * a[r, k2]
            if own_j:
                H[j * K + k, i * K + k2] += c
            if own_i:
                H[i * K + k2, j * K + k] += c


@njit(cache=True, inline="always")
def _add_diag(H, a, r, j, g):
    K = a.shape[1]
    for k in range(K):
        for k2 in range(K):
            H[j * K + k, j * K + k2] += g * a[r, k] * a[r, k2]


def apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m) -> tuple[int, int]:
    """Add flips (grouped by neuron, already applied to the pool) to ``u`` and ``H``.

    For each neuron the fire set before its flips is rebuilt from the pool,
    then the flips are added one by one: turning ``j`` on adds, for every
    point ``l`` then firing with ``r``, ``G[j, l]/m·a_r a_rᵀ`` to the
    ``(j, l)`` and ``(l, j)`` blocks of ``H`` (and ``G[j, j]/m`` to
    ``(j, j)``); turning it off removes the same.  Returns the changes of the
    fired-pair and moved-neuron counts.

    Each thread owns a range of points: it walks all the flips and writes only
    the rows of ``H`` and ``u`` of its points, so every entry receives its
    additions in the serial order, whatever the number of threads.
    O(Σ_flips |S_r|·K²) writes, plus the walk per thread.
    """
    parts = max(1, min(numba.get_num_threads(), u.shape[0]))
    return _apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, parts)


@njit(cache=True, parallel=True)
def _apply_flips(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, parts):
    n = u.shape[0]
    counts = np.zeros((parts, 2), dtype=np.int64)
    for t in prange(parts):
        lo, hi = t * n // parts, (t + 1) * n // parts
        counts[t, 0], counts[t, 1] = _apply_flips_rows(
            fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, lo, hi
        )
    return counts[0, 0], counts[0, 1]


@njit(cache=True)
def _apply_flips_rows(fr, fj, fv, fon, seg, pool, u, H, a, G, b, scale, m, lo, hi):
    """:func:`apply_flips` for the rows of points ``lo <= · < hi``."""
    ej, fire = pool[0], pool[6]
    K = a.shape[1]
    d_fired = 0
    d_moved = 0
    i = 0
    while i < fr.shape[0]:
        r = fr[i]
        stop = i
        while stop < fr.shape[0] and fr[stop] == r:
            stop += 1
        s0 = seg[r, START]
        cur = np.empty(seg[r, NFIRE] + (stop - i), dtype=np.int64)
        nc = 0
        for q in range(s0, s0 + seg[r, SUPP]):  # fire set after the flips
            if fire[q]:
                keep = True
                for f in range(i, stop):
                    if fon[f] and fj[f] == ej[q]:
                        keep = False  # turned on by these flips: not in the old set
                if keep:
                    cur[nc] = ej[q]
                    nc += 1
        for f in range(i, stop):  # turned off by these flips: in the old set
            if not fon[f]:
                cur[nc] = fj[f]
                nc += 1
        before = nc
        for f in range(i, stop):
            j = fj[f]
            if fon[f]:
                sign = 1.0
            else:
                sign = -1.0
                for c in range(nc):  # leave the set first
                    if cur[c] == j:
                        cur[c] = cur[nc - 1]
                        nc -= 1
                        break
            for c in range(nc):
                _add_pair(H, a, r, j, cur[c], G, sign, m, lo, hi)
            if fon[f]:
                cur[nc] = j
                nc += 1
            if lo <= j < hi:
                _add_diag(H, a, r, j, sign * G[j, j] / m)
                z = sign * scale * (fv[f] - b)
                for k in range(K):
                    u[j, k] += a[r, k] * z
        d_fired += nc - before
        d_moved += (nc > 0) - (before > 0)
        i = stop
    return d_fired, d_moved


@njit(cache=True, parallel=True)
def anchor_keys(rows, seg, nf, pool, G, xnorm, d, scatter, b, R, P, per_p, room):
    """Pair keys, neuron keys and room of freshly anchored neurons (all values current)."""
    for k in prange(rows.shape[0]):
        r = rows[k]
        set_keys(r, seg, nf, pool, xnorm, b)
        nf[r, KEY] = neuron_key(r, seg, nf, pool, G, xnorm, d, scatter, b, R, P, per_p, 0.0, room)


@njit(cache=True, parallel=True)
def screen(rows, seg, nf, pool, a, E, eta_s, xnorm, room, P, per_p, cert, due):
    """Which neurons ``rows``, whose keys have passed, must be evaluated.

    A key bounds every step by the global ``||err||``.  Since its last
    evaluation the fire set ``S`` of ``r`` is constant, so ``w_r`` moved by
    exactly ``Σ_l dl_l x_l`` over its ever-fired pairs, ``dl = C - clast``:
    its own errors, summed with their signs.  The move is at most
    ``σ_r·||dl_S|| + Σ_{l ∉ S} |dl_l|·||x_l||`` (the second term is rounding:
    a frozen coefficient does not change), times ``cert`` and the rounding of
    the norm.  Below the room ``room[r]`` left at that evaluation no pair can
    have changed side and the band still holds: ``due[k]`` is False and the
    key becomes ``P + (room - move)/(per_p·σ_r)``.  O(|prefix_r|·K) a neuron.
    """
    ej, clast, fire = pool.j, pool.clast, pool.fire
    for k in prange(rows.shape[0]):
        r = rows[k]
        due[k] = True
        sig = nf[r, SIGMA]
        if sig == SIGMA_UNKNOWN or not room[r] > 0:
            continue
        s0 = seg[r, START]
        ns = seg[r, SUPP]
        sq = 0.0
        off = 0.0
        for q in range(s0, s0 + ns):
            dl = coef(q, r, pool, a, E, eta_s) - clast[q]
            if fire[q]:
                sq += dl * dl
            else:
                off += abs(dl) * xnorm[ej[q]]
        move = cert * (sig * math.sqrt(sq) + off) * (1.0 + (ns + 4) * _U64) * _ROUND_UP
        if move < room[r]:
            due[k] = False
            nf[r, KEY] = P + (room[r] - move) / (per_p * sig) if sig > 0 else np.inf


class KernelTrainer(BandTrainer):
    """Exact GD whose per-iteration cost grows with neither ``m`` nor ``d`` (module docs;
    options: :class:`~.band.BandTrainer`)."""

    name = "kernel"
    SCHEMA = Schema(
        4,
        (
            *BAND_FIELDS,
            Field("H", ("f8",), ("nK", "nK")),
            Field("heap_keys", ("f8",), ("heap",)),
            Field("heap_ids", ("i8",), ("heap",), index="m"),
            Field("room", ("f8",), ("m",)),
        ),
        (*BAND_SCALARS, Scalar("P", float, 0.0)),
    )

    def _prepare(self, W0: np.ndarray, **options: Any) -> None:
        n, K = self.X.shape[0], self.a.shape[1]
        if not _config.ntk_fits(n, K):
            raise MemoryError(
                f"method='kernel' needs {_config.ntk_bytes(n, K) / 2**30:.2f} "
                f"GiB for the {n * K}×{n * K} NTK matrix; use method='lazy'"
            )
        super()._prepare(W0, **options)
        self.H = ntk_matrix(*self.store.firing_csr(), self.G, self.a, self.width)
        self.P = 0.0
        self.room = np.zeros(self.m)  # drift room at the last evaluation (neuron_key)
        self._count()

    def _count(self) -> None:
        st = self.store
        self.fired = st.fired_pairs()
        self.moved = st.moved_neurons()
        self.entries = st.entries()

    @property
    def per_p(self) -> float:
        """The drift of a neuron grows at most ``per_p·σ_r`` per unit of ``P``."""
        return self.eta_s * math.sqrt(self.a.shape[1]) * self.cert * _config.ROUND_UP

    def _anchor_keys(self, rows: np.ndarray) -> None:
        """:func:`anchor_keys` of freshly anchored ``rows`` at the current ``P``."""
        st = self.store
        anchor_keys(
            rows,
            st.seg,
            st.nf,
            st.pool.arrays,
            self.G,
            st.xnorm,
            self.X.shape[1],
            _config.scatter_cost(st.n),
            st.b,
            st.R,
            self.P,
            self.per_p,
            self.room,
        )

    def _start(self) -> None:
        """Every neuron gets its first key, once the learning rate sets the drift rate."""
        st = self.store
        every = np.arange(self.m)
        self._anchor_keys(every)
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_size = push_all(self.heap_keys, self.heap_ids, 0, every, st.nf)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, scalars = super().state()
        size = self.heap_size
        arrays.update(
            H=self.H,
            heap_keys=self.heap_keys[:size],
            heap_ids=self.heap_ids[:size],
            room=self.room,
        )
        return arrays, {**scalars, "P": self.P}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        keys, ids = arrays["heap_keys"], arrays["heap_ids"]
        if ids.shape[0] > self.m or np.unique(ids).shape[0] != ids.shape[0]:
            fail("heap_ids", "must hold distinct neurons")
        parent = (np.arange(1, ids.shape[0]) - 1) // 2
        if (keys[parent] > keys[1:]).any():
            fail("heap_keys", "not a heap")
        if not (arrays["room"] >= 0).all():
            fail("room", "must be >= 0")
        super()._restore(W0, arrays, scalars, sizes)
        self.H = arrays["H"]
        self.P = scalars["P"]
        self.room = arrays["room"]
        self.heap_size = ids.shape[0]
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_keys[: self.heap_size] = keys
        self.heap_ids[: self.heap_size] = ids
        self._count()

    def ntk(self) -> np.ndarray:
        return self.H

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        if step is not None:  # the recurrence needs Δc = η·f·a·err: see the module docs
            return self._advance_linear(err, step)
        st = self.store
        stats = (self.fired, self.moved, self.flips, self.entries)
        with self.timer("forward"):
            self.u -= self.lr * (self.H @ err.ravel()).reshape(self.u.shape)
            st.E += err
            self.P += float(np.sqrt(np.einsum("ik,ik->", err, err))) * _config.ROUND_UP
        with self.timer("query"):
            popped, self.heap_size = pop_due(self.heap_keys, self.heap_ids, self.heap_size, self.P)
            mask = np.empty(popped.shape[0], dtype=np.bool_)
            screen(
                popped,
                st.seg,
                st.nf,
                st.pool.arrays,
                self.a,
                st.E,
                self.eta_s,
                st.xnorm,
                self.room,
                self.P,
                self.per_p,
                self.cert,
                mask,
            )
            due = popped[mask]
            _, again, flips = self._evaluate(
                due, np.empty((0, self.a.shape[1])), True, self.P, self.per_p, self.room
            )
        with self.timer("update"):
            self.flips = self._apply(flips)
            rows = due[again]
            if rows.shape[0]:
                before = int(st.seg[rows, CNT].sum())
                self.flips += self._apply(self._reanchor(rows))
                self._anchor_keys(rows)
                self.entries += int(st.seg[rows, CNT].sum()) - before
            self.heap_size = push_all(self.heap_keys, self.heap_ids, self.heap_size, popped, st.nf)
        row = self._row(*stats, reanchored=rows.shape[0], evaluated_pairs=self.evaluated)
        self.evaluated = 0
        return row

    def _apply(self, flips: tuple[np.ndarray, ...]) -> int:
        """Add flips to ``u`` and ``H`` and to the counts; returns their number."""
        fr, fj, fv, fon = flips
        d_fired, d_moved = apply_flips(
            fr,
            fj,
            fv,
            fon,
            self.store.seg,
            self.store.pool.arrays,
            self.u,
            self.H,
            self.a,
            self.G,
            self.b,
            self.scale,
            float(self.width),
        )
        self.fired += d_fired
        self.moved += d_moved
        return int(fr.shape[0])
