"""What the lazy and kernel trainers share: anchored products, tracked pairs,
implicit weights, outputs from the exact firing values, and one evaluate /
re-anchor step (``docs/design.md``, "Band trainers").
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
from numba import prange

from .. import _config
from .._implicit import ImplicitWeights
from .._jit import njit
from .._validation import available_memory
from ._anchors import BandState
from ._base import Trainer
from ._calibrate import scatter_cost
from ._clocks import refresh_keys
from ._moves import evaluate_by_move, leave_moves, prefetch_moved
from ._outputs import add_firing, coefficients, forward
from ._pairs import (
    by_data,
    dot_row,
    evaluate_neuron,
    needs_reanchor,
    prefetch_block,
    prefetch_segment,
)
from ._pool import (
    BETA,
    CNT,
    DRIFT,
    LEAF_ERR,
    MINKEY,
    NFIRE,
    POOL_DTYPES,
    SIGMA,
    SIGMA_UNKNOWN,
    START,
    SUPP,
    PoolArrays,
)
from ._reanchor import reanchor
from ._records import EvalScalars, FlipRecord, RowResults
from ._state import Field, Scalar, fail
from .optim import LinearStep

__all__ = ["BandTrainer", "choose_storage", "evaluate_rows", "gather_flips", "row_groups"]

_EVALUATE_CHUNKS = _config.EVALUATE_CHUNKS


def float_kind(name: str, value: Any) -> str:
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
    would take more than :data:`~corrtree._config.FLOAT64_ANCHOR_MEMORY_SHARE` of
    free memory; float64 otherwise."""
    if (
        np.dtype(gemm_dtype) == np.float32
        or 8.0 * n * m > _config.FLOAT64_ANCHOR_MEMORY_SHARE * available_memory()
    ):
        return "float32"
    return "float64"


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def evaluate_rows(rows, seg, nf, pool, a, E, err, G, X, xnorm, sc, rec, out, parts, move):
    """Bring neurons ``rows`` to the current time: the step both band trainers share.

    For each ``r = rows[k]``, :func:`~._pairs.evaluate_neuron` evaluates and
    flips the pairs that may have changed side (``err``: the lazy trainer's
    step bound; empty: the exact step), recording the flips in ``rec``
    (:data:`~._records.FlipRecord`) from ``rec.start[k]`` on when ``rec.j`` is
    non-empty; ``out.nflips[k]`` is their number and ``out.nevals[k]`` the number of
    pairs evaluated.  ``out.again[k]`` says the neuron must be re-anchored
    (:func:`~._pairs.needs_reanchor`).  ``sc``: :data:`~._records.EvalScalars`.

    With ``parts`` of shape ``(P, n, K)`` (``P > 0``) the rows run in ``min(len(rows),
    P)`` fixed chunks and ``parts[c]`` becomes chunk ``c``'s share of the outputs,
    ``Σ_r a_r (U_rj - b)`` over the firing pairs of its rows that need no re-anchoring,
    added while their values are in cache (the other slots are zeroed): the lazy
    trainer's forward pass without a second walk over the pool (``docs/design.md``,
    "The lazy trainer").

    With ``move`` of shape ``(m, d)`` (the lazy trainer's moves since the anchors; empty
    ``(0, d)`` otherwise) and ``err`` non-empty, :func:`~._moves.evaluate_by_move`
    takes the place of :func:`~._pairs.evaluate_neuron`.
    """
    ej, val, fire = pool.j, pool.val, pool.fire
    moves = move.shape[0] > 0 and err.shape[0] > 0
    record = rec.j.shape[0] > 0
    # the fields are read before the parallel loop: numba's parfors lose writes to an
    # array read from a namedtuple inside the loop (numba 0.68)
    start, nflips, nevals, again = rec.start, out.nflips, out.nevals, out.again
    scatter, R, b = sc.scatter, sc.R, sc.b
    d = X.shape[1]
    nrows = rows.shape[0]
    summed = parts.shape[0] > 0
    chunks = min(nrows, parts.shape[0] if summed else _EVALUATE_CHUNKS)
    for c in range(chunks, parts.shape[0]):
        parts[c] = 0.0
    for c in prange(chunks):
        dw = np.empty(d)  # the move of a neuron, when its values come from the data
        scratch = np.empty((2, G.shape[0]))  # its coefficient changes (|prefix| <= n)
        at = np.empty(G.shape[0] if moves else 0, dtype=np.int64)  # its firing entries
        part = parts[c] if summed else parts[0:0, 0]
        if summed:
            parts[c] = 0.0
        for k in range(c * nrows // chunks, (c + 1) * nrows // chunks):
            r = rows[k]
            if k + 1 < nrows:  # the next neuron's entries, and its reads of G
                if moves:
                    prefetch_moved(rows[k + 1], seg, pool, move)
                elif by_data(d, seg[rows[k + 1], SUPP], scatter):
                    prefetch_segment(rows[k + 1], seg, pool, False)
                else:
                    prefetch_block(rows[k + 1], seg, ej, G)
            first = start[k] if record else 0
            if moves:  # adds the outputs on the way
                pos, since_anchor, nevals[k] = evaluate_by_move(
                    r,
                    seg,
                    nf,
                    pool,
                    a,
                    E,
                    err,
                    X,
                    xnorm,
                    sc,
                    move[r],
                    dw,
                    at,
                    scratch[0],
                    part,
                    rec,
                    first,
                )
            else:
                pos, since_anchor, nevals[k] = evaluate_neuron(
                    r, seg, nf, pool, scratch, a, E, err, G, X, xnorm, sc, dw, rec, first
                )
            nflips[k] = pos - first
            again[k] = needs_reanchor(r, nf, since_anchor, R)
            if summed and not again[k] and not moves:
                add_firing(part, r, seg, ej, val, fire, a, b)


def row_groups(counts: np.ndarray, budget: int) -> list[int]:
    """Bounds ``[0, …, len(counts)]`` of consecutive groups of rows whose ``counts`` sum to
    at most ``budget`` (a row above it alone); one empty group if there are no rows."""
    if counts.shape[0] == 0:
        return [0, 0]
    ends = np.cumsum(counts)
    bounds = [0]
    while bounds[-1] < counts.shape[0]:
        base = ends[bounds[-1] - 1] if bounds[-1] else 0
        nxt = int(np.searchsorted(ends, base + budget, side="right"))
        bounds.append(max(nxt, bounds[-1] + 1))
    return bounds


@njit(cache=True)
def gather_flips(rows, fbuf, nflips, f_j, f_v, f_on):
    """The flips recorded by :func:`evaluate_rows`, as neuron-grouped ``(r, j, value, on)``."""
    total = nflips.sum()
    fr = np.empty(total, dtype=np.int64)
    fj = np.empty(total, dtype=np.int64)
    fv = np.empty(total)
    fo = np.empty(total, dtype=np.bool_)
    i = 0
    for k in range(rows.shape[0]):
        for p in range(fbuf[k], fbuf[k] + nflips[k]):
            fr[i] = rows[k]
            fj[i] = f_j[p]
            fv[i] = f_v[p]
            fo[i] = f_on[p]
            i += 1
    return fr, fj, fv, fo


@njit(cache=True, parallel=True)
def linear_coefficients(seg, pool, a, err, scale, step, rho, moved):
    """One step of a linear optimizer on the implicit weights (``optim.py``).

    The pairs that ever fired of every neuron hold its coefficients, divided
    by ``α(t)``: ``κ = C/α`` and ``vel = ν/α`` (``v_r = β·w_r(0) + Σ ν x``).
    With the batch gradient ``γ = scale·(a_r·err_l)`` of a firing pair and
    ``ρ = α(t)/α(t+1)``::

        vel' = (μ·vel - λ·κ)·ρ + γ/α(t+1)
        κ'   = κ·ρ + η·vel'                               (κ·ρ + η·(γ/α' - λκρ + μ·vel'): Nesterov)

    ``moved[r]``: whether a coefficient of ``r`` changed, or ``r`` fires while
    the threshold ``b/α`` moves.  O(Σ_r |prefix_r|·K).
    """
    ej, kappa, vel, fire = pool.j, pool.kappa, pool.vel, pool.fire
    eta, mu, lam, nesterov, _, alpha_next = step
    inv = 1.0 / alpha_next
    for r in prange(seg.shape[0]):
        s0 = seg[r, START]
        changed = False
        for q in range(s0, s0 + seg[r, SUPP]):
            c = kappa[q]
            gam = scale * dot_row(a, r, err, ej[q]) * inv if fire[q] else 0.0
            v = (mu * vel[q] - lam * c) * rho + gam
            if nesterov:
                cn = c * rho + eta * ((gam - lam * c * rho) + mu * v)
            else:
                cn = c * rho + eta * v
            vel[q] = v
            kappa[q] = cn
            changed = changed or cn != c
        # a rising threshold b/α may drop a firing pair of a neuron that did not move
        moved[r] = changed or (rho != 1.0 and seg[r, NFIRE] > 0)


BAND_FIELDS = (
    Field("V", ("f8",), ("m", "n"), optional=True),  # float64 anchored rows only
    Field("seg", ("i8",), ("m", 5)),
    Field("nf", ("f8",), ("m", 6), finite=False),
    *(
        Field(
            f"pool_{name}",
            (np.dtype(dt).str[1:],),
            ("cap",),
            index="n" if name == "j" else None,
            finite=name != "key",
            optional=name == "vel",
        )
        for name, dt in zip(PoolArrays._fields, POOL_DTYPES, strict=True)
    ),
    Field("E", ("f8",), ("n", "K")),
    Field("u", ("f8",), ("n", "K")),
)
BAND_SCALARS = (
    Scalar("pool_used", int, 0, "cap"),
    Scalar("flips", int, 0),
    Scalar("cert", float, 0.0),
    Scalar("band", float, 0.0),
    Scalar("anchor_dtype", str),
    Scalar("alpha", float, 0.0),
)


def check_band(arrays: dict[str, np.ndarray], scalars: dict[str, Any], n: int) -> None:
    """Invariants of a band state beyond dtypes, shapes and ranges: positive band and
    certificate scale, segments that fit their capacity and the pool without
    overlapping, distinct points per neuron, and fire flags that match the counts."""
    for name in ("cert", "band", "alpha"):
        if not scalars[name] > 0:
            fail(name, f"must be > 0, got {scalars[name]!r}")
    if scalars["anchor_dtype"] not in ("float32", "float64"):
        fail("anchor_dtype", f"must be 'float32' or 'float64', got {scalars['anchor_dtype']!r}")
    if ("V" in arrays) != (scalars["anchor_dtype"] == "float64"):
        fail("V", "float64 anchored rows are stored, float32 ones are not")
    seg = arrays["seg"]
    start, cnt, cap, supp, nfire = seg.T
    if (
        (start < 0).any()
        or (nfire < 0).any()
        or (supp < nfire).any()
        or (cnt < supp).any()
        or (cap < cnt).any()
        or (cnt > n).any()
    ):
        fail("seg", "needs 0 <= NFIRE <= SUPP <= CNT <= min(CAP, n) and START >= 0")
    if (start + cap > scalars["pool_used"]).any():
        fail("seg", "a segment ends beyond the used part of the pool")
    used = cap > 0
    order = np.argsort(start[used], kind="stable")
    s_sorted, c_sorted = start[used][order], cap[used][order]
    if (s_sorted[1:] < s_sorted[:-1] + c_sorted[:-1]).any():
        fail("seg", "segments overlap")
    nf = arrays["nf"]
    finite = nf[:, [DRIFT, BETA, LEAF_ERR]]
    if not (
        np.isfinite(finite).all()
        and (finite >= 0).all()
        and (nf[:, BETA] > 0).all()
        and ((nf[:, SIGMA] >= 0) | (nf[:, SIGMA] == SIGMA_UNKNOWN)).all()
    ):
        fail(
            "nf",
            "drifts and errors must be finite and >= 0, σ >= 0 or unknown (-1), "
            "band half-widths > 0",
        )
    owner = np.repeat(np.arange(seg.shape[0]), cnt)
    local = np.arange(owner.shape[0]) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    pos = start[owner] + local
    pairs = owner * n + arrays["pool_j"][pos]
    if np.unique(pairs).shape[0] != pairs.shape[0]:
        fail("pool_j", "a neuron tracks a point twice")
    fire = arrays["pool_fire"][pos]
    if fire[local >= supp[owner]].any():
        fail("pool_fire", "a pair outside the ever-fired prefix fires")
    if not np.array_equal(np.bincount(owner[fire], minlength=seg.shape[0]), nfire):
        fail("pool_fire", "fire flags disagree with the counts in seg")
    later = local >= supp[owner]  # entries outside the prefix: their smallest key
    least = np.full(seg.shape[0], np.inf)
    np.minimum.at(least, owner[later], arrays["pool_key"][pos[later]])
    if (nf[:, MINKEY] > least).any():
        fail("nf", "a neuron's smallest pair key is larger than one of its keys")


class BandTrainer(Trainer):
    """Base of the lazy and kernel trainers: the ones that read ``W(0)`` only by blocks of
    rows, so they also train implicit models (:mod:`corrtree._implicit`).

    Options
    -------
    band : float, optional
        Half-width ``β`` of the tracked band around ``b`` (default
        :data:`~corrtree._config.BAND`), the re-anchoring budget: a larger band
        tracks more pairs and re-anchors less often.  Each neuron's half-width is
        ``β`` scaled by the square root of its fire count over the mean, within
        ``[β/2, 2β]`` (:func:`~._anchors.band_widths`).
    anchor_dtype : {"float64", "float32"}, optional
        Storage of the anchored products (default :func:`choose_storage`).
        Leaves carry their rounding error into every query, so both give the
        same trajectory.
    gemm_dtype : {"float32", "float64"}
        Precision of the preprocessing GEMM (default float32, twice as fast);
        every product within the float32 error bound of the band is
        recomputed in float64, so the trajectory is the same.
    _certificate_scale : float
        Multiplies the drift bounds.  Only for testing that the tests catch a
        certificate that is too tight: any value below 1 can miss crossings.
    """

    implicit_ok = True

    def _prepare(
        self,
        W0: np.ndarray | ImplicitWeights,
        band: float | None = None,
        anchor_dtype: str | None = None,
        gemm_dtype: str = "float32",
        _certificate_scale: float = 1.0,
    ) -> None:
        n = self.X.shape[0]
        band = _config.BAND if band is None else float(band)
        if not band > 0:
            raise ValueError(f"band must be > 0, got {band}")
        gemm_dtype = float_kind("gemm_dtype", gemm_dtype)
        anchor_dtype = (
            choose_storage(n, self.m, gemm_dtype)
            if anchor_dtype is None
            else float_kind("anchor_dtype", anchor_dtype)
        )
        self.store = st = BandState(
            W0, self.X, self.G, self.a, self.b, band, anchor_dtype, gemm_dtype, self._defers_band()
        )
        self.alpha = 1.0  # factor of W(0) in W(t) (weight decay, optim.py)
        self.u = forward(st.firing_neurons(), st.seg, st.pool.arrays, self.a, self.b, self.scale, n)
        self.flips = 0
        self.cert = float(_certificate_scale)
        self.evaluated = 0  # pairs computed exactly since the last History row
        self._set_scatter()
        self.info.update(
            band=band,
            anchor_dtype=str(np.dtype(anchor_dtype)),
            gemm_dtype=gemm_dtype,
            setup_s=st.setup_s,
            implicit=st.w0.implicit,
        )

    def _defers_band(self) -> bool:
        """Whether the set-up leaves the band's float64 values to :meth:`_start`
        (``BandState``'s ``defer_band``): only where the first step can be judged
        there (:class:`~.kernel.KernelTrainer`)."""
        return False

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self.store.firing_csr()

    def outputs(self) -> np.ndarray:
        return self.u

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        start, stop, _ = slice(start, stop).indices(self.m)
        W = self.store.w0.rows(start, stop, np.empty((stop - start, self.X.shape[1])))
        self.write_weights(start, W)
        return W

    def write_weights(self, start: int, out: np.ndarray) -> None:
        """``W(t) = α·(W(0) - C X)`` over ``W(0)`` in ``out``: no copy.  O(d·Σ_r |prefix_r|)."""
        self.store.update_weights(out, start, self.eta_s)
        if self.alpha != 1.0:
            out *= self.alpha

    def implicit_update(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """``W(t) = α·(W(0) - C X)`` as ``(indptr, cols, coef, α)``: ``C`` in CSR over the
        pairs that ever fired, in the order :meth:`write_weights` sums them (an implicit
        model keeps these instead of ``W``).  O(m + Σ_r |prefix_r|)."""
        st = self.store
        indptr = np.zeros(self.m + 1, dtype=np.int64)
        np.cumsum(st.seg[:, SUPP], out=indptr[1:])
        cols = np.empty(int(indptr[-1]), dtype=np.int32)
        coef = np.empty(int(indptr[-1]))
        coefficients(st.seg, st.pool.arrays, self.a, st.E, self.eta_s, indptr, cols, coef)
        return indptr, cols, coef, float(self.alpha)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        st = self.store
        arrays = {
            **({} if st.V is None else {"V": st.V}),
            "seg": st.seg,
            "nf": st.nf,
            "E": st.E,
            "u": self.u,
            # the used places only: the rest of the capacity is reserved, never written
            **{
                f"pool_{k}": v[: st.pool.used]
                for k, v in st.pool.arrays._asdict().items()
                if v.shape[0]
            },
        }
        return arrays, {
            "anchor_dtype": st.anchor_dtype.name,
            "pool_used": st.pool.used,
            "flips": self.flips,
            "cert": self.cert,
            "band": st.band,
            "alpha": self.alpha,
        }

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        check_band(arrays, scalars, sizes["n"])
        pool = PoolArrays(
            *(arrays.get(f"pool_{k}", np.zeros(0)) for k in PoolArrays._fields)  # vel: optional
        )
        self.store = BandState.from_arrays(
            W0,
            self.X,
            self.G,
            self.a,
            self.b,
            scalars["band"],
            scalars["anchor_dtype"],
            arrays.get("V"),
            arrays["seg"],
            arrays["nf"],
            pool,
            scalars["pool_used"],
            arrays["E"],
        )
        self.u = arrays["u"]
        self.alpha = scalars["alpha"]
        self.b = self.store.b = self.b0 / self.alpha
        self.flips = scalars["flips"]
        self.cert = scalars["cert"]
        self.evaluated = 0
        self._set_scatter()

    def _set_scatter(self) -> None:
        """The exchange rate of the visits' two routes on this machine and data
        (:func:`~._calibrate.scatter_cost`: measured once per process and data shape,
        which :func:`corrtree.train` does before its clock starts)."""
        rate = scatter_cost(self.G, self.X)
        self.scatter, self.gram_row = rate.scatter, rate.row
        self.info["scatter_cost"] = self.scatter
        self.info["gram_row_cost"] = self.gram_row

    def _evaluate(
        self, rows: np.ndarray, err: np.ndarray, record: bool, parts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, tuple | None]:
        """:func:`evaluate_rows` on ``rows``: returns the flips per neuron, the re-anchor
        mask and, if ``record``, the flips as ``(r, j, value, on)`` arrays; with
        ``parts`` (``(P, n, K)``, not with ``record``) the rows' shares of the outputs
        are summed into it on the way."""
        st = self.store
        sc = EvalScalars(
            eta_s=float(self.eta_s),
            b=float(self.b),
            R=float(st.R),
            cert=float(self.cert),
            scatter=self.scatter,
        )
        args = (*self._store_args(), err, self.G, self.X, st.xnorm, sc)
        if parts is None:
            parts = np.empty((0, 0, 0))
        elif record:
            raise ValueError("outputs are summed only on a step that records no flips")
        return self._in_groups(rows, record, evaluate_rows, args, (parts, st.move))

    def _store_args(self) -> tuple:
        """The arguments every per-neuron kernel takes first after its rows: ``seg``,
        ``nf``, the pool's arrays, ``a`` and ``E``."""
        st = self.store
        return st.seg, st.nf, st.pool.arrays, self.a, st.E

    def _in_groups(
        self,
        rows: np.ndarray,
        record: bool,
        kernel: Callable[..., None],
        args: tuple,
        tail: tuple = (),
    ) -> tuple[np.ndarray, np.ndarray, tuple | None]:
        """``kernel(part, *args, rec, out, *tail)`` on consecutive groups of ``rows``, a
        kernel that records the flips of ``part[k]`` in ``rec``
        (:data:`~._records.FlipRecord`, from ``rec.start[k]`` on, when ``record``) and
        fills ``out`` (:data:`~._records.RowResults`); returns
        the flips per neuron, the re-anchor mask and, if ``record``, the flips as
        ``(r, j, value, on)`` arrays."""
        st = self.store
        nflips = np.zeros(rows.shape[0], dtype=np.int64)
        nevals = np.zeros(rows.shape[0], dtype=np.int64)
        again = np.zeros(rows.shape[0], dtype=np.bool_)
        # flip records have room for every entry of the rows to flip: rows in groups of at
        # most FLIP_RECORD_ENTRIES entries keep the record buffers small
        counts = st.seg[rows, CNT]
        bounds = row_groups(counts, _config.FLIP_RECORD_ENTRIES) if record else [0, rows.shape[0]]
        found = []
        for g0, g1 in pairwise(bounds):
            part = rows[g0:g1]
            fbuf = np.zeros(part.shape[0] + 1, dtype=np.int64)
            if record:
                np.cumsum(counts[g0:g1], out=fbuf[1:])
            f_j = st.buffer("flip_j", (fbuf[-1],), np.int32)  # as pool.j
            f_v = st.buffer("flip_value", (fbuf[-1],))
            f_on = st.buffer("flip_on", (fbuf[-1],), np.bool_)
            rec = FlipRecord(start=fbuf, j=f_j, value=f_v, on=f_on)
            out = RowResults(nflips=nflips[g0:g1], nevals=nevals[g0:g1], again=again[g0:g1])
            kernel(part, *args, rec, out, *tail)
            if record:
                found.append(gather_flips(part, fbuf, nflips[g0:g1], f_j, f_v, f_on))
        flips = tuple(np.concatenate(a) for a in zip(*found, strict=True)) if record else None
        self.evaluated += int(nevals.sum())
        return nflips, again, flips

    def _advance_linear(self, err: np.ndarray, step: LinearStep) -> dict[str, Any]:
        """A step of a linear optimizer (momentum, weight decay; ``optim.py``).

        The coefficients of every pair that ever fired change
        (:func:`linear_coefficients`); every neuron whose coefficients changed is
        evaluated with its exact step, re-anchored if its band may be exceeded,
        and the outputs are summed from the exact firing values.  The weights are
        kept divided by ``α(t)`` and compared with ``b/α(t)``, which never falls
        (``Optimizer.check_scaling``): a pair below the threshold at its last
        evaluation stays at least as far from it.  O(Σ_r |prefix_r|² + evaluations).
        """
        st = self.store
        stats = (st.fired_pairs(), st.moved_neurons(), self.flips, st.entries())
        with self.timer("update"):
            if st.move.shape[0]:  # the coefficients move every pair: they carry the step
                args = (st.seg, st.nf, st.pool.arrays, self.a, st.E, self.X, st.xnorm)
                leave_moves(*args, float(self.eta_s), st.move)
                st.move = np.zeros((0, self.X.shape[1]))
                self.info["moves"] = False
            st.pool.use_velocities()
            changed = np.zeros(self.m, dtype=np.bool_)
            rho = step.alpha / step.alpha_next
            linear_coefficients(st.seg, st.pool.arrays, self.a, err, self.scale, step, rho, changed)
            rows = np.flatnonzero(changed).astype(np.int64)
            self.alpha = step.alpha_next
            self.b = st.b = self.b0 / self.alpha
        with self.timer("query"):
            nflips, again, _ = self._evaluate(rows, np.empty((0, self.a.shape[1])), False)
            self.flips = int(nflips.sum())
        with self.timer("update"):
            anchored = rows[again]
            if anchored.shape[0]:
                self.flips += self._reanchor(anchored)[0].shape[0]
                refresh_keys(anchored, st.seg, st.nf, st.pool.arrays, st.xnorm, st.b)
        with self.timer("forward"):
            n = self.X.shape[0]
            u = forward(st.firing_neurons(), st.seg, st.pool.arrays, self.a, self.b, self.scale, n)
            self.u = u * self.alpha
        row = self._row(*stats, reanchored=anchored.shape[0], evaluated_pairs=self.evaluated)
        self.evaluated = 0
        return row

    def _reanchor(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """Re-anchor ``rows``; returns the flips it found."""
        self.evaluated += rows.shape[0] * self.X.shape[0]  # a whole exact row each
        return reanchor(self.store, rows, self.eta_s)
