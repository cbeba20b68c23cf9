"""A binary min-heap of ``(key, neuron)`` in flat arrays: the kernel trainer's
schedule of when each neuron must be looked at again.  Ties break by neuron, so
the order is deterministic."""

from __future__ import annotations

import numpy as np

from .. import _config
from .._jit import njit
from ._pool import KEY

__all__ = ["heap_pop", "heap_push", "heapify", "pop_due", "push_all"]

_BULK_DIV = _config.HEAP_BULK_DIV


@njit(cache=True)
def _less(keys, ids, i, j):
    return keys[i] < keys[j] or (keys[i] == keys[j] and ids[i] < ids[j])


@njit(cache=True)
def heap_push(keys, ids, size, key, r):
    i = size
    keys[i] = key
    ids[i] = r
    while i > 0:
        parent = (i - 1) // 2
        if _less(keys, ids, i, parent):
            keys[i], keys[parent] = keys[parent], keys[i]
            ids[i], ids[parent] = ids[parent], ids[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _sift_down(keys, ids, size, i):
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _less(keys, ids, left + 1, left):
            child = left + 1
        if _less(keys, ids, child, i):
            keys[i], keys[child] = keys[child], keys[i]
            ids[i], ids[child] = ids[child], ids[i]
            i = child
        else:
            break


@njit(cache=True)
def heapify(keys, ids, size):
    """Make ``keys[:size]`` a heap in O(size)."""
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(keys, ids, size, i)


@njit(cache=True)
def heap_pop(keys, ids, size):
    """Remove the top; returns the new size (the popped id is ``ids[size - 1]`` before)."""
    size -= 1
    keys[0], keys[size] = keys[size], keys[0]
    ids[0], ids[size] = ids[size], ids[0]
    _sift_down(keys, ids, size, 0)
    return size


@njit(cache=True)
def _count_due(keys, size, limit, cap):
    """``min(cap, number of keys <= limit)``, visiting only those nodes: O(result)."""
    if size == 0 or keys[0] > limit:
        return 0
    stack = np.empty(cap + 2, dtype=np.int64)
    stack[0] = 0
    top = 1
    count = 0
    while top > 0:
        top -= 1
        i = stack[top]
        count += 1
        if count >= cap:
            break
        for c in (2 * i + 1, 2 * i + 2):
            if c < size and keys[c] <= limit:
                stack[top] = c
                top += 1
    return count


@njit(cache=True)
def pop_due(keys, ids, size, limit):
    """Pop every neuron whose key is ``<= limit``; returns (sorted neurons, new size).

    O(k log size) for k due neurons, or O(size) (a filter and a heapify) when
    k > size/HEAP_BULK_DIV, whichever is less.
    """
    cap = size // _BULK_DIV + 1
    if _count_due(keys, size, limit, cap) < cap:
        k = 0
        due = np.empty(cap, dtype=np.int64)
        while size > 0 and keys[0] <= limit:
            due[k] = ids[0]
            k += 1
            size = heap_pop(keys, ids, size)
    else:
        due = np.empty(size, dtype=np.int64)
        k = 0
        keep = 0
        for i in range(size):
            if keys[i] <= limit:
                due[k] = ids[i]
                k += 1
            else:
                keys[keep] = keys[i]
                ids[keep] = ids[i]
                keep += 1
        size = keep
        heapify(keys, ids, size)
    due = due[:k].copy()
    due.sort()
    return due, size


@njit(cache=True)
def push_all(keys, ids, size, rows, nf):
    """Push the neurons of ``rows`` with a finite key: one by one, or appended and
    heapified (O(size)) when they are more than size/HEAP_BULK_DIV."""
    bulk = rows.shape[0] > size // _BULK_DIV
    for k in range(rows.shape[0]):
        key = nf[rows[k], KEY]
        if np.isfinite(key):
            if bulk:
                keys[size] = key
                ids[size] = rows[k]
                size += 1
            else:
                size = heap_push(keys, ids, size, key, rows[k])
    if bulk:
        heapify(keys, ids, size)
    return size
