"""The dense reference: plain gradient descent with BLAS, in blocks of neurons."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import available_memory
from ._base import Trainer
from ._sparse import count_changed, keys_to_csr

__all__ = ["DenseTrainer"]


def auto_block(m: int, n: int, d: int, K: int) -> int:
    """Neurons per block so that a block's arrays take at most ~1/4 of free memory (≤ 6 GiB).

    Per neuron a block holds the products and the coefficients (8n bytes
    each), the fire mask (n bytes) and the gradient (8d bytes).
    """
    per_neuron = 17 * n + 8 * d + 8 * K
    budget = min(6 * 2**30, available_memory() // 4)
    return int(max(64, min(m, budget // per_neuron)))


class DenseTrainer(Trainer):
    """Gradient descent exactly as written in the paper's Preliminaries.

    Per iteration and block of neurons: ``U = W_blk Xᵀ`` (GEMM), the fire mask
    ``U >= b``, the outputs; then the coefficients ``C = mask ∘ (a_blk errᵀ)``
    and ``W_blk -= lr/sqrt(m) · C X`` (GEMM).  Θ(nmd) per iteration; memory
    O(block·n) beyond W (plus the fired pairs, O(Σ_i k_i), for the
    statistics).  With a single block (the default when a block of all m
    neurons fits in a quarter of the free memory) the backward pass reuses
    the forward pass's fire mask: two GEMMs per iteration; with several
    blocks it recomputes the products: three.
    """

    name = "dense"

    def __init__(self, model, X, Y, G, block: int | str = "auto") -> None:
        super().__init__(model, X, Y, G)
        n, d = X.shape
        self.W = model._W  # trained in place
        self.block = auto_block(self.m, n, d, self.a.shape[1]) if block == "auto" else int(block)
        if self.block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.info["block"] = self.block
        self.prev_fire: tuple[np.ndarray, np.ndarray] | None = None
        self.kept: np.ndarray | None = None
        self._forward()

    def _products(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        U = self.W[s : s + self.block] @ self.X.T
        return U, U >= self.b

    def _forward(self) -> None:
        """Outputs, fire sets (sorted pair keys ``r·n + i``) of the current W."""
        n = self.X.shape[0]
        u = np.zeros((n, self.a.shape[1]))
        keys = []
        for s in range(0, self.m, self.block):
            with self.timer("forward"):
                U, M = self._products(s)
            with self.timer("query"):
                keys.append(np.flatnonzero(M) + s * n)
            with self.timer("forward"):
                if self.block >= self.m:
                    self.kept = M  # one block: the backward pass reuses the fire mask
                U -= self.b
                np.maximum(U, 0.0, out=U)
                u += U.T @ self.a[s : s + self.block]
        with self.timer("query"):
            self.fire = keys_to_csr(np.concatenate(keys), self.m, n)
        self.u = u * self.scale

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self.fire

    def step(self) -> dict[str, Any]:
        err, loss = self._loss(self.u)
        indptr, idx = self.fire
        flips = 0 if self.prev_fire is None else count_changed(*self.prev_fire, indptr, idx)
        c = self.lr * self.scale
        for s in range(0, self.m, self.block):
            with self.timer("backward"):
                M = self.kept if self.kept is not None else self._products(s)[1]
                C = self.a[s : s + self.block] @ err.T
                C *= M
                grad = C @ self.X
            with self.timer("update"):
                grad *= c
                self.W[s : s + self.block] -= grad
        self.kept = None
        row = {"loss": loss, "fired_pairs": int(idx.shape[0]),
               "moved_neurons": int(np.count_nonzero(np.diff(indptr))), "flips": flips,
               "band_pairs": 0, "reanchored": 0}
        self.prev_fire = self.fire
        self._forward()
        row.update(self.timer.pop())
        return row

    def final_loss(self) -> float:
        return self._loss(self.u)[1]
