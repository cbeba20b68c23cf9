"""The dense reference: plain gradient descent with BLAS, in blocks of neurons."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from .._validation import available_memory
from ._base import Trainer, previous_fire
from ._sparse import count_changed, keys_to_csr
from ._state import Field, Scalar, Schema

__all__ = ["DenseTrainer"]


def auto_block(m: int, n: int, d: int, K: int) -> int:
    """Neurons per block so that a block's buffers take at most
    :data:`~corrtree._config.DENSE_BLOCK_MEMORY_SHARE` of free memory (capped).

    Per neuron a block holds the products, reused for the coefficients (8n
    bytes), the fire mask (n bytes) and the gradient (8d bytes).
    """
    budget = min(
        _config.DENSE_BLOCK_MAX_BYTES, int(available_memory() * _config.DENSE_BLOCK_MEMORY_SHARE)
    )
    rows = _config.block_rows(9 * n + 8 * d + 8 * K, m, budget)
    return max(min(m, _config.DENSE_MIN_BLOCK), rows)


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
    SCHEMA = Schema(
        1,
        (
            Field("W", ("f8",), ("m", "d")),
            Field("prev_indptr", ("i8",), ("m1",), optional=True),
            Field("prev_idx", ("i8",), ("nnz",), optional=True),
        ),
        (Scalar("block", int, 1, "m"),),
    )

    def _prepare(self, W0: np.ndarray, block: int | str = "auto") -> None:
        n, d = self.X.shape
        block = auto_block(self.m, n, d, self.a.shape[1]) if block == "auto" else int(block)
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._setup(np.array(W0), min(block, self.m), None)  # the trainer's own weights

    def _setup(
        self, W: np.ndarray, block: int, prev_fire: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        n, d = self.X.shape
        self.W = W  # trained in place
        self.block = block
        self.info["block"] = block
        self.U = np.empty((block, n))  # products, then coefficients
        self.M = np.empty((block, n), dtype=np.bool_)  # fire mask
        self.grad = np.empty((block, d))
        self.prev_fire = prev_fire
        self._forward()

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"W": self.W}
        if self.prev_fire is not None:
            arrays["prev_indptr"], arrays["prev_idx"] = self.prev_fire
        return arrays, {"block": self.block}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        self._setup(arrays["W"], scalars["block"], previous_fire(arrays, self.X.shape[0]))

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

    def outputs(self) -> np.ndarray:
        return self.u

    def advance(self, err: np.ndarray) -> dict[str, Any]:
        indptr, idx = self.fire
        flips = 0 if self.prev_fire is None else count_changed(*self.prev_fire, indptr, idx)
        c = self.eta_s
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
        self.prev_fire = self.fire
        self._forward()
        n = self.X.shape[0]
        return self._row(
            idx.shape[0], np.count_nonzero(np.diff(indptr)), flips, evaluated_pairs=n * self.m
        )

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return np.array(self.W[start:stop])
