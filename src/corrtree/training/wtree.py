"""The paper's TrainingWithProcessData: gradient descent on a Correlation WTree."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..trees import CorrelationWTree
from ._base import TreeTrainer, previous_fire, tree_schema
from ._sparse import outputs_from_products, transpose_csr
from .optim import LinearStep

__all__ = ["WTreeTrainer"]


class WTreeTrainer(TreeTrainer):
    """Algorithm TrainingWithProcessData of the paper.

    Preprocessing builds a :class:`~corrtree.CorrelationWTree` and queries
    every neuron at ``b`` for ``S̃_r``, from which ``S_i`` follows.  Every
    iteration: forward and gradient on the fired pairs (products read from the
    tree), then for every neuron ``r`` that moved: remove ``r`` from ``S_i``
    for ``i ∈ S̃_r``, update its tree (one batched ``update_many``: a GEMM of
    |moved|×d×n), query it again at ``b``, and add ``r`` to ``S_i`` for the
    new ``S̃_r``.  Every neuron of any ``S_i`` has moved, so the removals
    empty every ``S_i`` and the additions rebuild them: both are done at once
    by transposing the new ``S̃`` (a counting sort, O(n + Σ_r k̃_r)).  A
    neuron that did not move has an empty ``S̃_r`` before and after.
    """

    name = "wtree"
    SCHEMA = tree_schema(("m", "n"), "m1")

    def _prepare(self, W0: np.ndarray) -> None:
        self.tree = CorrelationWTree(self.X, W0)
        with self.timer("query"):
            self.fire_r = self.tree.query_all(self.b)  # S̃_r
            self.fire_i = transpose_csr(*self.fire_r, self.X.shape[0])  # S_i
        self.prev_fire_r: tuple[np.ndarray, np.ndarray] | None = None

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self.fire_r

    def outputs(self) -> np.ndarray:
        with self.timer("forward"):
            return outputs_from_products(
                *self.fire_i, self.tree.products, False, self.a, self.b, self.scale
            )

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        idx = self.fire_r[1]
        flips = self._flips(self.prev_fire_r, self.fire_r)
        moved = self._gradient_step(self.fire_r, err, step)
        with self.timer("query"):
            self.prev_fire_r = self.fire_r
            self.fire_r = self.tree.query_all(self.b)
            self.fire_i = transpose_csr(*self.fire_r, self.X.shape[0])
        return self._row(
            idx.shape[0], moved.shape[0], flips, evaluated_pairs=self.X.shape[0] * moved.shape[0]
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self._tree_state(self.prev_fire_r)

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        self.tree = CorrelationWTree.from_products(self.X, arrays["W"], arrays["V"])
        self.vel = arrays.get("vel")
        self.fire_r = self.tree.query_all(self.b)
        self.fire_i = transpose_csr(*self.fire_r, self.X.shape[0])
        self.prev_fire_r = previous_fire(arrays, self.X.shape[0])
