"""Numba kernels for many 64-ary bit trees: max trees over 0/1 leaves.

With a fixed threshold ``b`` a max tree over products only needs to know, for
each node, whether some leaf below it is ``>= b``: the maximum of indicator
bits, i.e. their OR.  Tree ``t`` stores its leaves as bits of 64-bit words
(level 0) and, for every level ``k + 1``, one bit per word of level ``k`` that
is set iff that word is non-zero, up to a single top word.  Level ``k``
occupies ``bits[t, off[k]:off[k + 1]]``.  Internal levels cost 1/63 of the
leaf bits; a report walks only set bits (count-trailing-zeros), so it costs
O(depth) per reported leaf plus O(1) per tree.
"""

from __future__ import annotations

import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import trailing_zeros

from . import _maxtree
from ._jit import njit

WORD = 64
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


def level_offsets(n_leaves: int) -> np.ndarray:
    """Word offsets of the levels of a bit tree over ``n_leaves`` bits (level 0:
    the leaf words)."""
    return _maxtree.level_offsets(n_leaves, WORD)


@njit(cache=True, parallel=True)
def pack(P, tau, bits, col0, counts):
    """Set the leaf bits ``col0 + k`` of every tree ``t`` to ``P[t, k] >= tau``.

    ``col0`` must be a multiple of 64 and the words written must not hold
    other columns' bits; ``counts[t]`` is increased by the bits set.
    """
    n_cols = P.shape[1]
    n_words = (n_cols + WORD - 1) // WORD
    w0 = col0 // WORD
    for t in prange(P.shape[0]):
        c = 0
        for w in range(n_words):
            word = _ZERO
            for s in range(min(WORD, n_cols - w * WORD)):
                if P[t, w * WORD + s] >= tau:
                    word |= _ONE << np.uint64(s)
                    c += 1
            bits[t, w0 + w] = word
        counts[t] += c


@njit(cache=True, parallel=True)
def build_summaries(bits, off):
    """Fill every level above the leaves from the level below."""
    h = off.shape[0] - 1
    for t in prange(bits.shape[0]):
        for lvl in range(1, h):
            base = off[lvl - 1]
            n_child = off[lvl] - base
            for k in range(off[lvl + 1] - off[lvl]):
                word = _ZERO
                for s in range(min(WORD, n_child - k * WORD)):
                    if bits[t, base + k * WORD + s] != _ZERO:
                        word |= _ONE << np.uint64(s)
                bits[t, off[lvl] + k] = word


@njit(cache=True)
def _set_bit(row, off, j, on):
    """Set (``on``) or clear leaf bit ``j`` and fix the summary bits above it."""
    h = off.shape[0] - 1
    idx = j
    for lvl in range(h):
        w = off[lvl] + idx // WORD
        mask = _ONE << np.uint64(idx % WORD)
        was_empty = row[w] == _ZERO
        if on:
            row[w] |= mask
            if not was_empty:
                return
        else:
            row[w] &= ~mask
            if row[w] != _ZERO:
                return
        idx //= WORD


@njit(cache=True, parallel=True)
def apply_columns(bits, off, cols, P, tau, counts):
    """Set leaf ``cols[k]`` of every tree ``t`` to ``P[t, k] >= tau``, in order.

    Only leaves whose bit changes touch the summaries.  ``counts[t]`` (set
    leaves of tree ``t``) stays exact.  O(T·len(cols) + flips·depth).
    """
    for t in prange(bits.shape[0]):
        row = bits[t]
        for k in range(cols.shape[0]):
            j = cols[k]
            new = P[t, k] >= tau
            old = (row[j // WORD] >> np.uint64(j % WORD)) & _ONE != _ZERO
            if new != old:
                _set_bit(row, off, j, new)
                counts[t] += 1 if new else -1


@njit(cache=True)
def _report(row, off, out, pos, tree):
    """Write ``(tree, j)`` for every set leaf ``j`` of one tree, ``j`` increasing."""
    h = off.shape[0] - 1
    pending = np.empty(h, dtype=np.uint64)  # bits of the current word not yet visited
    base = np.empty(h, dtype=np.int64)  # index of that word within its level
    lvl = h - 1
    pending[lvl] = row[off[lvl]]
    base[lvl] = 0
    while lvl < h:
        w = pending[lvl]
        if w == _ZERO:
            lvl += 1
            continue
        pending[lvl] = w & (w - _ONE)
        idx = base[lvl] * WORD + np.int64(trailing_zeros(w))
        if lvl == 0:
            out[pos, 0] = tree
            out[pos, 1] = idx
            pos += 1
        else:
            lvl -= 1
            pending[lvl] = row[off[lvl] + idx]
            base[lvl] = idx
    return pos


@njit(cache=True, parallel=True)
def fill_pairs(bits, off, indptr, out):
    """Write the set leaves of tree ``t`` as pairs to ``out[indptr[t]:indptr[t + 1]]``."""
    for t in prange(bits.shape[0]):
        _report(bits[t], off, out, indptr[t], t)
