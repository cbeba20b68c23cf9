"""The dense reference: plain gradient descent with BLAS, in blocks of neurons."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from .._validation import available_memory, check_memory
from ._base import Trainer, previous_fire
from ._sparse import count_changed, keys_to_csr
from ._state import Field, Scalar, Schema
from .optim import LinearStep, explicit_update

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
    iteration; with several blocks it recomputes the products: three.  With
    mini-batches (:meth:`batch_outputs`) the GEMMs are over the batch's points
    only, and a linear optimizer keeps its momentum buffers in ``vel``.
    """

    name = "dense"
    SCHEMA = Schema(
        1,
        (
            Field("W", ("f8",), ("m", "d")),
            Field("vel", ("f8",), ("m", "d"), optional=True),
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
        self._setup(np.array(W0), min(block, self.m), None, None)  # the trainer's own weights

    def _setup(
        self,
        W: np.ndarray,
        block: int,
        prev_fire: tuple[np.ndarray, np.ndarray] | None,
        vel: np.ndarray | None,
    ) -> None:
        self.W = W  # trained in place
        self.vel = vel  # momentum buffers of a linear optimizer
        self.block = block
        self.info["block"] = block
        self._buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.grad = np.empty((block, self.X.shape[1]))
        self.prev_fire = prev_fire
        self._batch: np.ndarray | None = None  # the points of the last batch_outputs
        self.u: np.ndarray | None = None  # outputs() and initial_fire_sets() compute them
        self.fire: tuple[np.ndarray, np.ndarray] | None = None

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"W": self.W}
        if self.vel is not None:
            arrays["vel"] = self.vel
        if self.prev_fire is not None:
            arrays["prev_indptr"], arrays["prev_idx"] = self.prev_fire
        return arrays, {"block": self.block}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        prev = previous_fire(arrays, self.X.shape[0])
        self._setup(arrays["W"], scalars["block"], prev, arrays.get("vel"))

    def _products(self, s: int, Xc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Products and fire mask of the block at ``s`` with the rows of ``Xc``."""
        cols = Xc.shape[0]
        if cols not in self._buffers:  # products (then coefficients) and the fire mask
            self._buffers[cols] = (
                np.empty((self.block, cols)),
                np.empty((self.block, cols), dtype=np.bool_),
            )
        blk = self.W[s : s + self.block]
        U, M = (buf[: blk.shape[0]] for buf in self._buffers[cols])
        np.dot(blk, Xc.T, out=U)
        np.greater_equal(U, self.b, out=M)
        return U, M

    def _forward(self, batch: np.ndarray | None = None) -> np.ndarray:
        """Outputs at the points ``batch`` (all: also the fire sets, sorted pair keys
        ``r·n + i``, kept in ``self.fire``)."""
        Xc = self.X if batch is None else self.X[batch]
        cols = Xc.shape[0]
        u = np.zeros((cols, self.a.shape[1]))
        keys = []
        fired = moved = 0
        for s in range(0, self.m, self.block):
            with self.timer("forward"):
                U, M = self._products(s, Xc)
            with self.timer("query"):
                if batch is None:
                    keys.append(np.flatnonzero(M) + s * cols)
                else:
                    fired += int(np.count_nonzero(M))
                    moved += int(np.count_nonzero(M.any(axis=1)))
            with self.timer("forward"):
                np.subtract(U, self.b, out=U)
                np.maximum(U, 0.0, out=U)
                u += U.T @ self.a[s : s + self.block]
        u *= self.scale
        if batch is None:
            with self.timer("query"):
                self.fire = keys_to_csr(np.concatenate(keys), self.m, cols)
            self.u = u
        else:
            self._batch, self._batch_stats = batch, (fired, moved)
        return u

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        if self.fire is None:
            self._forward()
        assert self.fire is not None  # a full forward pass sets it
        return self.fire

    def outputs(self) -> np.ndarray:
        if self.u is None:
            self._forward()
        assert self.u is not None
        return self.u

    def batch_outputs(self, batch: np.ndarray) -> np.ndarray:
        """Products with the batch only: ``m·|B|·d`` per call."""
        return self._forward(batch)

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        """A step on the batch of the last :meth:`batch_outputs` if there was one since
        the last step, else on every point (``err`` is zero outside the batch)."""
        batch, self._batch = self._batch, None
        if batch is None:
            indptr, idx = self.initial_fire_sets()  # this step's: the forward pass's
            Xc, errc = self.X, err
            flips = 0 if self.prev_fire is None else count_changed(*self.prev_fire, indptr, idx)
            fired, moved = idx.shape[0], int(np.count_nonzero(np.diff(indptr)))
        else:
            Xc, errc = self.X[batch], err[batch]
            (fired, moved), flips = self._batch_stats, 0
        # with a single block the mask of the forward pass is still in the buffers
        single = self.block >= self.m
        if step is not None and self.vel is None and step.mu:
            check_memory(self.W.nbytes, "the momentum buffers (m × d)")
            self.vel = np.zeros_like(self.W)
        for s in range(0, self.m, self.block):
            with self.timer("backward"):
                if single:
                    C, M = self._buffers[Xc.shape[0]]
                else:
                    C, M = self._products(s, Xc)
                np.dot(self.a[s : s + self.block], errc.T, out=C)
                np.multiply(C, M, out=C)
                grad = self.grad[: C.shape[0]]
                np.dot(C, Xc, out=grad)
            with self.timer("update"):
                W = self.W[s : s + self.block]
                if step is None:
                    grad *= self.eta_s
                    W -= grad
                else:
                    grad *= self.scale
                    V = None if self.vel is None else self.vel[s : s + self.block]
                    explicit_update(W, V, grad, step)  # type: ignore[arg-type]
        if batch is None:
            self.prev_fire = self.fire
        self.u = self.fire = None  # outputs() computes them when asked
        return self._row(fired, moved, flips, evaluated_pairs=Xc.shape[0] * self.m)

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return np.array(self.W[start:stop])
