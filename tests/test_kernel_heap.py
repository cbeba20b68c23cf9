"""The kernel trainer's heap of neurons keyed by certificate expiry, against sorting."""

import numpy as np
import pytest

from corrtree.training._heap import pop_due, push_all
from corrtree.training._pool import KEY


def _is_heap(keys, ids, size):
    for i in range(1, size):
        p = (i - 1) // 2
        assert (keys[p], ids[p]) <= (keys[i], ids[i])


@pytest.mark.parametrize("share", [0.0, 0.01, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_pop_due_and_push_all(share, seed):
    """Few due neurons (popped one by one) and many (filtered and heapified) give the
    same answer as sorting; ties and infinite keys included."""
    rng = np.random.default_rng(seed)
    m = 3000
    nf = np.zeros((m, KEY + 1))
    nf[:, KEY] = rng.integers(0, 1000, m) / 10.0  # many ties
    nf[rng.random(m) < 0.1, KEY] = np.inf  # never due: not pushed
    keys, ids = np.empty(m), np.empty(m, dtype=np.int64)
    size = push_all(keys, ids, 0, np.arange(m), nf)
    finite = np.flatnonzero(np.isfinite(nf[:, KEY]))
    assert size == finite.shape[0]
    _is_heap(keys, ids, size)
    limit = np.quantile(nf[finite, KEY], share) if share > 0 else -1.0
    due, size = pop_due(keys, ids, size, limit)
    expect = finite[nf[finite, KEY] <= limit]
    np.testing.assert_array_equal(due, expect)
    _is_heap(keys, ids, size)
    assert np.array_equal(np.sort(ids[:size]), np.setdiff1d(finite, expect))
    # the due neurons come back with new keys, some of them due at once
    nf[due, KEY] = limit + rng.integers(0, 3, due.shape[0])
    size = push_all(keys, ids, size, due, nf)
    _is_heap(keys, ids, size)
    again, size = pop_due(keys, ids, size, limit)
    np.testing.assert_array_equal(again, due[nf[due, KEY] <= limit])
    _is_heap(keys, ids, size)
