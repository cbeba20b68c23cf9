"""Numba kernels for many blocked max trees over the rows of one 2-D array.

Layout
------
Tree ``t`` has its leaves in row ``t`` of a value array ``V`` (shape ``(T, L)``)
and its internal nodes in row ``t`` of ``inner`` (shape ``(T, S)``).  A node of
level 1 holds the maximum of a block of ``BRANCH`` consecutive leaves, a node of
level ``k + 1`` the maximum of ``BRANCH`` consecutive nodes of level ``k``, up
to a single root.  Level ``k + 1`` occupies ``inner[t, off[k]:off[k + 1]]``
(see :func:`level_offsets`), so the internal levels cost about
``L / (BRANCH - 1)`` values per tree (1/15 of the leaves for ``BRANCH = 16``)
and every scan reads contiguous memory.

Every update recomputes each ancestor from its children (never
``max(parent, leaf)``, which leaves a stale maximum when a leaf decreases) and
stops as soon as an ancestor keeps its value.  Reporting is an iterative
depth-first walk that enters only nodes whose maximum is ``>= tau``; it visits
``O(output * BRANCH * depth)`` values and emits indices in increasing order.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ._jit import njit

BRANCH = 16


def level_offsets(n_leaves: int, branch: int = BRANCH) -> np.ndarray:
    """Offsets of the internal levels of a ``branch``-ary tree over ``n_leaves``.

    Returns ``off`` (int64, length ``h + 1``): level ``k + 1`` (``k = 0`` is
    the level of one node per ``branch`` leaves) is stored at
    ``[off[k], off[k + 1])``; the last level has a single node, the root.
    """
    if n_leaves < 1:
        raise ValueError(f"a tree needs at least one leaf, got {n_leaves}")
    sizes = []
    s = int(n_leaves)
    while True:
        s = -(-s // branch)
        sizes.append(s)
        if s == 1:
            break
    off = np.zeros(len(sizes) + 1, dtype=np.int64)
    off[1:] = np.cumsum(sizes)
    return off


@njit(cache=True, inline="always")
def _block_max(a, lo, hi):
    best = a[lo]
    for k in range(lo + 1, hi):
        if a[k] > best:
            best = a[k]
    return best


@njit(cache=True)
def _build_row(v, node, off):
    n_leaves = v.shape[0]
    for j in range(off[1]):
        lo = j * BRANCH
        node[j] = _block_max(v, lo, min(lo + BRANCH, n_leaves))
    for lvl in range(1, off.shape[0] - 1):
        base = off[lvl - 1]
        n_child = off[lvl] - base
        for j in range(off[lvl + 1] - off[lvl]):
            lo = j * BRANCH
            node[off[lvl] + j] = _block_max(node, base + lo, base + min(lo + BRANCH, n_child))


@njit(cache=True, parallel=True)
def build(V, inner, off):
    """Build every tree from its leaves; O(T * L)."""
    for t in prange(V.shape[0]):
        _build_row(V[t], inner[t], off)


@njit(cache=True, parallel=True)
def set_rows(V, inner, off, rows, P):
    """Replace the leaves of trees ``rows`` (distinct) by ``P`` and rebuild them."""
    for k in prange(rows.shape[0]):
        t = rows[k]
        V[t, :] = P[k, :]
        _build_row(V[t], inner[t], off)


@njit(cache=True)
def _fix_path(v, node, off, leaf):
    """Recompute the ancestors of ``leaf`` from their children, bottom up."""
    j = leaf // BRANCH
    lo = j * BRANCH
    val = _block_max(v, lo, min(lo + BRANCH, v.shape[0]))
    if node[j] == val:
        return
    node[j] = val
    for lvl in range(1, off.shape[0] - 1):
        j //= BRANCH
        base = off[lvl - 1]
        lo = j * BRANCH
        val = _block_max(node, base + lo, base + min(lo + BRANCH, off[lvl] - base))
        if node[off[lvl] + j] == val:
            return
        node[off[lvl] + j] = val


@njit(cache=True, parallel=True)
def set_columns(V, inner, off, cols, P):
    """Set leaf ``cols[k]`` of every tree ``t`` to ``P[t, k]`` and fix the paths.

    Repeated columns are applied in order (the last one wins).
    O(T * len(cols) * BRANCH * depth).
    """
    for t in prange(V.shape[0]):
        v = V[t]
        node = inner[t]
        for k in range(cols.shape[0]):
            c = cols[k]
            new = P[t, k]
            if new != v[c]:
                v[c] = new
                _fix_path(v, node, off, c)


@njit(cache=True)
def report_row(v, node, off, tau, out, pos, stop, tree):
    """Emit every leaf index ``j`` of one tree with ``v[j] >= tau``, in increasing order.

    Level by level from the root, the children ``>= tau`` of the current
    frontier are appended (branch-free) to the next frontier.  If ``out`` is
    non-empty, leaf ``j`` is written to ``out[pos, -1]`` (and ``tree`` to
    ``out[pos, 0]`` when ``out`` has two columns), never at or past ``stop``;
    otherwise the leaves are only counted.  Returns the position after the
    last reported leaf.
    """
    n_leaves = v.shape[0]
    h = off.shape[0] - 1
    if node[off[h - 1]] < tau:
        return pos
    # A level never has more than off[1] nodes; +BRANCH for the unconditional
    # store of the branch-free append.
    cap = off[1] + BRANCH
    cur = np.empty(cap, dtype=np.int64)
    nxt = np.empty(cap, dtype=np.int64)
    cur[0] = 0
    n_cur = 1
    for lvl in range(h - 1, 0, -1):
        base = off[lvl - 1]
        n_child = off[lvl] - base
        n_nxt = 0
        for f in range(n_cur):
            lo = cur[f] * BRANCH
            for c in range(lo, min(lo + BRANCH, n_child)):
                nxt[n_nxt] = c
                n_nxt += node[base + c] >= tau
        cur, nxt = nxt, cur
        n_cur = n_nxt
    write = out.shape[0] > 0
    col = out.shape[1] - 1
    for f in range(n_cur):
        lo = cur[f] * BRANCH
        hi = min(lo + BRANCH, n_leaves)
        if not write:
            for j in range(lo, hi):
                pos += v[j] >= tau
        elif pos + BRANCH <= stop:  # room for unconditional stores
            for j in range(lo, hi):
                out[pos, 0] = tree
                out[pos, col] = j
                pos += v[j] >= tau
        else:
            for j in range(lo, hi):
                if v[j] >= tau:
                    out[pos, 0] = tree
                    out[pos, col] = j
                    pos += 1
    return pos


@njit(cache=True, parallel=True)
def count_all(V, inner, off, tau):
    """Number of leaves ``>= tau`` in every tree (output-sensitive)."""
    counts = np.empty(V.shape[0], dtype=np.int64)
    dummy = np.empty((0, 1), dtype=np.int64)
    for t in prange(V.shape[0]):
        counts[t] = report_row(V[t], inner[t], off, tau, dummy, 0, 0, t)
    return counts


@njit(cache=True, parallel=True)
def fill_all(V, inner, off, tau, indptr, out):
    """Write the leaves ``>= tau`` of tree ``t`` to ``out[indptr[t]:indptr[t + 1]]``."""
    for t in prange(V.shape[0]):
        report_row(V[t], inner[t], off, tau, out, indptr[t], indptr[t + 1], t)


@njit(cache=True)
def query_row(V, inner, off, t, tau):
    """Sorted int64 array of the leaves ``>= tau`` of tree ``t``."""
    dummy = np.empty((0, 1), dtype=np.int64)
    k = report_row(V[t], inner[t], off, tau, dummy, 0, 0, t)
    out = np.empty((k, 1), dtype=np.int64)
    report_row(V[t], inner[t], off, tau, out, 0, k, t)
    return out[:, 0]
