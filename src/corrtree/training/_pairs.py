"""Per-pair kernels of the band trainers: coefficients, Gram-identity values,
drift bounds, flips and keys (the lazy trainer's moves route: :mod:`._moves`; sums
over the firing pairs and the weights they give: :mod:`._outputs`).

Implicit weights (``docs/design.md``, "Implicit weights")
    ``W(t) = W(0) - C(t) X`` with ``C[r, l](t) = η/sqrt(m) · Σ_{τ<t} F_rl(τ)·(a_r·err_l(τ))``.
    While a pair fires, ``C[r, l](t) = κ_rl + η/sqrt(m) · a_r·E_l(t)`` with
    ``E(t) = Σ_{τ<t} err(τ)``; when it stops firing its ``C`` is frozen into
    ``κ_rl``.  Only pairs that ever fired have ``C ≠ 0``.

Gram identity
    For an entry of neuron ``r`` anchored at ``t_a``:
    ``U[r, j](t) = U[r, j](t_a) - Σ_l (C_rl(t) - C_rl(t_a))·G[l, j]``, ``G = X Xᵀ``:
    O(#pairs that ever fired) per value, no ``d``.

Invariants every kernel here keeps: the ever-fired prefix of a segment holds
every firing entry and never reorders; ``seg[r, NFIRE]`` counts the entries
with ``fire``; ``C`` is continuous across flips (:func:`flip`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _config
from .._jit import njit
from .._prefetch import prefetch1d, prefetch2d
from ._pool import BETA, CNT, DRIFT, MINKEY, NFIRE, SIGMA, SIGMA_UNKNOWN, START, SUPP

__all__ = [
    "by_data",
    "coef",
    "coef_eager",
    "data_dot",
    "dot4",
    "dot_row",
    "entry_key",
    "eval_ever",
    "evaluate_neuron",
    "flip",
    "form_move",
    "form_moves",
    "gram_block",
    "gram_sum",
    "move_norm",
    "needs_reanchor",
    "prefetch_block",
    "prefetch_segment",
    "safe_norm",
    "sigma",
    "trace_sigma",
]

_ROUND_UP = _config.ROUND_UP
_QUAD_SLACK = _config.QUAD_FORM_SLACK
_CHUNKS = _config.FORWARD_CHUNKS
_U64 = _config.U64


@njit(cache=True, inline="always")
def dot_row(a, r, E, j):
    """``<a_r, E_j>`` over the K outputs."""
    s = 0.0
    for k in range(a.shape[1]):
        s += a[r, k] * E[j, k]
    return s


@njit(cache=True, inline="always")
def coef(q, r, kappa, fire, ej, a, E, eta_s):
    """The coefficient ``C_rl`` of entry ``q`` now (see the module docstring), from the
    pool's arrays ``kappa``, ``fire`` and ``j`` (not the pool: an inlined function that
    takes the pool's tuple costs a reference count per array and call, several times
    the arithmetic of a hot loop)."""
    c = kappa[q]
    if fire[q]:
        c += eta_s * dot_row(a, r, E, ej[q])
    return c


@njit(cache=True, inline="always")
def coef_eager(q, r, kappa, fire, ej, a, E, eta_s):
    """:func:`coef`, with ``<a_r, E_l>`` formed for every entry (K multiply-adds more
    for a pair that does not fire).  For a long function with many branches: numba
    counts a reference to each array an inlined function takes, and where that
    function reads an array only inside a branch the count is not pruned, so
    :func:`coef` there costs three increments and six decrements an entry (the kernel
    trainer's visit: 15% of its time on breast cancer, ``docs/design.md``)."""
    s = dot_row(a, r, E, ej[q])
    c = kappa[q]
    if fire[q]:
        c += eta_s * s
    return c


@njit(cache=True, inline="always")
def gram_sum(G, j, ej, dc, s0, ns):
    """``Σ_{p<ns} dc[p] · G[j, ej[s0+p]]`` with four accumulators (fixed order)."""
    a0 = a1 = a2 = a3 = 0.0
    p = 0
    while p + 4 <= ns:
        q = s0 + p
        a0 += dc[p] * G[j, ej[q]]
        a1 += dc[p + 1] * G[j, ej[q + 1]]
        a2 += dc[p + 2] * G[j, ej[q + 2]]
        a3 += dc[p + 3] * G[j, ej[q + 3]]
        p += 4
    while p < ns:
        a0 += dc[p] * G[j, ej[s0 + p]]
        p += 1
    return (a0 + a1) + (a2 + a3)


@njit(cache=True, inline="always")  # inlined into the visit: its flags rule (none)
def gram_block(G, ej, dc, s0, ns, js, count, acc):
    """``acc[t] = Σ_{p<ns} dc[p] · G[ej[s0+p], js[t]]`` for ``t < count``: the values of
    many pairs of one neuron at once, each of its prefix rows of G read once at the
    points ``js`` in a pass of four rows, where :func:`gram_sum` gathers ``ns``
    scattered reads a pair (faster on the due pairs of isotropic data: ``docs/design.md``,
    "Measurements behind the choices").  O(ns·count)."""
    acc[:count] = 0.0
    p = 0
    while p + 4 <= ns:
        q = s0 + p
        c0, c1, c2, c3 = dc[p], dc[p + 1], dc[p + 2], dc[p + 3]
        g0, g1, g2, g3 = G[ej[q]], G[ej[q + 1]], G[ej[q + 2]], G[ej[q + 3]]
        for t in range(count):
            j = js[t]
            acc[t] += (c0 * g0[j] + c1 * g1[j]) + (c2 * g2[j] + c3 * g3[j])
        p += 4
    while p < ns:
        c0 = dc[p]
        g0 = G[ej[s0 + p]]
        for t in range(count):
            acc[t] += c0 * g0[js[t]]
        p += 1


@njit(cache=True)
def sigma(r, seg, pool, G):
    """``sqrt`` of a Gershgorin bound on ``λ_max(G[S, S])``, ``S`` the points ``r`` fires on.

    For any coefficients ``c`` on ``S``: ``||Σ_l c_l x_l|| <= sigma · ||c||``.
    O(|prefix|²).
    """
    ej, fire = pool.j, pool.fire
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    best = 0.0
    for p in range(ns):
        if fire[s0 + p]:
            jp = ej[s0 + p]
            row = 0.0
            for q in range(ns):
                if fire[s0 + q]:
                    row += abs(G[jp, ej[s0 + q]])
            best = max(best, row)
    return math.sqrt(best)


@njit(cache=True)
def trace_sigma(r, seg, pool, xnorm):
    """``sqrt(Σ_{l ∈ S} ||x_l||²)``, ``S`` the points ``r`` fires on: by Cauchy–Schwarz
    a bound like :func:`sigma`, looser (little on coherent data, where Gershgorin's
    rows are nearly full) but O(|prefix|) instead of O(|prefix|²)."""
    ej, fire = pool.j, pool.fire
    s0 = seg[r, START]
    t = 0.0
    for p in range(seg[r, SUPP]):
        if fire[s0 + p]:
            t += xnorm[ej[s0 + p]] ** 2
    return math.sqrt(t)


@njit(cache=True)
def prefetch_block(r, seg, ej, G):
    """Ask for the ``G[P, P]`` entries (upper triangle) of neuron ``r`` ahead of use."""
    t0 = seg[r, START]
    t1 = t0 + seg[r, SUPP]
    for q in range(t0, t1):
        for q2 in range(q, t1):
            prefetch2d(G, ej[q], ej[q2])


@njit(cache=True, inline="always")
def prefetch_segment(r, seg, pool, keys):
    """Ask for neuron ``r``'s entries ahead of use: its ever-fired prefix in the pool's
    arrays a value reads (``j``, ``kappa``, ``fire``, ``cref``, ``clast``, ``uref``,
    ``val``), and with ``keys`` its whole segment's ``key``.  A neuron's pairs are a
    few cache lines of each array, apart from the previous neuron's by the rest of its
    segment, which the hardware's stream prefetchers do not follow (W5's data, the lazy
    trainer: a fifth of its evaluation).  One hint a cache line (a hint past an
    array's end is harmless: a prefetch never faults)."""
    t0 = seg[r, START]
    t1 = t0 + seg[r, SUPP]
    for q in range(t0, t1 + 7, 8):  # float64: eight a line
        prefetch1d(pool.kappa, q)
        prefetch1d(pool.cref, q)
        prefetch1d(pool.clast, q)
        prefetch1d(pool.uref, q)
        prefetch1d(pool.val, q)
    for q in range(t0, t1 + 15, 16):
        prefetch1d(pool.j, q)
    for q in range(t0, t1 + 63, 64):
        prefetch1d(pool.fire, q)
    if keys:
        for q in range(t0, t0 + seg[r, CNT] + 7, 8):
            prefetch1d(pool.key, q)


@njit(cache=True, inline="always")
def safe_norm(sq, l1, gmax):
    """``sqrt`` of a computed quadratic form ``cᵀ G c``, enlarged to cover its rounding."""
    return math.sqrt(max(sq, 0.0) + _QUAD_SLACK * l1 * l1 * gmax) * _ROUND_UP


@njit(cache=True, inline="always")
def entry_key(drift, v, b, xn):
    """The drift at which an entry of value ``v`` at drift ``drift`` may reach ``b``."""
    return drift + abs(v - b) / xn if xn > 0 else np.inf


@njit(cache=True, inline="always")
def needs_reanchor(r, nf, since_anchor, R):
    """Whether neuron ``r``'s untracked pairs may have reached ``b``: its distance
    from its anchor times ``R = max ||x_j||`` reached its band ``β``."""
    return since_anchor * R >= nf[r, BETA]


@njit(cache=True)
def eval_ever(r, seg, pool, scratch, a, E, G, eta_s, want_step):
    """Exact current values of the ever-fired pairs ``P`` of neuron ``r``.

    With ``C`` their coefficients now, ``dc = C - cref`` (since the anchor,
    kept in ``scratch[0, :|P|]``, prefix order): ``val[P] = uref[P] - G[P, P] dc``, reading each
    ``G[p, q]`` once (``|P|(|P|+1)/2`` reads).  Returns bounds on
    ``||w_r(t) - w_r(anchor)||`` and, if ``want_step``, on
    ``||w_r(t) - w_r(last evaluation)||`` (from ``dl = C - clast``; ``clast``
    becomes ``C``), else 0: the quadratic forms plus their rounding.
    """
    ej, uref, val, cref, clast = pool.j, pool.uref, pool.val, pool.cref, pool.clast
    kappa, fire = pool.kappa, pool.fire
    dc, dl = scratch[0], scratch[1]
    s0 = seg[r, START]
    end = s0 + seg[r, SUPP]
    l1_a = 0.0
    l1_s = 0.0
    for q in range(s0, end):
        c = coef(q, r, kappa, fire, ej, a, E, eta_s)
        dc[q - s0] = c - cref[q]
        val[q] = uref[q]
        l1_a += abs(dc[q - s0])
        if want_step:
            dl[q - s0] = c - clast[q]
            l1_s += abs(dl[q - s0])
        clast[q] = c  # values and clast always describe the last evaluation
    sq_s = 0.0
    gmax = 0.0
    for q in range(s0, end):
        jp = ej[q]
        dp = dc[q - s0]
        g = G[jp, jp]
        gmax = max(gmax, g)
        ap = g * dp
        if want_step:
            lp = dl[q - s0]
            sq_s += g * lp * lp
            for q2 in range(q + 1, end):
                g = G[jp, ej[q2]]
                ap += g * dc[q2 - s0]
                val[q2] -= g * dp
                sq_s += 2.0 * g * lp * dl[q2 - s0]
        else:
            for q2 in range(q + 1, end):
                g = G[jp, ej[q2]]
                ap += g * dc[q2 - s0]
                val[q2] -= g * dp
        val[q] -= ap
    sq_a = 0.0  # dcᵀ G dc = Σ_p dc_p (uref_p - val_p)
    for q in range(s0, end):
        sq_a += dc[q - s0] * (uref[q] - val[q])
    step = safe_norm(sq_s, l1_s, gmax) if want_step else 0.0
    return safe_norm(sq_a, l1_a, gmax), step


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def form_move(dw, X, ej, dc, s0, end):
    """``dw = Σ_{s0 <= q < end} dc[q - s0]·x_{ej[q]}``, four rows a pass: a quarter of the
    loads and stores of ``dw`` (the pass is bound by moving rows of X, float64 or its
    float32 copy, summed in float64).  O(d·(end - s0))."""
    d = X.shape[1]
    dw[:] = 0.0
    q = s0
    while q + 4 <= end:
        j0, j1, j2, j3 = ej[q], ej[q + 1], ej[q + 2], ej[q + 3]
        c0, c1, c2, c3 = dc[q - s0], dc[q + 1 - s0], dc[q + 2 - s0], dc[q + 3 - s0]
        for t in range(d):
            dw[t] += (c0 * X[j0, t] + c1 * X[j1, t]) + (c2 * X[j2, t] + c3 * X[j3, t])
        q += 4
    while q < end:
        c0 = dc[q - s0]
        j0 = ej[q]
        for t in range(d):
            dw[t] += c0 * X[j0, t]
        q += 1


@njit(cache=True, inline="always")  # inlined into the visit: its flags rule (none)
def form_moves(dw, dv, X, ej, dc, dl, s0, end):
    """:func:`form_move` of two coefficient vectors over the same rows in one pass,
    ``dw = Σ_q dc[q - s0]·x_{ej[q]}`` and ``dv = Σ_q dl[q - s0]·x_{ej[q]}``: each row of
    ``X`` (float64, or its float32 copy) is read once for both.  O(d·(end - s0))."""
    d = X.shape[1]
    dw[:] = 0.0
    dv[:] = 0.0
    q = s0
    while q + 4 <= end:
        j0, j1, j2, j3 = ej[q], ej[q + 1], ej[q + 2], ej[q + 3]
        c0, c1, c2, c3 = dc[q - s0], dc[q + 1 - s0], dc[q + 2 - s0], dc[q + 3 - s0]
        l0, l1, l2, l3 = dl[q - s0], dl[q + 1 - s0], dl[q + 2 - s0], dl[q + 3 - s0]
        for t in range(d):
            x0, x1, x2, x3 = X[j0, t], X[j1, t], X[j2, t], X[j3, t]
            dw[t] += (c0 * x0 + c1 * x1) + (c2 * x2 + c3 * x3)
            dv[t] += (l0 * x0 + l1 * x1) + (l2 * x2 + l3 * x3)
        q += 4
    while q < end:
        c0, l0, j0 = dc[q - s0], dl[q - s0], ej[q]
        for t in range(d):
            dw[t] += c0 * X[j0, t]
            dv[t] += l0 * X[j0, t]
        q += 1


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def dot4(X, j0, j1, j2, j3, w):
    """``<x_j, w>`` for four points in one pass: they share the loads of ``w``.  O(d)."""
    t0 = t1 = t2 = t3 = 0.0
    for t in range(X.shape[1]):
        v = w[t]
        t0 += X[j0, t] * v
        t1 += X[j1, t] * v
        t2 += X[j2, t] * v
        t3 += X[j3, t] * v
    return t0, t1, t2, t3


@njit(cache=True, fastmath={"reassoc", "contract"})
def due_dots(X, js, count, w, out):
    """``out[t] = <x_{js[t]}, w>`` for ``t < count``, four points a pass (:func:`dot4`).
    Compiled apart, never inlined: its reassociated sums vectorize even when called from
    the kernel trainer's visit, whose own flags (none) would make each dot product a
    chain of ``d`` dependent adds, several times slower.  O(d·count)."""
    t = 0
    while t + 4 <= count:
        out[t], out[t + 1], out[t + 2], out[t + 3] = dot4(
            X, js[t], js[t + 1], js[t + 2], js[t + 3], w
        )
        t += 4
    while t < count:
        out[t] = data_dot(X, js[t], w)
        t += 1


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def eval_ever_data(r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, formed):
    """:func:`eval_ever` with the Gram sums rebuilt from the data: the move
    ``dw = Σ_l dc_l x_l`` since the anchor is formed once, in ``O(d·|P|)`` (unless
    ``formed``: the caller formed it already), and each value is ``uref - <x_j, dw>``.
    Cheaper than the ``|P|²/2`` scattered reads of ``G`` when ``d`` is small against
    ``|P|`` (:func:`by_data`).

    The step since the last evaluation, ``dws = Σ_l dl_l x_l`` with
    ``dl = C - clast``, is never formed: the values of the last evaluation
    (``val`` on entry, which with ``clast`` always describes it) give
    ``<x_l, dws> = val_old_l - val_l``, so ``||dws||² = Σ_l dl_l·(val_old_l - val_l)``.
    Both returned bounds cover their rounding.  O(d·|P|).
    """
    ej, cref, clast, kappa, fire = pool.j, pool.cref, pool.clast, pool.kappa, pool.fire
    uref, val = pool.uref, pool.val
    dc, dl = scratch[0], scratch[1]
    s0 = seg[r, START]
    end = s0 + seg[r, SUPP]
    d = X.shape[1]
    l1_a = 0.0
    l1_s = 0.0
    l1_o = 0.0  # Σ|clast - cref|: the move at the last evaluation
    xmax = 0.0
    for q in range(s0, end):
        c = coef(q, r, kappa, fire, ej, a, E, eta_s)
        dc[q - s0] = c - cref[q]
        dl[q - s0] = c - clast[q]
        l1_s += abs(dl[q - s0])
        l1_a += abs(dc[q - s0])
        l1_o += abs(clast[q] - cref[q])
        clast[q] = c
        xmax = max(xmax, xnorm[ej[q]])
    if not formed:
        form_move(dw, X, ej, dc, s0, end)
    sq_s = 0.0
    mag = 0.0  # Σ_l |dl_l|·(the magnitudes each value's rounding is relative to)
    q = s0
    while q + 4 <= end:  # four dot products a pass share the loads of dw
        t0, t1, t2, t3 = dot4(X, ej[q], ej[q + 1], ej[q + 2], ej[q + 3], dw)
        sq_s, mag = _new_value(q, q - s0, t0, uref, val, dl, sq_s, mag)
        sq_s, mag = _new_value(q + 1, q + 1 - s0, t1, uref, val, dl, sq_s, mag)
        sq_s, mag = _new_value(q + 2, q + 2 - s0, t2, uref, val, dl, sq_s, mag)
        sq_s, mag = _new_value(q + 3, q + 3 - s0, t3, uref, val, dl, sq_s, mag)
        q += 4
    while q < end:
        sq_s, mag = _new_value(q, q - s0, data_dot(X, ej[q], dw), uref, val, dl, sq_s, mag)
        q += 1
    # ‖dws‖²: a value of either evaluation is within (γ_|P| + γ_d)·(its Σ|dc|)·max‖x‖²
    # (+ u·|value| + γ_|P|·|uref| when summed from G) of exact arithmetic on the
    # stored coefficients; the differences and their sum add u·|diff|, γ_|P|·|dl·diff|.
    # Times |dl_l| and summed: 8(|P| + d + 2)·2⁻⁵³·mag covers all of it.
    unit = 4.0 * (end - s0 + d) * _U64
    mag += l1_s * xmax * xmax * (l1_a + l1_o)
    step = math.sqrt(max(sq_s + 2.0 * (unit + 8.0 * _U64) * mag, 0.0)) * _ROUND_UP
    return move_norm(dw, l1_a, xmax, end - s0), step


@njit(cache=True, inline="always")
def move_norm(dw, l1, xmax, count):
    """A bound on ``||Σ_l dc_l x_l||`` from ``dw``, that sum formed in floating point
    (:func:`form_move`) over ``count`` points of norm at most ``xmax`` with ``Σ|dc_l| =
    l1``: ``|‖dw‖² - ‖computed dw‖²| <= (2γ_count + γ_d)·l1²·xmax²``, ``γ_k ≈ k·2⁻⁵³``.
    O(d)."""
    sq = 0.0
    for t in range(dw.shape[0]):
        sq += dw[t] * dw[t]
    unit = 4.0 * (count + dw.shape[0]) * _U64
    return math.sqrt(sq + unit * xmax * xmax * l1 * l1) * _ROUND_UP


@njit(cache=True)  # not inline="always": numba's IR inlining of it gave wrong values
def _new_value(q, p, dot, uref, val, dl, sq_s, mag):
    """Entry ``q`` (prefix position ``p``) takes the value ``uref - dot``; returns the
    step and rounding sums of :func:`eval_ever_data` with its terms added."""
    old = val[q]
    v = uref[q] - dot
    diff = old - v
    val[q] = v
    sq_s += dl[p] * diff
    mag += abs(dl[p]) * (abs(uref[q]) + abs(old) + abs(v) + 2.0 * abs(diff))
    return sq_s, mag


@njit(cache=True, inline="always")
def data_dot(X, j, w):
    """``<x_j, w>``."""
    s = 0.0
    for t in range(X.shape[1]):
        s += X[j, t] * w[t]
    return s


@njit(cache=True, inline="always")
def by_data(d, ns, scatter):
    """Whether the values of a prefix of ``ns`` pairs are cheaper rebuilt from the
    data (``2·d·ns`` flops: the move, then one dot product a pair) than read from
    ``G`` (``ns²/2`` scattered reads of ``scatter`` flops each, measured by
    :func:`~._calibrate.scatter_cost`)."""
    return 2 * d < scatter * (ns + 1) / 2


@njit(cache=True)
def flip(r, q, seg, pool, a, E, eta_s, on):
    """Switch entry ``q`` of neuron ``r`` on or off, keeping ``C`` continuous.

    Turning on: the entry joins the ever-fired prefix if it is not there (a
    swap with the first entry after the prefix).  Returns the entry's position.
    """
    ej, kappa, fire, clast = pool.j, pool.kappa, pool.fire, pool.clast
    drive = eta_s * dot_row(a, r, E, ej[q])
    if on:
        clast[q] = kappa[q]  # its (frozen) coefficient now
        kappa[q] -= drive
        fire[q] = True
        seg[r, NFIRE] += 1
        dest = seg[r, START] + seg[r, SUPP]
        if q >= dest:  # not yet ever-fired: swap into the prefix
            if q != dest:
                for arr in (pool.uref, pool.val, pool.key, kappa, pool.cref, clast):
                    arr[q], arr[dest] = arr[dest], arr[q]
                if pool.vel.shape[0]:
                    pool.vel[q], pool.vel[dest] = pool.vel[dest], pool.vel[q]
                ej[q], ej[dest] = ej[dest], ej[q]
                fire[q], fire[dest] = fire[dest], fire[q]
            seg[r, SUPP] += 1
            return dest
        return q
    kappa[q] += drive
    fire[q] = False
    seg[r, NFIRE] -= 1
    return q


@njit(cache=True, inline="always")
def evaluate_neuron(r, seg, nf, pool, scratch, a, E, err, G, X, xnorm, sc, dw, rec, fpos):
    """Evaluate the pairs of neuron ``r`` that may have changed side, and flip them
    (``sc``: :data:`~._records.EvalScalars`; ``rec``: :data:`~._records.FlipRecord`).

    The drift ``D_r = nf[r, DRIFT]`` grows by (``cert`` times) a bound on the distance
    ``w_r`` moved since its last evaluation: the exact one from :func:`eval_ever` or
    :func:`eval_ever_data`, or, when ``err`` (the error of the step just taken, the
    neuron's last evaluation being just before it) is non-empty and the values come from
    ``G``, the cheaper ``(η/sqrt m)·σ_r·||(a_r·err_l)_{l fires}||``.  For a pair last
    evaluated at drift ``D`` with value ``v``, ``|U - v| <= (D_r - D)·||x_j||``. A pair
    outside the ever-fired prefix is evaluated only once ``D_r`` reaches its key ``D +
    |v - b|/||x_j||`` (keys and their minimum ``nf[r, MINKEY]`` are refreshed), unless
    the neuron must be re-anchored (:func:`needs_reanchor`, ``R = max ||x_j||``), which
    recomputes them all; the ever-fired pairs, which hold every firing pair, are always
    evaluated. Flips are applied to the pool and, if ``rec.j`` is non-empty, recorded from
    ``fpos`` on as ``(j, value, on)``, and ``σ_r`` becomes unknown, to be recomputed
    (O(|prefix|²)) only where a bound or a key needs it.  Values come from the Gram
    identity or, when :func:`by_data` says so for the exchange rate ``scatter``, from
    the data (:func:`eval_ever_data`, with ``dw`` of length ``d`` as scratch).  Returns
    ``(fpos + #flips, bound on ||w_r - w_r(anchor)||, number of pairs evaluated)``.
    """
    ej, uref, val, key, fire = pool.j, pool.uref, pool.val, pool.key, pool.fire
    eta_s, b, R, cert, scatter = sc.eta_s, sc.b, sc.R, sc.cert, sc.scatter
    f_j, f_v, f_on = rec.j, rec.value, rec.on
    record = f_j.shape[0] > 0
    first = fpos
    s0 = seg[r, START]
    ns = seg[r, SUPP]
    end = s0 + seg[r, CNT]
    # from the data the exact step costs nothing more than the values: take it
    data = by_data(X.shape[1], ns, scatter)
    exact = data or err.shape[0] == 0
    step = 0.0
    if not exact:  # fire flags are still those of the step
        if nf[r, SIGMA] == SIGMA_UNKNOWN:
            nf[r, SIGMA] = sigma(r, seg, pool, G)
        sq = 0.0
        for q in range(s0, s0 + ns):
            if fire[q]:
                e = dot_row(a, r, err, ej[q])
                sq += e * e
        step = eta_s * nf[r, SIGMA] * math.sqrt(sq) * _ROUND_UP
    if data:
        since_anchor, exact_step = eval_ever_data(
            r, seg, pool, scratch, a, E, X, xnorm, eta_s, dw, False
        )
    else:
        since_anchor, exact_step = eval_ever(r, seg, pool, scratch, a, E, G, eta_s, exact)
    if exact:
        step = exact_step
    drift = nf[r, DRIFT] + cert * step
    nf[r, DRIFT] = drift
    for q in range(s0, s0 + ns):  # ever-fired pairs never move in the pool
        now = val[q] >= b
        if now != fire[q]:
            if record:
                f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], val[q], now
            fpos += 1
            flip(r, q, seg, pool, a, E, eta_s, now)
    evaluated = ns
    if drift >= nf[r, MINKEY] and not needs_reanchor(r, nf, since_anchor, R):
        # some other tracked pair may have crossed (re-anchoring finds those itself)
        best = np.inf
        dc = scratch[0]
        for q in range(s0 + ns, end):  # increasing order: see flip
            if key[q] <= drift:
                evaluated += 1
                # positions below s0 + ns keep their pairs even after flips
                if data:
                    val[q] = uref[q] - data_dot(X, ej[q], dw)
                else:
                    val[q] = uref[q] - gram_sum(G, ej[q], ej, dc, s0, ns)
                if val[q] >= b:
                    if record:
                        f_j[fpos], f_v[fpos], f_on[fpos] = ej[q], val[q], True
                    fpos += 1
                    flip(r, q, seg, pool, a, E, eta_s, True)
                    continue
                key[q] = entry_key(drift, val[q], b, xnorm[ej[q]])
            best = min(best, key[q])
        nf[r, MINKEY] = best
    if fpos > first:  # the fire set changed: σ_r is recomputed when next needed
        nf[r, SIGMA] = SIGMA_UNKNOWN
    return fpos, since_anchor, evaluated
