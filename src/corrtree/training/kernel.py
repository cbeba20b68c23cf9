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
re-anchors the neuron if its band may be exceeded, and gives it a new key.  On data
with leading directions, while the visits read a large share of the fired pairs,
each neuron keeps its own clock instead (:func:`own_clocks`: the errors on its own
fire set, one O(fired pairs) pass a step; :meth:`KernelTrainer._choose_clock`).
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
import time
from typing import Any

import numpy as np

from .. import _config
from ._clocks import anchor_keys, lookahead, own_clocks
from ._flips import (
    apply_flips,
    apply_flips_by_rows,
    flip_outputs,
    flips_by_rows_cost,
    is_symmetric,
    new_h_cost,
)
from ._heap import pop_due, push_all
from ._ntk import gemm_adds, ntk_matrix
from ._pool import BETA, CNT, DRIFT, NFIRE, START, SUPP
from ._principal import principal_parts
from ._records import Drifts, VisitScalars
from ._state import Field, Scalar, Schema, fail
from ._visit import rough_copy, visit_few, visit_rows
from .band import BAND_FIELDS, BAND_SCALARS, BandTrainer
from .optim import LinearStep

__all__ = ["KernelTrainer"]


def _norm(v: np.ndarray) -> float:
    return float(np.sqrt(np.einsum("ik,ik->", v, v)))


