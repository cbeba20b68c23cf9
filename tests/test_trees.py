"""CorrelationDTree and CorrelationWTree against brute force."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from naive import at_least, dtree_query, wtree_query

import corrtree as ct

TREES = [ct.CorrelationDTree, ct.CorrelationWTree]


def _int_matrix(rows, cols):
    return hnp.arrays(np.int64, (rows, cols), elements=st.integers(-3, 3))


@st.composite
def instances(draw):
    n = draw(st.sampled_from([1, 2, 3, 7, 16, 17, 40]))
    m = draw(st.sampled_from([1, 2, 5, 16, 17, 33, 300]))
    d = draw(st.integers(1, 4))
    X = draw(_int_matrix(n, d)).astype(float)
    W = draw(_int_matrix(m, d)).astype(float)
    tau = draw(st.integers(-6, 6)) / 2
    return X, W, tau


@given(instances())
def test_queries_match_brute_force(inst):
    X, W, tau = inst
    dt, wt = ct.CorrelationDTree(X, W), ct.CorrelationWTree(X, W)
    U = X @ W.T  # integer data: exact, so ties are exact
    for i in range(X.shape[0]):
        np.testing.assert_array_equal(dt.query(i, tau), dtree_query(X, W, i, tau))
        assert dt.max(i) == U[i].max()
    for r in range(W.shape[0]):
        np.testing.assert_array_equal(wt.query(r, tau), wtree_query(X, W, r, tau))
        assert wt.max(r) == U[:, r].max()
    for tree, rows in ((dt, U), (wt, U.T)):
        indptr, indices = tree.query_all(tau)
        assert indptr.dtype == indices.dtype == np.int64
        for t in range(rows.shape[0]):
            np.testing.assert_array_equal(
                indices[indptr[t] : indptr[t + 1]], at_least(rows[t], tau)
            )


@pytest.mark.parametrize("cls", TREES)
def test_real_valued_against_independent_products(cls):
    rng = np.random.default_rng(3)
    X, W = rng.standard_normal((37, 9)), rng.standard_normal((301, 9))
    tree = cls(X, W)
    U = np.einsum("id,rd->ir", X, W)
    tau = 0.7
    margin = np.abs(U - tau) > 1e-12  # ignore pairs a rounding error away from tau
    indptr, indices = tree.query_all(tau)
    rows = U if cls is ct.CorrelationDTree else U.T
    keep = margin if cls is ct.CorrelationDTree else margin.T
    for t in range(rows.shape[0]):
        got = np.zeros(rows.shape[1], bool)
        got[indices[indptr[t] : indptr[t + 1]]] = True
        np.testing.assert_array_equal(got[keep[t]], (rows[t] >= tau)[keep[t]])


@pytest.mark.parametrize("cls", TREES)
def test_updates_go_down_as_well_as_up(cls):
    X = np.eye(3)
    W = np.array([[5.0, 0, 0], [1.0, 0, 0], [0, 0, 1.0]])
    tree = cls(X, W)
    tree.update(0, [-5.0, 0.0, 0.0])
    if cls is ct.CorrelationDTree:
        assert tree.max(0) == 1.0
        assert tree.query(0, 1.0).tolist() == [1]
    else:
        assert tree.max(0) == 0.0
        assert tree.query(0, -5.0).tolist() == [0, 1, 2]
    np.testing.assert_array_equal(tree.W[0], [-5.0, 0, 0])


@pytest.mark.parametrize("cls", TREES)
def test_update_many_last_row_wins(cls):
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((6, 3)), rng.standard_normal((20, 3))
    a, b = cls(X, W), cls(X, W)
    rs = np.array([4, 7, 4, 19])
    Z = rng.standard_normal((4, 3))
    a.update_many(rs, Z)
    for r, z in zip(rs, Z, strict=True):
        b.update(r, z)
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.query_all(0.1)[1], b.query_all(0.1)[1])
    a.update_many(np.array([], dtype=np.int64), np.empty((0, 3)))


@pytest.mark.parametrize("cls", TREES)
def test_properties_are_read_only_copies(cls):
    X, W = np.ones((2, 3)), np.ones((4, 3))
    tree = cls(X, W)
    X[0, 0] = 7.0
    assert tree.X[0, 0] == 1.0
    with pytest.raises(ValueError):
        tree.W[0, 0] = 3.0
    assert (tree.n, tree.m, tree.d) == (2, 4, 3)
    assert tree.nbytes >= 8 * 2 * 4
    assert repr(tree).endswith("(n=2, m=4, d=3)")


@pytest.mark.parametrize("cls", TREES)
def test_infinite_thresholds(cls):
    X, W = np.eye(2), np.eye(2)
    tree = cls(X, W)
    assert tree.query(0, -np.inf).tolist() == [0, 1]
    assert tree.query(0, np.inf).tolist() == []


@pytest.mark.parametrize("cls", TREES)
@pytest.mark.parametrize(
    ("X", "W", "exc", "match"),
    [
        (np.ones(3), np.ones((2, 3)), ValueError, "X must be a 2-D"),
        (np.ones((2, 3)), np.ones((2, 3, 1)), ValueError, "W must be a 2-D"),
        (np.ones((2, 3)), np.ones((2, 4)), ValueError, "W has 4 columns but X has d=3"),
        (np.ones((0, 3)), np.ones((2, 3)), ValueError, "X must not be empty"),
        (np.ones((2, 3)), np.ones((0, 3)), ValueError, "W must not be empty"),
        (np.full((2, 3), np.nan), np.ones((2, 3)), ValueError, "X contains NaN"),
        (np.ones((2, 3)), np.full((2, 3), np.inf), ValueError, "W contains NaN or inf"),
        (np.array([["a", "b"]]), np.ones((2, 2)), ValueError, "X must have a real numeric"),
        (np.ones((2, 2), complex), np.ones((2, 2)), ValueError, "X must have a real numeric"),
    ],
)
def test_bad_construction(cls, X, W, exc, match):
    with pytest.raises(exc, match=match):
        cls(X, W)


@pytest.mark.parametrize("cls", TREES)
def test_too_large_for_memory(cls):
    X = np.broadcast_to(np.ones(1), (10**6, 1))  # no memory behind it
    W = np.broadcast_to(np.ones(1), (10**8, 1))
    with pytest.raises(MemoryError, match=r"n=1000000, m=100000000"):
        cls(X, W)


@pytest.mark.parametrize("cls", TREES)
def test_bad_calls(cls):
    tree = cls(np.ones((3, 2)), np.ones((4, 2)))
    n_trees = 3 if cls is ct.CorrelationDTree else 4
    name = "i" if cls is ct.CorrelationDTree else "r"
    with pytest.raises(IndexError, match=f"{name}={n_trees} is out of range"):
        tree.query(n_trees, 0.0)
    with pytest.raises(IndexError, match=f"{name}=-1 is out of range"):
        tree.max(-1)
    with pytest.raises(IndexError, match="integer index"):
        tree.query(1.0, 0.0)
    with pytest.raises(ValueError, match=r"tau must be a (finite )?real"):
        tree.query(0, np.nan)
    with pytest.raises(ValueError, match="tau must be a real number"):
        tree.query_all("1")
    with pytest.raises(IndexError, match="r=4 is out of range"):
        tree.update(4, [1.0, 2.0])
    with pytest.raises(ValueError, match="z must have length d=2"):
        tree.update(0, [1.0])
    with pytest.raises(ValueError, match="z contains NaN"):
        tree.update(0, [1.0, np.nan])
    with pytest.raises(IndexError, match="rs holds index 9"):
        tree.update_many([0, 9], np.ones((2, 2)))
    with pytest.raises(IndexError, match="rs must hold integer"):
        tree.update_many([0.5], np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"Z must have shape \(2, 2\)"):
        tree.update_many([0, 1], np.ones((3, 2)))
    with pytest.raises(ValueError, match="Z contains NaN"):
        tree.update_many([0], np.full((1, 2), np.inf))
    # nothing above changed the structure
    np.testing.assert_array_equal(tree.W, np.ones((4, 2)))
