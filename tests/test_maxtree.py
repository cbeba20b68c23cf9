"""The blocked max-tree kernels against their definition."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from naive import at_least

from corrtree import _maxtree


def _tree(V):
    off = _maxtree.level_offsets(V.shape[1])
    inner = np.empty((V.shape[0], int(off[-1])))
    _maxtree.build(V, inner, off)
    return off, inner


def _check_invariant(V, inner, off):
    """Every internal node is the exact max of its children."""
    B = _maxtree.BRANCH
    for t in range(V.shape[0]):
        child = V[t]
        for lvl in range(off.shape[0] - 1):
            level = inner[t, off[lvl] : off[lvl + 1]]
            expect = [child[j * B : (j + 1) * B].max() for j in range(level.shape[0])]
            np.testing.assert_array_equal(level, expect)
            child = level
        assert child.shape == (1,)


@pytest.mark.parametrize("L", [1, 2, 15, 16, 17, 255, 256, 257, 4097])
def test_level_sizes_and_memory(L):
    off = _maxtree.level_offsets(L)
    sizes = np.diff(off)
    assert sizes[-1] == 1
    assert sizes[0] == -(-L // _maxtree.BRANCH)
    # internal levels cost at most 1/8 of the leaves (beyond a one-node floor)
    assert off[-1] <= max(L / 8, 1) + off.shape[0]


def test_level_offsets_rejects_empty():
    with pytest.raises(ValueError, match="at least one leaf"):
        _maxtree.level_offsets(0)


@given(
    st.integers(1, 4),
    st.integers(1, 300),
    st.integers(0, 2**32 - 1),
)
def test_build_update_report(T, L, seed):
    rng = np.random.default_rng(seed)
    V = rng.integers(-4, 5, size=(T, L)).astype(float)
    off, inner = _tree(V)
    _check_invariant(V, inner, off)
    for _ in range(5):
        cols = rng.integers(0, L, size=rng.integers(1, 6))
        P = rng.integers(-6, 7, size=(T, cols.shape[0])).astype(float)
        _maxtree.set_columns(V, inner, off, cols, P)
        for k, c in enumerate(cols):  # sequential semantics: last write wins
            V_ref_col = P[:, k]
            last = np.flatnonzero(cols == c)[-1]
            if k == last:
                np.testing.assert_array_equal(V[:, c], V_ref_col)
        _check_invariant(V, inner, off)
        np.testing.assert_array_equal(
            _maxtree.count_all(V, inner, off, 1.0), (V >= 1.0).sum(axis=1)
        )
        for tau in (-5.0, 0.0, 1.0, 4.0, 7.0):
            for t in range(T):
                np.testing.assert_array_equal(
                    _maxtree.query_row(V, inner, off, t, tau), at_least(V[t], tau)
                )


def test_decreasing_max_leaf_is_forgotten():
    """The paper's ``max(parent, leaf)`` update would keep 9 as the maximum."""
    V = np.array([[1.0, 9.0, 2.0] + [0.0] * 40])
    off, inner = _tree(V)
    _maxtree.set_columns(V, inner, off, np.array([1]), np.array([[-3.0]]))
    assert inner[0, off[-2]] == 2.0
    assert _maxtree.query_row(V, inner, off, 0, 5.0).size == 0


def test_set_rows_rebuilds():
    rng = np.random.default_rng(1)
    V = rng.standard_normal((5, 40))
    off, inner = _tree(V)
    P = rng.standard_normal((2, 40))
    _maxtree.set_rows(V, inner, off, np.array([4, 1]), P)
    np.testing.assert_array_equal(V[[4, 1]], P)
    _check_invariant(V, inner, off)


def test_fill_all_pairs_layout():
    V = np.array([[0.0, 2.0, 3.0], [5.0, -1.0, 2.0]])
    off, inner = _tree(V)
    counts = _maxtree.count_all(V, inner, off, 2.0)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty((indptr[-1], 2), dtype=np.int64)
    _maxtree.fill_all(V, inner, off, 2.0, indptr, out)
    assert out.tolist() == [[0, 1], [0, 2], [1, 0], [1, 2]]
