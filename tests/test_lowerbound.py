"""The lower-bound reduction against brute force."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from corrtree.lowerbound import max_inner_product, orthogonal_vectors


@st.composite
def integer_pairs(draw):
    n = draw(st.integers(1, 12))
    m = draw(st.integers(1, 12))
    d = draw(st.integers(1, 5))
    elems = st.integers(-6, 6)
    X = draw(hnp.arrays(np.int64, (n, d), elements=elems))
    Y = draw(hnp.arrays(np.int64, (m, d), elements=elems))
    return X, Y


@given(integer_pairs())
def test_max_inner_product_matches_brute_force(inst):
    X, Y = inst
    res = max_inner_product(X, Y)
    P = X @ Y.T
    assert res.value == P.max()
    i, j = res.witness
    assert P[i, j] == res.value
    # the lexicographically smallest maximizing pair
    assert (i, j) == tuple(np.argwhere(P == P.max())[0])
    B = int(np.abs(X).sum(axis=1).max() * np.abs(Y).max())
    assert res.rounds <= math.ceil(math.log2(2 * B + 1))
    assert res.queries == res.rounds + 1
    assert res.updates == (res.rounds + 1) * X.shape[0]


@pytest.mark.parametrize(
    ("X", "Y", "value"),
    [
        (np.ones((4, 3)), np.ones((5, 3)), 3),  # all equal: every pair ties
        (-np.ones((2, 2)), np.ones((3, 2)), -2),  # only negative products
        ([[5]], [[-3]], -15),  # d = 1, a single vector each
        (np.zeros((3, 2)), np.zeros((2, 2)), 0),
        ([[2**19, 0]], [[4, 1]], 2**21),
    ],
)
def test_adversarial_instances(X, Y, value):
    assert max_inner_product(X, Y).value == value


def test_float_integers_accepted_and_bad_input():
    assert max_inner_product(np.array([[1.0, 2.0]]), [[3, 4]]).value == 11
    with pytest.raises(ValueError, match="X must hold integers"):
        max_inner_product([[0.5]], [[1]])
    with pytest.raises(ValueError, match="Y has 2 columns but X has d=1"):
        max_inner_product([[1]], [[1, 2]])
    with pytest.raises(ValueError, match="NaN"):
        max_inner_product([[np.nan]], [[1]])
    with pytest.raises(ValueError, match="beyond"):
        max_inner_product([[2**30]], [[1]])
    with pytest.raises(ValueError, match="X must not be empty"):
        max_inner_product(np.zeros((0, 2)), [[1, 2]])


@given(st.integers(1, 10), st.integers(1, 10), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_orthogonal_vectors_matches_brute_force(n, m, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 2, (n, d))
    Y = rng.integers(0, 2, (m, d))
    pair = orthogonal_vectors(X, Y)
    brute = np.argwhere(X @ Y.T == 0)
    if len(brute) == 0:
        assert pair is None
    else:
        assert pair == tuple(brute[0])


def test_orthogonal_vectors_rejects_non_binary():
    with pytest.raises(ValueError, match="X must hold only 0 and 1"):
        orthogonal_vectors([[2, 0]], [[1, 0]])
