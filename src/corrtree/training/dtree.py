"""The paper's TrainingWithPreprocessWeights: gradient descent on a Correlation DTree."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..trees import CorrelationDTree
from ._base import TreeTrainer, previous_fire, tree_schema
from ._sparse import outputs_from_products, transpose_csr
from .optim import LinearStep

__all__ = ["DTreeTrainer"]


class DTreeTrainer(TreeTrainer):
    """Algorithm TrainingWithPreprocessWeights of the paper.

    Preprocessing builds a :class:`~corrtree.CorrelationDTree` over ``X`` and
    ``W(0)``.  Every iteration queries every ``x_i`` at ``b`` (the fire sets
    ``S_i``), runs the forward pass and the gradient on the fired pairs only,
    using the products the tree stores (O(Σ_i k_i) and O(d·Σ_i k_i)), and
    updates the tree for every neuron that moved with one batched
    ``update_many`` (a GEMM of n×d×|moved| and the tree paths).  Since nearly
    every neuron moves once ``n·Q(b) >> 1``, the update costs about as much as
    a dense iteration.
    """

    name = "dtree"
    SCHEMA = tree_schema(("n", "m"), "n1")

    def _prepare(self, W0: np.ndarray) -> None:
        self.tree = CorrelationDTree(self.X, W0)
        self.fire_i: tuple[np.ndarray, np.ndarray] | None = None  # S_i of the current W
        self.prev_fire_i: tuple[np.ndarray, np.ndarray] | None = None

    def _query(self) -> tuple[np.ndarray, np.ndarray]:
        if self.fire_i is None:
            with self.timer("query"):
                self.fire_i = self.tree.query_all(self.b)
        return self.fire_i

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return transpose_csr(*self._query(), self.m)

    def outputs(self) -> np.ndarray:
        indptr, idx = self._query()
        with self.timer("forward"):
            return outputs_from_products(
                indptr, idx, self.tree.products, True, self.a, self.b, self.scale
            )

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        indptr, idx = self._query()
        flips = self._flips(self.prev_fire_i, (indptr, idx))
        with self.timer("backward"):
            fire_r = transpose_csr(indptr, idx, self.m)
        moved = self._gradient_step(fire_r, err, step)
        self.prev_fire_i, self.fire_i = self.fire_i, None
        return self._row(
            idx.shape[0], moved.shape[0], flips, evaluated_pairs=self.X.shape[0] * moved.shape[0]
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self._tree_state(self.prev_fire_i)

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        self.tree = CorrelationDTree.from_products(self.X, arrays["W"], arrays["V"])
        self.vel = arrays.get("vel")
        self.fire_i = None
        self.prev_fire_i = previous_fire(arrays, self.m)
