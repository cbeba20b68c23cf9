"""The dense reference: plain gradient descent with BLAS, in blocks of neurons."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import available_memory
from ._base import Trainer
from ._sparse import count_changed, keys_to_csr

__all__ = ["DenseTrainer"]


def auto_block(m: int, n: int, d: int, K: int) -> int:
    """Neurons per block so that a block's buffers take at most ~1/4 of free memory (≤ 6 GiB).

    Per neuron a block holds the products, reused for the coefficients (8n
    bytes), the fire mask (n bytes) and the gradient (8d bytes).
    """
    per_neuron = 9 * n + 8 * d + 8 * K
    budget = min(6 * 2**30, available_memory() // 4)
    return int(max(64, min(m, budget // per_neuron)))


class DenseTrainer(Trainer):
    """Gradient descent exactly as written in the paper's Preliminaries.

    Per iteration and block of neurons: ``U = W_blk Xᵀ`` (GEMM), the fire mask
    ``U >= b``, the outputs; then the coefficients ``C = mask ∘ (a_blk errᵀ)``
    and ``W_blk -= lr/sqrt(m) · C X`` (GEMM), all in preallocated buffers.
    Θ(nmd) per iteration; memory O(block·(n + d)) beyond W (plus the fired
    pairs, O(Σ_i k_i), for the statistics).  With a single block (the default
    when a block of all m neurons fits in a quarter of the free memory) the
    backward pass reuses the forward pass's fire mask: two GEMMs per
    iteration; with several blocks it recomputes the products: three.
    """

    name = "dense"

    def __init__(self, model, X, Y, G, block: int | str = "auto") -> None:
        super().__init__(model, X, Y, G)
        n, d = X.shape
        self.W = model._W  # trained in place
        self.block = auto_block(self.m, n, d, self.a.shape[1]) if block == "auto" else int(block)
        if self.block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = min(self.block, self.m)
        self.info["block"] = self.block
        self.U = np.empty((self.block, n))  # products, then coefficients
        self.M = np.empty((self.block, n), dtype=np.bool_)  # fire mask
        self.grad = np.empty((self.block, d))
        self.prev_fire: tuple[np.ndarray, np.ndarray] | None = None
        self._forward()

    def _products(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        blk = self.W[s : s + self.block]
        U, M = self.U[: blk.shape[0]], self.M[: blk.shape[0]]
        np.dot(blk, self.X.T, out=U)
        np.greater_equal(U, self.b, out=M)
        return U, M

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
                np.subtract(U, self.b, out=U)
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
        single = self.block >= self.m  # the mask of the forward pass is still in self.M
        for s in range(0, self.m, self.block):
            with self.timer("backward"):
                if single:
                    C, M = self.U, self.M
                else:
                    C, M = self._products(s)
                np.dot(self.a[s : s + self.block], err.T, out=C)
                np.multiply(C, M, out=C)
                grad = self.grad[: C.shape[0]]
                np.dot(C, self.X, out=grad)
            with self.timer("update"):
                grad *= c
                self.W[s : s + self.block] -= grad
        row = {"loss": loss, "fired_pairs": int(idx.shape[0]),
               "moved_neurons": int(np.count_nonzero(np.diff(indptr))), "flips": flips,
               "band_pairs": 0, "reanchored": 0}
        self.prev_fire = self.fire
        self._forward()
        row.update(self.timer.pop())
        return row

    def final_loss(self) -> float:
        return self._loss(self.u)[1]
