"""The exchange rate of a visit's two routes, measured on this machine once per process.

A neuron's ever-fired values come from the Gram identity (``|P|(|P|+1)/2`` scattered
reads of ``G``, :func:`~._pairs.eval_ever`) or from the data (the move, then one dot
product a pair: ``2·d·|P|`` contiguous multiply-adds, :func:`~._pairs.eval_ever_data`);
:func:`~._pairs.by_data` takes the data when ``2·d < s·(|P| + 1)/2``, ``s`` what one of
those reads costs in multiply-adds.  The choice decides more than the values: a neuron
on the Gram route bounds its steps by the Gershgorin ``σ_r`` (``|S|²`` more reads after
each flip) where one on the data route takes a trace bound in O(|P|).  ``s`` depends on
the machine (cache sizes, memory latency, vector width) and on ``G``'s size (whether it
stays in cache), so :func:`scatter_cost` measures it: both routes' loops, compiled as
the lazy trainer's evaluation compiles them (reassociated sums; the kernel trainer's
visits, compiled without, took the same time), over random prefixes of the run's own
``G`` and ``X``, once per process and data shape; the Gram route's time, values and
``σ_r`` together, is priced per value read.  The routes give the same values to
rounding and the certificates cover both, so the rate moves time only, never the
trajectory beyond rounding.

The kernel trainer's visit makes the same choice for the values its screen leaves due:
``due·|P|`` reads of single rows of ``G`` (:func:`~._pairs.gram_block`) against the move
and one dot product a value (``(|P| + due)·d`` multiply-adds, :func:`~._pairs.form_move`
and :func:`~._pairs.due_dots`).  Those reads cost another rate (``Rate.row``), measured
with the same loops over random prefixes and due points of the run's ``G`` and ``X``:
on the 2-core machine of the benchmarks 4 multiply-adds on W5 (``G`` in the
second-level cache) to 32 on W2 and W4 (``G`` of 34 and 134 MB).
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import numpy as np

from .._jit import njit
from ._pairs import due_dots, form_move, gram_block

__all__ = ["SCATTER_COST_VAR", "Rate", "fixed_rate", "measured_rates", "scatter_cost"]

#: the environment variable that fixes the rate instead of measuring it
SCATTER_COST_VAR = "CORRTREE_SCATTER_COST"

#: points of each random prefix the measurement evaluates, how many prefixes a call
#: evaluates, and how many calls a timing takes, the best of ``TRIES`` timings
PREFIX = 64
PREFIXES = 128
#: due points of each prefix in the measurement of :attr:`Rate.row`
DUE = 32
CALLS = 2
TRIES = 3
#: the measured rate is rounded to a power of two within these bounds, so that runs on
#: one machine choose the same routes from process to process despite timing noise
LOWEST, HIGHEST = 4.0, 4096.0


class Rate(NamedTuple):
    """A measured exchange rate: ``scatter`` (multiply-adds a scattered read of ``G``
    costs, rounded), ``measured`` (before rounding), the seconds one read and one
    multiply-add took, ``seconds``, what measuring took (0 when it was cached), and
    ``row`` (multiply-adds a read of a row of ``G`` at a visit's due points costs,
    rounded), ``row_measured`` (before rounding)."""

    scatter: float
    measured: float
    read_s: float
    madd_s: float
    seconds: float
    row: float
    row_measured: float


_RATES: dict[tuple[int, int], Rate] = {}


@njit(cache=True, fastmath={"reassoc", "contract"})
def _by_gram(G, points, dc, vals):  # pragma: no cover - compiled
    """The Gram route's reads of a visit over each row of ``points``: the values
    (:func:`~._pairs.eval_ever`: ``val[P] = -G[P, P]·dc``, the upper triangle once) and
    the Gershgorin bound of the step that follows a flip (:func:`~._pairs.sigma`: every
    row's ``Σ|G|`` over the square), which the data route replaces by an O(|P|) trace
    bound (:func:`~._clocks.sigma_of`).  Returns the sum of the last values and bounds."""
    total = 0.0
    ns = points.shape[1]
    for k in range(points.shape[0]):
        val = vals[k]
        for q in range(ns):
            val[q] = 0.0
        for q in range(ns):
            jp = points[k, q]
            dp = dc[q]
            ap = G[jp, jp] * dp
            for q2 in range(q + 1, ns):
                g = G[jp, points[k, q2]]
                ap += g * dc[q2]
                val[q2] -= g * dp
            val[q] -= ap
        best = 0.0
        for q in range(ns):
            jp = points[k, q]
            row = 0.0
            for q2 in range(ns):
                row += abs(G[jp, points[k, q2]])
            best = max(best, row)
        total += val[ns - 1] + best
    return total


@njit(cache=True, fastmath={"reassoc", "contract"})
def _by_data(X, points, dc, dws, vals):  # pragma: no cover - compiled
    """The data route's loops (:func:`~._pairs.form_move`, then a dot product a pair,
    four rows a pass: :func:`~._pairs.due_dots`, the loop of
    :func:`~._pairs.eval_ever_data`) over each row of ``points``."""
    total = 0.0
    ns = points.shape[1]
    for k in range(points.shape[0]):
        dw, val, ej = dws[k], vals[k], points[k]
        form_move(dw, X, ej, dc, 0, ns)
        due_dots(X, ej, ns, dw, val)
        total += val[ns - 1]
    return total


@njit(cache=True)  # as the visit compiles it: no flags of its own
def _rows_by_gram(G, points, due, dc, vals):  # pragma: no cover - compiled
    """The Gram route of a visit's due values (:func:`~._pairs.gram_block`) for each row
    of ``points`` at the points of the same row of ``due``.  Returns the sum of the first
    values."""
    total = 0.0
    for k in range(points.shape[0]):
        gram_block(G, points[k], dc, 0, points.shape[1], due[k], due.shape[1], vals)
        total += vals[0]
    return total


@njit(cache=True)
def _rows_by_move(X, points, due, dc, dw, vals):  # pragma: no cover - compiled
    """The data route of a visit's due values: the move (:func:`~._pairs.form_move`),
    then a dot product a value (:func:`~._pairs.due_dots`)."""
    total = 0.0
    for k in range(points.shape[0]):
        form_move(dw, X, points[k], dc, 0, points.shape[1])
        due_dots(X, due[k], due.shape[1], dw, vals)
        total += vals[0]
    return total


def _seconds(run, calls: int) -> float:
    """Seconds ``run(i)`` takes, the best of :data:`TRIES` timings of ``calls``
    consecutive calls (each call on its own prefixes, so that no timing reads what an
    earlier one brought into the cache)."""
    best = math.inf
    for k in range(TRIES):
        t0 = time.perf_counter()
        for i in range(calls):
            run(k * calls + i)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measured_rates(G: np.ndarray, X: np.ndarray) -> tuple[float, float]:
    """Seconds one of the Gram route's ``|P|(|P|+1)/2`` value reads (with its share of
    ``σ_r``'s, :func:`_by_gram`) and one multiply-add of the data route take in the
    visits' loops, over random prefixes of the points (:data:`PREFIXES` a call, each of
    :data:`PREFIX` points, fewer when ``n`` is smaller), none read twice.
    O(TRIES·CALLS·PREFIXES·PREFIX·(PREFIX + d)); 10-90 ms on the workloads."""
    n, d = X.shape
    ns = min(PREFIX, n)
    rng = np.random.default_rng(0)
    # points drawn with replacement: a repeat in a prefix is rare and costs what it costs
    points = rng.integers(0, n, (1 + TRIES * CALLS, PREFIXES, ns)).astype(np.int32)
    dc = rng.standard_normal(ns)
    val, dw = np.zeros((PREFIXES, ns)), np.zeros((PREFIXES, d))
    _by_gram(G, points[-1], dc, val)  # loads (or compiles) the kernels: not timed
    _by_data(X, points[-1], dc, dw, val)
    gram_s = _seconds(lambda i: _by_gram(G, points[i], dc, val), CALLS)
    data_s = _seconds(lambda i: _by_data(X, points[i], dc, dw, val), CALLS)
    reads = PREFIXES * ns * (ns + 1) / 2
    madds = PREFIXES * 2.0 * d * ns
    return gram_s / reads, data_s / madds


def row_rate(G: np.ndarray, X: np.ndarray) -> float:
    """Multiply-adds of the data route that one read of a row of ``G`` at a visit's due
    points costs (:func:`_rows_by_gram` against :func:`_rows_by_move`), over
    :data:`PREFIXES` random prefixes a call of :data:`PREFIX` points, each with
    :data:`DUE` due points (fewer when ``n`` is smaller).
    O(TRIES·CALLS·PREFIXES·(PREFIX·DUE + (PREFIX + DUE)·d))."""
    n, d = X.shape
    ns, due = min(PREFIX, n), min(DUE, n)
    rng = np.random.default_rng(1)
    points = rng.integers(0, n, (1 + TRIES * CALLS, PREFIXES, ns)).astype(np.int32)  # as pool.j
    dues = rng.integers(0, n, (1 + TRIES * CALLS, PREFIXES, due)).astype(np.int64)
    dc = rng.standard_normal(ns)
    val, dw = np.zeros(due), np.zeros(d)
    _rows_by_gram(G, points[-1], dues[-1], dc, val)  # loads (or compiles): not timed
    _rows_by_move(X, points[-1], dues[-1], dc, dw, val)
    gram_s = _seconds(lambda i: _rows_by_gram(G, points[i], dues[i], dc, val), CALLS)
    move_s = _seconds(lambda i: _rows_by_move(X, points[i], dues[i], dc, dw, val), CALLS)
    return (gram_s / (PREFIXES * ns * due)) / (move_s / (PREFIXES * (ns + due) * d))


def _rounded(rate: float) -> float:
    """``rate`` rounded to a power of two within ``[LOWEST, HIGHEST]``."""
    return float(2.0 ** round(math.log2(min(max(rate, LOWEST), HIGHEST))))


def fixed_rate() -> float | None:
    """The rate :data:`SCATTER_COST_VAR` fixes (``None`` when it is unset or empty);
    ``ValueError`` naming the variable unless it is a positive, finite number."""
    fixed = os.environ.get(SCATTER_COST_VAR)
    if not fixed:
        return None
    try:
        s = float(fixed)
    except ValueError:
        s = math.nan
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"{SCATTER_COST_VAR} must be a positive number, got {fixed!r}")
    return s


def scatter_cost(G: np.ndarray, X: np.ndarray) -> Rate:
    """The multiply-adds one scattered read of ``G`` costs on this machine, and one read
    of a row of it at a visit's due points (:class:`Rate`), measured the first time a
    process asks for data of this shape (:func:`measured_rates`, :func:`row_rate`) and
    rounded to powers of two in ``[LOWEST, HIGHEST]``; the number in the environment
    variable ``CORRTREE_SCATTER_COST``, when set, instead, for both (the same routes on
    every machine: runs that agree bit for bit where their arithmetic does).  Cached:
    later calls cost nothing and report ``seconds = 0``."""
    n, d = X.shape
    s = fixed_rate()
    if s is not None:
        return Rate(s, s, math.nan, math.nan, 0.0, s, s)
    key = (n, d)
    if key in _RATES:
        return _RATES[key]._replace(seconds=0.0)
    t0 = time.perf_counter()
    read_s, madd_s = measured_rates(G, X)
    measured = read_s / madd_s
    row = row_rate(G, X)
    seconds = time.perf_counter() - t0
    rate = Rate(_rounded(measured), measured, read_s, madd_s, seconds, _rounded(row), row)
    _RATES[key] = rate
    return rate
