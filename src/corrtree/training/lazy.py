"""The lazy trainer: exact gradient descent with drift-certified fire sets.

Beyond the paper (``docs/design.md``, "The lazy trainer").  Weights stay
implicit (``W(t) = W(0) - C X``, materialized at the end), products of moved
neurons are updated through the Gram identity (cost per product: the number of
pairs of the neuron that ever fired, not ``d``), and a pair's product is only
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
  product); past that the neuron is re-anchored.

Per iteration: O(Σ_r |ever_r|² / 2 + evaluations of expiring pairs), where
``ever_r`` are the pairs of ``r`` that ever fired (about ``k̃_r``): no d.

Up to :data:`~corrtree._config.LAZY_MOVE_MAX_DIM` features (explicit models), where
the set-up's fire sets price it cheaper (:func:`moves_pay`), each neuron's move since
its anchor is kept instead and stepped exactly (:func:`~._moves.evaluate_by_move`):
O(d·(firing pairs + expiring pairs)) a step, with the ever-fired pairs that stopped
firing evaluated by their keys like any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from ._clocks import refresh_keys
from ._outputs import firing_sums, sum_parts
from ._pool import NFIRE
from ._state import Field, Scalar, Schema, fail
from .band import BAND_FIELDS, BAND_SCALARS, BandTrainer
from .costs import coherence
from .optim import LinearStep

__all__ = ["LazyTrainer", "keeps_moves", "moves_pay"]


def keeps_moves(moves: bool | None, d: int, implicit: bool) -> bool | None:
    """Whether the lazy trainer keeps each neuron's move since its anchor, ``(m, d)``
    float64 (``docs/design.md``, "The lazy trainer"): ``moves`` if given (not for an
    implicit model, which stores no ``(m, d)`` array); by default never on an implicit
    model nor beyond :data:`~corrtree._config.LAZY_MOVE_MAX_DIM` features, and ``None``
    otherwise: the set-up's fire sets decide (:func:`moves_pay`)."""
    if moves is None:
        return None if not implicit and d <= _config.LAZY_MOVE_MAX_DIM else False
    if not isinstance(moves, bool | np.bool_):
        raise ValueError(f"moves must be True, False or None, got {moves!r}")
    if moves and implicit:
        raise ValueError("moves=True keeps an (m, d) array: not for an implicit model")
    return bool(moves)


def moves_pay(fire_counts: np.ndarray, d: int, scatter: float, coh: float) -> bool:
    """Whether a step on the moves' route costs at most what the coefficient route's
    does, priced at the set-up's fire sets (every tracked prefix is then a fire set).

    A neuron firing on ``f`` points costs ``2·d·f`` on the moves' route (its step, then
    its values) and ``min(2·d·f, scatter·f·(f + 1)/2)`` on the coefficient route (the
    move rebuilt from the data, or the values from ``G``: :func:`~._pairs.by_data`);
    the moves are kept while theirs is at most
    :data:`~corrtree._config.LAZY_MOVE_GAIN` times the other (the coefficient route's
    prefixes grow past the fire sets, and it reads and writes a coefficient an entry).
    So they are left where short fire sets make ``G`` cheaper than ``d``: few firing
    points in many features.  Beyond :data:`~corrtree._config.LAZY_MOVE_FREE_DIM`
    features the data must also be coherent (``coh``, its :func:`~.costs.coherence`, at
    least :data:`~corrtree._config.LAZY_MOVE_COHERENCE` times the ``sqrt(2/(π d))`` of
    random directions): only there do the prefixes outgrow the fire sets, which pays
    for the row of ``8·d`` bytes each neuron's step reads and writes.  O(m)."""
    if d > _config.LAZY_MOVE_FREE_DIM:
        if coh < _config.LAZY_MOVE_COHERENCE * np.sqrt(2.0 / (np.pi * d)):
            return False
    f = fire_counts[fire_counts > 0].astype(np.float64)
    by_move = 2.0 * d * f.sum()
    by_coef = np.minimum(2.0 * d * f, scatter * f * (f + 1.0) / 2.0).sum()
    return bool(by_move <= _config.LAZY_MOVE_GAIN * by_coef)


class LazyTrainer(BandTrainer):
    """Exact GD whose per-iteration cost does not depend on ``d`` (see module docs;
    options: :class:`~.band.BandTrainer`)."""

    name = "lazy"
    SCHEMA = Schema(
        4,
        (*BAND_FIELDS, Field("move", ("f8",), ("m", "d"), optional=True)),
        (*BAND_SCALARS, Scalar("moves", int, 0, 1)),  # whether the state keeps ``move``
    )

    def _prepare(self, W0: np.ndarray, moves: bool | None = None, **options: Any) -> None:
        """``moves``: keep each neuron's move since its anchor (:func:`keeps_moves`;
        default: up to :data:`~corrtree._config.LAZY_MOVE_MAX_DIM` features, explicit
        models only, where :func:`moves_pay` prices them cheaper); ``options``:
        :class:`~.band.BandTrainer`'s."""
        d = self.X.shape[1]
        keep = keeps_moves(moves, d, bool(getattr(W0, "implicit", False)))
        super()._prepare(W0, **options)
        st = self.store
        if keep is None:
            keep = moves_pay(st.seg[:, NFIRE], d, self.scatter, coherence(self.G))
        if keep:
            st.move = np.zeros((self.m, self.X.shape[1]))
        keys = (st.seg, st.nf, st.pool.arrays, st.xnorm, st.b, st.move.shape[0] > 0)
        refresh_keys(np.arange(self.m), *keys)
        self.moved = st.firing_neurons()
        self.info["moves"] = st.move.shape[0] > 0

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, scalars = super().state()
        moves = self.store.move.shape[0] > 0
        if moves:  # a run resumes on the route it was on
            arrays["move"] = self.store.move
        return arrays, {**scalars, "moves": int(moves)}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        if ("move" in arrays) != bool(scalars["moves"]):
            fail("move", "a state on the moves' route holds them, any other does not")
        super()._restore(W0, arrays, scalars, sizes)
        if "move" in arrays:
            self.store.move = arrays["move"]
        self.moved = self.store.firing_neurons()  # as at the end of every step
        self.info["moves"] = self.store.move.shape[0] > 0

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        if step is not None:
            return self._advance_linear(err, step)
        st = self.store
        n, K = self.X.shape[0], self.a.shape[1]
        stats = (st.fired_pairs(), len(self.moved), self.flips, st.entries())
        # the outputs of the rows that keep their anchor are summed as they are evaluated
        parts = st.buffer("forward_parts", (_config.FORWARD_CHUNKS, n, K))
        with self.timer("query"):
            st.E += err
            nflips, again, _ = self._evaluate(self.moved, err, record=False, parts=parts)
            self.flips = int(nflips.sum())
        with self.timer("update"):
            rows = self.moved[again]
            if rows.shape[0]:
                self.flips += self._reanchor(rows)[0].shape[0]
                moves = st.move.shape[0] > 0
                if moves:
                    st.move[rows] = 0.0
                refresh_keys(rows, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b, moves)
        with self.timer("forward"):
            # a neuron that fires after the step fired before it (only moved rows change)
            more = parts[:0]
            if rows.shape[0]:
                more = firing_sums(rows, st.seg, st.pool.arrays, self.a, self.b, n)
            self.u = sum_parts(parts, more, self.scale)
            self.moved = st.firing_neurons()
        row = self._row(*stats, reanchored=rows.shape[0], evaluated_pairs=self.evaluated)
        self.evaluated = 0
        return row