class KernelTrainer(BandTrainer):
    """Exact GD whose per-iteration cost grows with neither ``m`` nor ``d`` (module docs;
    options: :class:`~.band.BandTrainer`)."""

    name = "kernel"
    SCHEMA = Schema(
        7,
        (
            *BAND_FIELDS,
            Field("H", ("f8",), ("nK", "nK")),
            Field("heap_keys", ("f8",), ("heap",)),
            Field("heap_ids", ("i8",), ("heap",), index="m"),
            Field("anchor_drift", ("f8",), ("m",)),
            Field("res_drift", ("f8",), ("m",), finite=False),
            Field("clock", ("f8",), ("m",), finite=False),
        ),
        (*BAND_SCALARS, Scalar("P", float, 0.0)),
    )

    def _prepare(self, W0: np.ndarray, _drop_band: bool | None = None, **options: Any) -> None:
        """``_drop_band``: whether :meth:`_start` drops the set-up's band (for tests; by
        default it judges, :meth:`_first_step_reanchors`); ``options``:
        :class:`~.band.BandTrainer`'s."""
        self._drop_band = _drop_band
        n, K = self.X.shape[0], self.a.shape[1]
        if not _config.ntk_fits(n, K):
            raise MemoryError(
                f"method='kernel' needs {_config.ntk_bytes(n, K) / 2**30:.2f} "
                f"GiB for the {n * K}×{n * K} NTK matrix; use method='lazy'"
            )
        super()._prepare(W0, **options)
        self.H = ntk_matrix(*self.store.firing_csr(), self.G, self.a, self.width)
        self._scratch: np.ndarray | None = None  # apply_flips_by_rows's, made when first used
        self._by_rows: bool | None = None  # whether it may be used (_rows_fit)
        self._set_parts()
        self.P = 0.0
        self.anchor_drift = np.zeros(self.m)  # D_r - anchor_drift[r] bounds the distance
        self.res_drift = np.zeros(self.m)  # bounds its residual part (principal_parts)
        self.clock = np.zeros(self.m)  # own clocks: the drift each neuron may have reached
        self._consistent = True  # every ever-fired value is of the neuron's last visit
        self._count()

    def _set_parts(self) -> None:
        """:func:`principal_parts` of the data; whether own clocks may be used (on data
        with leading directions, :meth:`_choose_clock`), and they are to start with; what
        building ``H`` anew by GEMMs costs (:func:`~._ntk.gemm_adds`, for :meth:`_apply`);
        X in float32 for the moves whose norms alone are read (:func:`rough_copy`)."""
        self._gemm_adds = gemm_adds(self.a, self.X.shape[0])
        self._parts = principal_parts(
            self.X, self.G, _config.PROJECTION_RANK, _config.PROJECTION_GAIN
        )
        self._coherent = self._own = self._parts.Z.shape[1] > 0
        self._due = np.zeros(self.m, dtype=np.bool_)
        self._x32, self._x32_err = rough_copy(self.X)

    def _choose_clock(self, popped: np.ndarray) -> None:
        """Keep the clock whose iterations cost less: a neuron's own (:func:`own_clocks`,
        an O(fired pairs) pass) while the visits read a large share of the fired pairs,
        else the global ``P`` with its heap.

        On coherent data nearly every neuron fires on many points whose errors differ,
        and the own clocks make far fewer neurons due than the global clock pops; where
        few neurons are due (as after the first iterations of most runs), the pass would
        cost more than the visits.  The visits' share of the
        fired pairs, ``Σ |prefix|`` over ``popped`` against the fired pairs, decides
        (:data:`~corrtree._config.OWN_CLOCK_ENTER`, :data:`~corrtree._config.OWN_CLOCK_LEAVE`).
        Leaving pushes every neuron with its key (a global-clock key stays valid: ``P``
        advances in both); entering makes every neuron due once (its own clock starts
        at infinity).  Neither changes what is found, only which neurons are visited.
        """
        if not self._coherent:
            return
        work = int(self.store.seg[popped, SUPP].sum())
        if self._own and work < _config.OWN_CLOCK_LEAVE * self.fired:
            self._fill_heap()
            self._own = False
        elif not self._own and work >= _config.OWN_CLOCK_ENTER * self.fired:
            self.clock.fill(np.inf)
            self.heap_size = 0
            self._own = True

    def _count(self) -> None:
        st = self.store
        self.fired = st.fired_pairs()
        self.moved = st.moved_neurons()
        self.entries = st.entries()

    @property
    def per_p(self) -> float:
        """The drift of a neuron grows at most ``per_p·σ_r`` per unit of ``P``."""
        return self.eta_s * math.sqrt(self.a.shape[1]) * self.cert * _config.ROUND_UP

    def _scalars(self, full: bool = False, ahead: float = 0.0) -> VisitScalars:
        """The scalars of :func:`~._visit.visit` and the clocks, now."""
        st = self.store
        return VisitScalars(
            eta_s=float(self.eta_s),
            b=float(self.b),
            R=float(st.R),
            cert=float(self.cert),
            scatter=self.scatter,
            gram_cost=self.gram_row,
            full=bool(full),
            ahead=float(ahead),
            P=float(self.P),
            per_p=float(self.per_p),
            x32_err=self._x32_err,
        )

    def _drifts(self) -> Drifts:
        return Drifts(anchor=self.anchor_drift, residual=self.res_drift)

    def _anchor_keys(self, rows: np.ndarray) -> None:
        """:func:`anchor_keys` of freshly anchored ``rows`` at the current ``P``."""
        st = self.store
        d = self.X.shape[1]
        args = (st.seg, st.nf, st.pool.arrays, self.G, st.xnorm, d, self._scalars())
        anchor_keys(rows, *args, self._drifts())

    def _defers_band(self) -> bool:
        # the first step's errors need the whole network's outputs: not a shard's share
        return self.width == self.m

    def _first_step_reanchors(self) -> float:
        """The share of a sample of firing neurons (:data:`~corrtree._config.BAND_DROP_SAMPLE`,
        evenly spaced) that full-batch gradient descent re-anchors at its first step: those
        whose step ``Δw_r = η_s·Σ_l <a_r, err_l> x_l`` (over the points ``r`` fires on, the
        errors of the outputs now) reaches their band with the steps like it still to
        come, ``(1 + ahead)·||Δw_r||·R >= β_r`` (:func:`lookahead` of the errors after
        the step, as :meth:`advance` judges them).  O(sample·d·|S_r| + (nK)²)."""
        st = self.store
        firing = np.flatnonzero(st.seg[:, SUPP] > 0)
        if not firing.shape[0]:
            return 0.0
        size = min(firing.shape[0], _config.BAND_DROP_SAMPLE)
        take = firing[np.linspace(0, firing.shape[0] - 1, size).astype(np.int64)]
        err = self.loss.errors(self.u, self.Y)
        after = self.u - self.lr * (self.H @ err.ravel()).reshape(self.u.shape)
        ahead = lookahead(_norm(self.loss.errors(after, self.Y)), _norm(err))
        ej = st.pool.arrays.j
        past = 0
        for r in take:
            s0 = st.seg[r, START]
            points = ej[s0 : s0 + st.seg[r, SUPP]]
            move = (self.eta_s * (err[points] @ self.a[r])) @ self.X[points]
            past += (1.0 + ahead) * float(np.linalg.norm(move)) * st.R >= st.nf[r, BETA]
        return past / size

    def _start(self) -> None:
        """Every neuron gets its first key, once the learning rate sets the drift rate
        (its clock, with own clocks: the heap stays empty).

        A deferred band (``BandState``'s ``defer_band``) is settled first: dropped where
        the first step moves at least :data:`~corrtree._config.BAND_DROP_SHARE` of the
        firing neurons past it (:meth:`_first_step_reanchors`; W4's data: 98%), whose
        re-anchoring then recomputes every value the band's float64 dot products would
        have made; else its values are made now."""
        st = self.store
        if st.pending is not None:
            t0 = time.perf_counter()
            drop = self._drop_band
            if drop is None:
                share = self._first_step_reanchors()
                self.info["first_step_reanchors"] = share
                drop = share >= _config.BAND_DROP_SHARE
            st.settle_band(drop)
            self.info["band_dropped"] = bool(drop)
            st.setup_s["settle"] = time.perf_counter() - t0
            self._count()
        every = np.arange(self.m)
        self._anchor_keys(every)
        self.clock[:] = st.nf[:, DRIFT]
        self.heap_keys = np.empty(self.m)
        self.heap_ids = np.empty(self.m, dtype=np.int64)
        self.heap_size = 0
        if not self._own:
            self._fill_heap()

    def _fill_heap(self) -> None:
        """Every neuron into the heap with its key: O(m log m)."""
        every = np.arange(self.m)
        self.heap_size = push_all(self.heap_keys, self.heap_ids, 0, every, self.store.nf)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, scalars = super().state()
        size = self.heap_size
        arrays.update(
            H=self.H,
            heap_keys=self.heap_keys[:size],
            heap_ids=self.heap_ids[:size],
            anchor_drift=self.anchor_drift,
            res_drift=self.res_drift,
            clock=self.clock,
        )
        return arrays, {**scalars, "P": self.P}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        keys, ids = arrays["heap_keys"], arrays["heap_ids"]
        if ids.shape[0] > self.m or np.unique(ids).shape[0] != ids.shape[0]:
            fail("heap_ids", "must hold distinct neurons")
        parent = (np.arange(1, ids.shape[0]) - 1) // 2
        if (keys[parent] > keys[1:]).any():
            fail("heap_keys", "not a heap")
        for name in ("res_drift", "clock"):
            if not (arrays[name] >= 0).all():
                fail(name, "must be >= 0")
        super()._restore(W0, arrays, scalars, sizes)
        self.H = arrays["H"]
        self._scratch = None
        self._by_rows = None
        self.P = scalars["P"]
        self.anchor_drift = arrays["anchor_drift"]
        self.res_drift = arrays["res_drift"]
        self.clock = arrays["clock"]
        self._set_parts()
        self._own = self._coherent and not ids.shape[0]  # the heap is empty under own clocks
        if not self._coherent and ids.shape[0] != self.m:
            fail("heap_ids", "must hold every neuron: this data takes the global clock")
        self._consistent = False
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
            if not self._consistent:  # the linear step reads every ever-fired value
                every = np.arange(self.m)
                again, flips = self._visit(every, full=True, ahead=0.0)
                self._apply(flips)
                if again.any():
                    self._apply(self._reanchor(every[again]))
                    self._anchor_keys(every[again])
                self._consistent = True
            # its evaluations do not add to the residual drifts: no screen from now on;
            # and every neuron is due at the next step of the recurrence
            self.res_drift.fill(np.inf)
            self.clock.fill(np.inf)
            return self._advance_linear(err, step)
        st = self.store
        stats = (self.fired, self.moved, self.flips, self.entries)
        with self.timer("forward"):
            before = _norm(self.loss.errors(self.u, self.Y))
            self.u -= self.lr * (self.H @ err.ravel()).reshape(self.u.shape)
            st.E += err
            self.P += _norm(err) * _config.ROUND_UP
            # a shard's u is its share of the outputs: no contraction to read from it
            ahead = (
                lookahead(_norm(self.loss.errors(self.u, self.Y)), before)
                if self.width == self.m
                else 0.0
            )
        with self.timer("query"):
            if self._own:
                own_clocks(
                    st.seg, st.nf, st.pool.arrays, self.a, err, st.xnorm, self._scalars(),
                    self.anchor_drift, self.clock, self._due, self.X,
                    self.X.shape[1] <= _config.OWN_CLOCK_MOVE_DIM,
                )  # fmt: skip
                popped = np.flatnonzero(self._due)
            else:
                popped, self.heap_size = pop_due(
                    self.heap_keys, self.heap_ids, self.heap_size, self.P
                )
            self._consistent = False
            again, flips = self._visit(popped, full=False, ahead=ahead)
        with self.timer("update"):
            self.flips = self._apply(flips)
            rows = popped[again]
            if rows.shape[0]:
                before = int(st.seg[rows, CNT].sum())
                self.flips += self._apply(self._reanchor(rows))
                self._anchor_keys(rows)
                self.entries += int(st.seg[rows, CNT].sum()) - before
            if self._own:
                self.clock[popped] = st.nf[popped, DRIFT]
            else:
                self.heap_size = push_all(
                    self.heap_keys, self.heap_ids, self.heap_size, popped, st.nf
                )
            self._choose_clock(popped)
        row = self._row(*stats, reanchored=rows.shape[0], evaluated_pairs=self.evaluated)
        self.evaluated = 0
        return row

    def _visit(self, rows: np.ndarray, full: bool, ahead: float) -> tuple[np.ndarray, Any]:
        """:func:`visit_rows` on ``rows`` (``full``: every ever-fired value; ``ahead``: see
        :func:`lookahead`); returns the mask of the rows to re-anchor and the flips as
        ``(r, j, value, on)`` arrays."""
        st = self.store
        args = (*self._store_args(), self.G, self.X, self._x32, st.xnorm, self._parts)
        args += (self._scalars(full, ahead), self._drifts())
        few = rows.shape[0] < _config.SERIAL_WORK  # waking the other threads costs more
        _, again, flips = self._in_groups(rows, True, visit_few if few else visit_rows, args)
        return again, flips

    def _rows_fit(self) -> bool:
        """Whether :func:`apply_flips_by_rows` may be used: its scratch matrix within
        :data:`~corrtree._config.FLIP_SCRATCH_BYTES` and ``G`` symmetric to the bit."""
        if self._by_rows is None:
            self._by_rows = self.H.nbytes <= _config.FLIP_SCRATCH_BYTES and bool(
                is_symmetric(self.G)
            )
        return self._by_rows

    def _apply(self, flips: tuple[np.ndarray, ...]) -> int:
        """Add flips (already applied to the pool) to ``u`` and ``H`` and to the counts;
        returns their number.

        Each flip rewrites ``|S_r|·K²`` entries of a row and as many of a column of
        ``H``.  Of three ways, the one of least modelled cost (in sequential additions):
        those writes in place (:func:`apply_flips`, a cache miss each at
        :data:`~corrtree._config.FLIP_WRITE_COST`); the row writes into a scratch
        matrix, then ``H`` tile by tile (:func:`apply_flips_by_rows`, while the scratch
        fits :data:`~corrtree._config.FLIP_SCRATCH_BYTES`); or ``H`` built anew from
        the fire sets (:func:`~._ntk.ntk_matrix`, ``Σ_r |S_r|²·K²`` additions, as in the
        first steps of coherent data).  The same matrix up to rounding.
        """
        fr, fj, fv, fon = flips
        if not fr.shape[0]:
            return 0
        st = self.store
        K = self.a.shape[1]
        size = self.H.shape[0]
        writes = float(st.seg[fr, NFIRE].sum()) * K * K
        costs = {
            "scattered": _config.FLIP_WRITE_COST * writes,
            "anew": min(new_h_cost(st.seg, K * K), self._gemm_adds) + size**2,
        }
        if fr.shape[0] >= _config.SERIAL_WORK and self._rows_fit():
            points = np.unique(fj)
            costs["rows"] = flips_by_rows_cost(writes, points.shape[0], size, K)
        way = min(costs, key=costs.__getitem__)
        if way == "anew":
            self.H = ntk_matrix(*st.firing_csr(), self.G, self.a, self.width)
            flip_outputs(fr, fj, fv, fon, self.u, self.a, self.b, self.scale)
            self.fired = st.fired_pairs()
            self.moved = st.moved_neurons()
            return int(fr.shape[0])
        args = (self.a, self.G, self.b, self.scale, float(self.width))
        pool = st.pool.arrays
        if way == "rows":
            if self._scratch is None:  # calloc's pages: touched only where rows flip
                self._scratch = np.zeros(self.H.shape)
            d_fired, d_moved = apply_flips_by_rows(
                fr, fj, fv, fon, st.seg, pool, self.u, self.H, self._scratch, *args, points
            )
        else:
            d_fired, d_moved = apply_flips(fr, fj, fv, fon, st.seg, pool, self.u, self.H, *args)
        self.fired += d_fired
        self.moved += d_moved
        return int(fr.shape[0])
