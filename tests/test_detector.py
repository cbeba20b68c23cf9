"""FiringDetector (DDFN) against brute force."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from naive import firing_pairs

import corrtree as ct


@given(st.integers(1, 20), st.integers(1, 40), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_query_after_updates(n, m, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.integers(-2, 3, (n, d)).astype(float)
    Y = rng.integers(-2, 3, (m, d)).astype(float)
    det = ct.FiringDetector(X, Y, b=1.0, limit=None)
    for _ in range(4):
        js = rng.integers(0, m, rng.integers(1, 4))
        Z = rng.integers(-2, 3, (js.shape[0], d)).astype(float)
        det.update_many(js, Z)
        for j, z in zip(js, Z, strict=True):
            Y[j] = z
        q = det.query()
        assert q.dtype == np.int64 and q.shape[1] == 2
        np.testing.assert_array_equal(q, firing_pairs(X, Y, 1.0))
        assert det.count() == q.shape[0]
        np.testing.assert_array_equal(det.counts, np.bincount(q[:, 0], minlength=n))


def test_limit_auto_and_too_many():
    X, Y = np.ones((4, 1)), np.ones((32, 1))
    det = ct.FiringDetector(X, Y, b=0.5)
    assert det.limit == math.ceil(32**0.8 * 4)
    with pytest.raises(ct.TooManyFiring) as info:
        det.query()
    assert info.value.limit == det.limit and info.value.count == 128
    det.update_many(np.arange(20), -np.ones((20, 1)))
    assert det.query().shape == (48, 2)


def test_limit_exact_boundary():
    det = ct.FiringDetector(np.ones((2, 1)), np.ones((3, 1)), b=1.0, limit=6)
    assert det.query().shape == (6, 2)
    det = ct.FiringDetector(np.ones((2, 1)), np.ones((3, 1)), b=1.0, limit=5)
    with pytest.raises(ct.TooManyFiring, match="6 pairs fire, more than the limit of 5"):
        det.query()


def test_reduction_style_ties():
    """Ties fire: <x, y> == b is reported."""
    det = ct.FiringDetector(np.array([[2.0, 1.0]]), np.array([[1.0, -2.0], [1.0, 0.0]]), b=0.0)
    assert det.query().tolist() == [[0, 0], [0, 1]]


def test_properties_and_bad_input():
    det = ct.FiringDetector(np.eye(2), np.eye(2), 0.5, limit=None)
    assert (det.n, det.m, det.d, det.b, det.limit) == (2, 2, 2, 0.5, None)
    with pytest.raises(ValueError, match="b must be a finite"):
        ct.FiringDetector(np.eye(2), np.eye(2), np.nan)
    with pytest.raises(ValueError, match="limit must be an integer"):
        ct.FiringDetector(np.eye(2), np.eye(2), 0.5, limit="many")
    with pytest.raises(ValueError, match="limit must be >= 0"):
        ct.FiringDetector(np.eye(2), np.eye(2), 0.5, limit=-1)
    with pytest.raises(IndexError, match="j=2 is out of range"):
        det.update(2, [0.0, 0.0])
    with pytest.raises(IndexError, match="js holds index -1"):
        det.update_many([-1], [[0.0, 0.0]])
    with pytest.raises(ValueError, match="Y contains NaN"):
        ct.FiringDetector(np.eye(2), np.full((2, 2), np.nan), 0.5)
    with pytest.raises(ValueError, match="Y has 3 columns but X has d=2"):
        ct.FiringDetector(np.eye(2), np.ones((2, 3)), 0.5)
