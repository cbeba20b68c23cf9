"""The kernel trainer's visit: a neuron whose key has passed brought to the current
time (``docs/design.md``, "The kernel trainer")."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import prange

from .. import _config
from .._jit import njit
from ._clocks import entry_key, heap_key, sigma_of
from ._pairs import (
    by_data,
    coef_eager,
    due_dots,
    eval_ever,
    eval_ever_data,
    flip,
    form_move,
    form_moves,
    gram_block,
    move_norm,
    needs_reanchor,
    prefetch_segment,
    safe_norm,
)
from ._pool import BETA, CNT, DRIFT, KEY, MINKEY, SIGMA, SIGMA_UNKNOWN, START, SUPP

__all__ = ["VisitScratch", "rough_copy", "visit", "visit_few", "visit_rows"]

#: A thread's scratch space for :func:`visit`: the coefficient changes of a prefix
#: (``coef``, 3 rows of ``n``), the due entries and their points (``due``), two moves in
#: data space (``dw``, ``dws``) and two in the principal directions (``zw``, ``zc``).
VisitScratch = namedtuple("VisitScratch", ["coef", "due", "dw", "dws", "zw", "zc"])

_ROUND_UP = _config.ROUND_UP
_U64 = _config.U64
_EVALUATE_CHUNKS = _config.EVALUATE_CHUNKS


def rough_copy(X: np.ndarray) -> tuple[np.ndarray, float]:
    """X in float32, and a bound on ``max_l ||x32_l - x_l||`` (the conversion's
    error, measured, with its own rounding), for :func:`visit`'s moves that only
    their norms are read from: half the bytes of X to stream.  Data that float32
    cannot hold finitely gives an empty copy and an infinite bound (never used).
    O(n·d)."""
    with np.errstate(over="ignore"):
        X32 = np.ascontiguousarray(X, dtype=np.float32)
    if not np.isfinite(X32).all():
        return np.zeros((0, X.shape[1]), dtype=np.float32), math.inf
    gap = np.sqrt(np.square(X32.astype(np.float64) - X).sum(axis=1)).max(initial=0.0)
    return X32, float(gap) * (1.0 + 4.0 * (X.shape[1] + 2) * _U64) + 1e-300


@njit(cache=True, inline="always")
def _rough(norm, l1, x32_err):
    """A bound on the norm of ``Σ_l c_l x_l`` from ``norm``, that of the same sum over the
    float32 copy (:func:`rough_copy`), ``l1 = Σ|c_l|``: ``norm + 2·l1·x32_err``, rounded
    up (the copy's rows are within ``x32_err`` of X's, its norms within ``1 + u``)."""
    return (norm + 2.0 * l1 * x32_err) * (1.0 + 4.0 * _U64)


@njit(cache=True, inline="always")
def _screened_gap(uref, fire, zc, z, xn, b, residual, slack):
    """How far beyond ``b``, on the side ``fire`` says, a value ``uref - <zc, z>`` within
    ``residual`` plus ``slack = (δ·||dc||_1, unit rounding, ||dc||_1·max ||x_l||)`` of
    its exact Gram sum must lie (:func:`visit`'s screen); 0 if it may not be there, or
    if ``||x_j|| = xn`` is 0.  O(k)."""
    zp = 0.0
    for t in range(zc.shape[0]):
        zp += zc[t] * z[t]
    fixed, unit, scale = slack
    margin = (residual + fixed + unit * (scale * xn + abs(uref) + abs(zp))) * _ROUND_UP
    side = uref - zp - b
    gap = side - margin if fire else -side - margin
    return gap if gap > 0.0 and xn > 0 else 0.0


@njit(cache=True, inline="always")
def _centre(zc, dc, Z, ej, s0, ns):
    """``zc += Σ_l dc_l z_l`` over the prefix of ``ns`` entries from ``s0``: the move
    since the anchor along the principal directions.  O(|prefix|·k)."""
    for p in range(ns):
        dcq = dc[p]
        zj = Z[ej[s0 + p]]
        for t in range(zc.shape[0]):
            zc[t] += dcq * zj[t]


@njit(cache=True, inline="always")
def _residual_move(since, zc, l1_c, xall, sq_c, ns, d, delta):
    """A bound on ``sqrt(dcᵀ (G_res + δI) dc)`` from the move since the anchor: ``since``
    bounds ``sqrt(dcᵀ G dc)`` (and ``||Σ_l dc_l x_l||``), ``zc`` is ``Σ_l dc_l z_l``
    formed in floating point, so ``dcᵀ G_res dc = dcᵀ G dc - ||Zᵀ dc||²``.  The terms
    cover ``G``'s rounding against ``X`` (``γ_d·(Σ|dc_l|·||x_l||)²``), ``zc``'s
    (``γ_{|P|+k}·Σ|dc_l|·||z_l||``, ``||z_l|| <= ||x_l||``) and the difference's own.
    Where the principal part carries most of the move this is several times smaller than
    the sum of the visits' step bounds that ``res_drift`` otherwise keeps.  O(k)."""
    k = zc.shape[0]
    scale = l1_c * xall
    unit = (ns + d + k + 8) * _U64
    zz = 0.0
    for t in range(k):
        zz += zc[t] * zc[t]
    low = max(math.sqrt(zz) - 2.0 * unit * scale, 0.0)
    quad = since * since * (1.0 + 4.0 * _U64) + 2.0 * unit * scale * scale - low * low
    return math.sqrt(max(quad, 0.0) + delta * sq_c) * _ROUND_UP


@njit(cache=True, fastmath={"reassoc", "contract"})
def _ever_from_data(r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, formed):
    """:func:`~._pairs.eval_ever_data` compiled apart with reassociated sums (as
    :func:`~._pairs.due_dots`): its dot products vectorize, where inlined into the visit
    each would be a chain of ``d`` dependent adds.  Returns its bound on the distance
    from the anchor."""
    since, _ = eval_ever_data(r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, formed)
    return since


# Inlined into :func:`_visit_range`, the visit runs with that function's floating-point
# flags (numba inlines at the IR level; the flags an inlined function declares are
# dropped), and so do the helpers it inlines (form_move(s), gram_block, move_norm; the
# lazy trainer's evaluate_rows compiles those it shares with reassoc and contract). None
# here: the screen's `later > drift` test stays an IEEE comparison. The dot products of
# the values from the data are the exception: `due_dots` and `_ever_from_data` are
# compiled apart with both flags, so their sums vectorize (a chain of d dependent adds
# a value otherwise; docs/design.md, "Or from the data").
@njit(cache=True, inline="always")
def visit(r, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, work, rec, fpos):
    """Bring neuron ``r``, whose key has passed, to the current time (kernel trainer).

    ``X32``: X in float32 (:func:`rough_copy`); ``parts``:
    :class:`~._principal.PrincipalParts`; ``sc``:
    :data:`~._records.VisitScalars`; ``drifts``: :data:`~._records.Drifts`; ``work``:
    :data:`VisitScratch`; ``rec``: :data:`~._records.FlipRecord`, the flips recorded from
    ``fpos`` on.

    Since its last visit its fire set ``S`` is constant, so it moved by exactly ``Σ_l dl_l
    x_l`` over its ever-fired pairs (``dl = C - clast``; ``clast`` becomes ``C``): at most
    ``s·||dl_S|| + Σ_{l ∉ S} |dl_l|·||x_l||`` (the second term is rounding: a frozen
    coefficient does not change), with ``s·||dl_S||`` the smaller of ``σ_r·||dl_S||`` and,
    with ``parts = (Z, residual norms, ρ)`` of :func:`principal_parts`, ``||Σ_S dl_l z_l|| +
    min(ρ, ||residuals_S||)·||dl_S||`` (O(|prefix|·k): on coherent data the principal part
    carries most of the move, and it is exact); that bound, times ``cert`` and its rounding,
    is what the drift ``D_r`` gains, unless most of its entries would then be due: those
    visits compute every value anyway, and the exact step ``||Σ_l dl_l x_l||`` too (formed
    from the data in O(d·|prefix|), or ``dlᵀ G dl``), which the drift gains if smaller (on
    incoherent data, while nearly every pair is due, it is several times smaller). Every
    entry, firing or not, keeps a key ``D + |v - b|/||x_j||`` from its last evaluation at
    drift ``D`` with value ``v``: only the entries whose key ``D_r`` reached are evaluated,
    by the Gram identity ``uref - Σ_l dc_l G[l, j]`` (``dc = C - cref``, |prefix| reads; all
    of them in one pass over the prefix's rows of G, :func:`~._pairs.gram_block`) or, when
    ``gram_cost`` reads a value cost more, from the move ``Σ_l dc_l x_l`` formed once.
    With principal directions, a due entry is first screened in O(k): its value is
    ``uref - <Σ_l dc_l z_l, z_j>`` within ``res_drift[r]·g_j`` (:func:`principal_parts`;
    ``res_drift`` sums the bounds on the residual part of each step since the anchor,
    and is cut to the exact residual part of the move since the anchor
    (:func:`_residual_move`, O(k)) wherever a visit has that move's norm anyway: a
    visit that computes the distance from its anchor, or forms the move for its due
    values; ``zc`` holds ``Σ_l dc_l z_l``), and an entry that stays on its side by more than that
    and the rounding of both ways is not evaluated: its key becomes the drift plus that
    margin over ``||x_j||``.  Only the entries that may flip, or whose side is in doubt,
    are evaluated; the fire flags are the same.
    Flips are applied and recorded from ``fpos`` on (if ``f_j`` is non-empty).

    The distance from the anchor is at most ``D_r - anchor_drift[r]``; once that
    may reach the band ``β/R`` (or if ``full``, or most entries are due), every ever-fired
    value and the exact distance are computed (:func:`~._pairs.eval_ever`,
    :func:`~._pairs.eval_ever_data`), ``anchor_drift`` is reset from them, and the neuron
    is re-anchored if the band is exceeded (its other entries are then left to the
    re-anchoring), or would be after ``ahead`` more steps like this one
    (:func:`lookahead`).  From the data, unless ``full``, the distance is the norm of the
    move formed (:func:`~._pairs.move_norm`) and only the due values are computed, when
    they cost less than the ``|prefix|·d`` of all the ever-fired ones (``|prefix|``
    reads of G against ``d`` flops a value); when those come from G, the step and the
    move are formed in one pass from ``X32``, their norms enlarged by the copy's error.
    On the first visit since the anchor the step is that distance: a neuron
    re-anchored then computes no value.  Returns ``(fpos + #flips, #values computed,
    whether to re-anchor)``; the values, keys and ``nf[r, MINKEY]`` (over all entries)
    are current.  O(|prefix|·K + the evaluated values).
    """
    ej, uref, val, key, fire, clast, cref, kappa = (
        pool.j, pool.uref, pool.val, pool.key, pool.fire, pool.clast, pool.cref, pool.kappa
    )  # fmt: skip
    eta_s, b, R, cert, scatter = sc.eta_s, sc.b, sc.R, sc.cert, sc.scatter
    gram_cost, full, ahead, x32_err = sc.gram_cost, sc.full, sc.ahead, sc.x32_err
    anchor_drift, res_drift = drifts.anchor, drifts.residual
    scratch, due_at, dw, dws, zw, zc = work.coef, work.due, work.dw, work.dws, work.zw, work.zc
    f_j, f_v, f_on = rec.j, rec.value, rec.on
    record = f_j.shape[0] > 0
    first = fpos
    d = X.shape[1]
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    end = s0 + seg[r, CNT]
    sig = sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
    Z, resid, rho, gres, rho_g, delta = (
        parts.Z,
        parts.resid,
        parts.rho,
        parts.g,
        parts.rho_g,
        parts.delta,
    )
    k = Z.shape[1]
    dc, dls = scratch[0], scratch[1]
    zw[:] = 0.0
    zc[:] = 0.0
    sq = 0.0
    sq_all = 0.0
    off = 0.0
    res2 = 0.0
    gres2 = 0.0
    l1 = 0.0
    l1_all = 0.0
    l1_c = 0.0
    sq_c = 0.0
    xmax = 0.0
    xall = 0.0
    unvisited = True  # clast = cref: the step since the last visit is the move since the anchor
    for q in range(s0, s0 + ns):
        c = coef_eager(q, r, kappa, fire, ej, a, E, eta_s)
        unvisited &= clast[q] == cref[q]
        dl = c - clast[q]
        dls[q - s0] = dl
        l1_all += abs(dl)
        sq_all += dl * dl
        j = ej[q]
        xall = max(xall, xnorm[j])
        if fire[q]:
            sq += dl * dl
            res2 += resid[j] * resid[j]
            l1 += abs(dl)
            xmax = max(xmax, xnorm[j])
            for t in range(k):
                zw[t] += dl * Z[j, t]
        else:
            off += abs(dl) * xnorm[j]
        clast[q] = c
        dcq = c - cref[q]
        dc[q - s0] = dcq
        l1_c += abs(dcq)
        sq_c += dcq * dcq
        if k:
            gres2 += gres[j] * gres[j]
    proj = 0.0
    for t in range(k):
        proj += zw[t] * zw[t]
    # Σ dl z in float64 errs by at most (|S| + k)·2⁻⁵³·Σ|dl|·max ||x||
    proj = math.sqrt(proj) + (ns + k + 4) * _U64 * l1 * xmax
    norm_dl = math.sqrt(sq)
    split = proj + min(rho, math.sqrt(res2)) * norm_dl
    move = (min(sig * norm_dl, split) + off) * (1.0 + (ns + 4) * _U64) * _ROUND_UP
    drift = nf[r, DRIFT] + cert * move
    if k:  # the residual part of this step, in the G_res + δI norm (principal_parts)
        step_res = min(rho_g, math.sqrt(gres2)) * math.sqrt(sq_all)
        res_drift[r] += cert * step_res * (1.0 + (ns + 4) * _U64) * _ROUND_UP
    # a screened value errs by the residual part, δ·||dc||_1 and the rounding of both ways
    res_now = res_drift[r]
    slack = (delta * l1_c, 2.0 * (ns + k + 4) * _U64, l1_c * xall)
    exact = np.inf
    due = 0
    due_out = 0  # of them outside the ever-fired prefix: computed on either branch below
    if drift >= nf[r, MINKEY]:  # else no entry is due (MINKEY is their smallest key)
        for q in range(s0, end):
            if key[q] <= drift:
                due += 1
                due_out += q >= s0 + ns
    centred = k > 0 and due > 0
    if centred:  # the screen's centre, Σ dc_l z_l: only a visit with due entries needs it
        _centre(zc, dc, Z, ej, s0, ns)
    fresh = full or (drift - anchor_drift[r]) * R >= nf[r, BETA]
    data = by_data(d, ns, scatter)
    # from the data, with few due values, the values come from the move (lite) or from G:
    # lite while they cost less than the ever-fired values and the due ones outside the
    # prefix, which the other branch computes (from the move); from G, the moves formed
    # are only read for their norms: from X's float32 copy, half the bytes of X to
    # stream, each norm then larger by at most Σ|c_l|·x32_err
    lite = data and not full and due * min(d, gram_cost * ns) < (ns + due_out) * d
    rough = lite and ns * gram_cost <= d and x32_err < np.inf
    formed = False  # whether dw holds the move since the anchor
    if fresh or 2 * due >= end - s0:  # most values are due: all of them, and the exact step
        fresh = True
        if data:  # ||Σ dl_l x_l||, formed; it errs by at most (|P| + d)·2⁻⁵³·Σ|dl|·max ||x||
            formed = not unvisited  # the move since the anchor too, in the same pass
            if rough and formed:
                form_moves(dws, dw, X32, ej, dls, dc, s0, s0 + ns)
            elif rough:
                form_move(dws, X32, ej, dls, s0, s0 + ns)
            elif formed:
                form_moves(dws, dw, X, ej, dls, dc, s0, s0 + ns)
            else:
                form_move(dws, X, ej, dls, s0, s0 + ns)
            sqx = 0.0
            for t in range(d):
                sqx += dws[t] * dws[t]
            exact = math.sqrt(sqx) + 4.0 * (ns + d + 4) * _U64 * l1_all * xall
            if rough:  # ... and by Σ|dl_l|·||x32_l - x_l|| from the copy
                exact = _rough(exact, l1_all, x32_err)
            exact *= _ROUND_UP
        else:  # dlᵀ G dl, |P|² reads
            sqx = 0.0
            gmax = 0.0
            for p in range(ns):
                jp = ej[s0 + p]
                gmax = max(gmax, G[jp, jp])
                for p2 in range(ns):
                    sqx += dls[p] * dls[p2] * G[jp, ej[s0 + p2]]
            exact = safe_norm(sqx, l1_all, gmax)
        drift = nf[r, DRIFT] + cert * min(move, exact)
    nf[r, DRIFT] = drift
    evaluated = 0
    again = False
    skip = fresh and unvisited and needs_reanchor(r, nf, exact * (1.0 + ahead), R)
    ever = False  # whether every ever-fired value is current
    if skip:  # its step is its distance from the anchor: re-anchored, no values needed
        again = True
    elif fresh:  # the exact distance from the anchor
        # from the data, the move formed and the due values only, while cheaper than
        # every ever-fired value (W4: 2·|prefix| against 784 a value)
        if data and unvisited:  # the move since the anchor is the step, just formed in dws
            dw[:] = dws
        if lite:
            since = move_norm(dw, l1_c, xall, ns)
            if rough:  # formed from the float32 copy
                since = _rough(since, l1_c, x32_err) * _ROUND_UP
        elif data:
            since = _ever_from_data(
                r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, unvisited or formed
            )
        else:
            since, _ = eval_ever(r, seg, pool, scratch, a, E, G, eta_s, False)
        ever = not lite
        if ever:
            evaluated = ns
        anchor_drift[r] = drift - cert * since
        again = needs_reanchor(r, nf, since + ahead * exact, R)
        if lite:
            skip = again  # the re-anchoring recomputes every value
            data = ns * gram_cost > d  # the due values: from the move, or from G
        if k and not skip and res_drift[r] < np.inf:  # the residual part, exact
            if not centred:
                _centre(zc, dc, Z, ej, s0, ns)
            exact_res = cert * _residual_move(since, zc, l1_c, xall, sq_c, ns, d, delta)
            res_drift[r] = min(res_drift[r], exact_res)
            res_now = res_drift[r]
    best = np.inf
    stop = s0 if skip else s0 + ns if again else end  # re-anchoring recomputes the others
    if not (fresh or due):  # nothing to evaluate: the keys, and their minimum, stand
        stop = s0
        best = nf[r, MINKEY]
    # the due values (and the ever-fired ones, unless current): screened first, the
    # rest computed together, before any flip moves an entry
    count = 0
    for q in range(s0 + ns if ever else s0, stop):
        if key[q] <= drift:
            j = ej[q]
            if k:
                gap = _screened_gap(
                    uref[q], fire[q], zc, Z[j], xnorm[j], b, res_now * gres[j], slack
                )
                if gap > 0.0:  # on its side, unless rounding keeps it due
                    later = drift + gap / xnorm[j]
                    if later > drift:
                        key[q] = later
                        continue
            due_at[0, count] = q
            due_at[1, count] = j
            count += 1
    if count:
        evaluated += count
        values = scratch[2]
        if not fresh:  # the values the screen left: from the move, or from G
            data = count * ns * gram_cost > (ns + count) * d
        if data:
            if not fresh:  # a fresh visit formed the move since the anchor in dw
                form_move(dw, X, ej, dc, s0, s0 + ns)
                if k and res_drift[r] < np.inf:  # formed: its residual part, exact
                    since = move_norm(dw, l1_c, xall, ns)
                    exact_res = cert * _residual_move(since, zc, l1_c, xall, sq_c, ns, d, delta)
                    res_drift[r] = min(res_drift[r], exact_res)
            due_dots(X, due_at[1], count, dw, values)
        else:
            gram_block(G, ej, dc, s0, ns, due_at[1], count, values)
        for t in range(count):
            q = due_at[0, t]
            val[q] = uref[q] - values[t]
    for q in range(s0, stop):  # increasing order: a pair turned on moves below q (flip)
        if (ever and q < s0 + ns) or key[q] <= drift:
            v = val[q]
            now = v >= b
            pos = q
            if now != fire[q]:
                if record:
                    f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], v, now
                fpos += 1
                pos = flip(r, q, seg, pool, a, E, eta_s, now)
            key[pos] = entry_key(drift, v, b, xnorm[ej[pos]])
            best = min(best, key[pos])
        else:
            best = min(best, key[q])
    nf[r, MINKEY] = best
    if fpos > first:  # the fire set changed
        nf[r, SIGMA] = SIGMA_UNKNOWN
        sigma_of(r, seg, nf, pool, G, xnorm, d, scatter)
    return fpos, evaluated, again


