"""Interleaved updates and queries on all three structures against a naive model."""

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from naive import at_least, firing_pairs

import corrtree as ct

SIZES = st.sampled_from([1, 2, 3, 5, 16, 17, 31, 258])
ENTRY = st.integers(-3, 3)
B = 1.0


class CorrelationStructures(RuleBasedStateMachine):
    """Naive model: the matrices X and W; every structure must agree with them."""

    @initialize(n=SIZES, m=SIZES, d=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
    def build(self, n, m, d, seed):
        rng = np.random.default_rng(seed)
        self.X = rng.integers(-3, 4, (n, d)).astype(float)
        self.W = rng.integers(-3, 4, (m, d)).astype(float)
        self.dtree = ct.CorrelationDTree(self.X, self.W)
        self.wtree = ct.CorrelationWTree(self.X, self.W)
        self.det = ct.FiringDetector(self.X, self.W, B, limit=None)

    @property
    def U(self):
        return self.X @ self.W.T  # exact for integer entries

    @rule(data=st.data())
    def update(self, data):
        m, d = self.W.shape
        r = data.draw(st.integers(0, m - 1))
        z = np.array(data.draw(st.lists(ENTRY, min_size=d, max_size=d)), float)
        self.W[r] = z
        self.dtree.update(r, z)
        self.wtree.update(r, z)
        self.det.update(r, z)

    @rule(data=st.data())
    def update_many(self, data):
        m, d = self.W.shape
        rs = np.array(data.draw(st.lists(st.integers(0, m - 1), min_size=0, max_size=6)), np.int64)
        Z = np.array(
            data.draw(
                st.lists(
                    st.lists(ENTRY, min_size=d, max_size=d), min_size=len(rs), max_size=len(rs)
                )
            ),
            float,
        ).reshape(len(rs), d)
        for r, z in zip(rs, Z, strict=True):
            self.W[r] = z
        self.dtree.update_many(rs, Z)
        self.wtree.update_many(rs, Z)
        self.det.update_many(rs, Z)

    @rule(data=st.data(), tau=st.integers(-8, 8))
    def query(self, data, tau):
        U = self.U
        i = data.draw(st.integers(0, U.shape[0] - 1))
        r = data.draw(st.integers(0, U.shape[1] - 1))
        np.testing.assert_array_equal(self.dtree.query(i, tau / 2), at_least(U[i], tau / 2))
        np.testing.assert_array_equal(self.wtree.query(r, tau / 2), at_least(U[:, r], tau / 2))

    @rule(tau=st.integers(-8, 8))
    def query_all(self, tau):
        U = self.U
        for tree, rows in ((self.dtree, U), (self.wtree, U.T)):
            indptr, indices = tree.query_all(tau / 2)
            for t in range(rows.shape[0]):
                np.testing.assert_array_equal(
                    indices[indptr[t] : indptr[t + 1]], at_least(rows[t], tau / 2)
                )

    @rule()
    def detector_query(self):
        np.testing.assert_array_equal(self.det.query(), firing_pairs(self.X, self.W, B))

    @precondition(lambda self: hasattr(self, "X"))
    @invariant()
    def maxima(self):
        U = self.U
        for i in range(U.shape[0]):
            assert self.dtree.max(i) == U[i].max()
        for r in range(U.shape[1]):
            assert self.wtree.max(r) == U[:, r].max()
        np.testing.assert_array_equal(self.dtree.W, self.W)
        np.testing.assert_array_equal(self.wtree.W, self.W)


CorrelationStructures.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None
)
TestCorrelationStructures = CorrelationStructures.TestCase