@njit(cache=True)
def _visit_range(rows, lo, hi, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, rec, out):
    """:func:`visit` for ``rows[lo:hi]`` on this thread, with its own scratch vectors;
    each gets its new key (:func:`heap_key`) unless it must be re-anchored
    (``out.again[k]``).  The flips of ``rows[k]`` are recorded at ``rec.start[k]`` on
    (when ``rec.j`` is non-empty)."""
    record = rec.j.shape[0] > 0
    k_dirs = parts.Z.shape[1]
    work = VisitScratch(
        np.empty((3, G.shape[0])),
        np.empty((2, G.shape[0]), dtype=np.int64),  # the due entries, their points
        np.empty(X.shape[1]),
        np.empty(X.shape[1]),
        np.empty(k_dirs),
        np.empty(k_dirs),
    )
    for k in range(lo, hi):
        r = rows[k]
        if k + 1 < hi and by_data(X.shape[1], seg[rows[k + 1], SUPP], sc.scatter):
            prefetch_segment(rows[k + 1], seg, pool, True)
        start = rec.start[k] if record else 0
        pos, out.nevals[k], out.again[k] = visit(
            r, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, work, rec, start
        )
        out.nflips[k] = pos - start
        if not out.again[k]:
            nf[r, KEY] = heap_key(r, nf, drifts.anchor, sc.R, sc.P, sc.per_p)


@njit(cache=True, parallel=True)
def visit_rows(rows, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, rec, out):
    """:func:`_visit_range` for every neuron of ``rows``, in parallel chunks (arguments
    as for :func:`visit`; ``out``: :data:`~._records.RowResults`)."""
    nrows = rows.shape[0]
    chunks = min(nrows, _EVALUATE_CHUNKS)
    for c in prange(chunks):
        lo, hi = c * nrows // chunks, (c + 1) * nrows // chunks
        _visit_range(
            rows, lo, hi, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, rec, out
        )


@njit(cache=True)
def visit_few(rows, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, rec, out):
    """:func:`visit_rows` on the calling thread, for a few rows (the same results)."""
    n = rows.shape[0]
    _visit_range(rows, 0, n, seg, nf, pool, a, E, G, X, X32, xnorm, parts, sc, drifts, rec, out)
