"""Cost model behind ``method="auto"``: modelled seconds of a whole run.

Each method's time is ``preprocessing + iters × per-iteration``, counted in
BLAS flops (at :data:`BLAS_FLOPS` per second) and in scattered memory
operations of the numba kernels (at :data:`SPARSE_OPS` per second).  The
inputs are the sizes and the expected share ``q`` of firing pairs at
initialization (``Q(b/||x||)`` averaged over the data, for Gaussian
weights); a neuron moves in an iteration when it fires on some point,
which happens with probability ``1 - (1 - q)^n``.  The constants are round
numbers measured on a 2-core x86 machine; only their ratios matter for the
choice.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from .._validation import available_memory

__all__ = ["BLAS_FLOPS", "SPARSE_OPS", "estimate", "fire_share"]

BLAS_FLOPS = 5e10  # float64 GEMM, flop/s
SPARSE_OPS = 5e8  # gathers / scattered updates in numba kernels, per second
STREAM_OPS = 2e9  # streaming element-wise passes over arrays, elements per second
TREE_VISITS = 16  # values read per reported leaf or updated path in a blocked max tree


def fire_share(norms: np.ndarray, b: float) -> float:
    """Expected share of firing pairs for ``w ~ N(0, I)``: mean of ``Q(b / ||x_i||)``."""
    norms = np.asarray(norms, dtype=np.float64)
    with np.errstate(divide="ignore"):
        z = np.where(norms > 0, b / np.where(norms > 0, norms, 1.0), np.inf)
    return float(np.mean(norm.sf(z)))


def estimate(method: str, n: int, m: int, d: int, K: int, iters: int, q: float) -> float:
    """Modelled seconds of ``iters`` iterations of ``method`` (plus its preprocessing)."""
    pairs = q * n * m  # Σ_i k_i
    moved = m * (1.0 - (1.0 - q) ** n)
    gemm = 2.0 * n * m * d / BLAS_FLOPS
    sparse_grad = pairs * (d + K) / SPARSE_OPS  # forward and gradient on fired pairs
    if method == "dense":
        return iters * (2 * gemm + 4 * n * m / STREAM_OPS)
    if method == "dtree":
        update = gemm * moved / m + n * moved * TREE_VISITS / SPARSE_OPS
        query = pairs * TREE_VISITS / SPARSE_OPS + n * m / 16 / STREAM_OPS
        return gemm + n * m / STREAM_OPS + iters * (query + sparse_grad + update)
    if method == "wtree":
        update = gemm * moved / m + n * moved / STREAM_OPS
        query = pairs * TREE_VISITS / SPARSE_OPS + m / SPARSE_OPS
        return gemm + n * m / STREAM_OPS + iters * (query + sparse_grad + update)
    if method == "lazy":
        k = q * n  # fired points per neuron
        per_iter = moved * (k * k + 2 * k * (k + 1) + k * K) / SPARSE_OPS
        return gemm + n * m / STREAM_OPS + n * n * d / BLAS_FLOPS + iters * per_iter
    if method == "kernel":
        k = q * n
        if 8.0 * (n * K) ** 2 > 0.5 * available_memory():
            return float("inf")  # the NTK matrix does not fit
        pre = gemm / 2 + m * k * d * 2 / BLAS_FLOPS + m * k * k * K * K / SPARSE_OPS
        per_iter = 2 * (n * K) ** 2 / BLAS_FLOPS * 10 + 0.05 * moved * k * k / SPARSE_OPS
        return pre + n * m / STREAM_OPS + n * n * d / BLAS_FLOPS + iters * per_iter
    raise ValueError(f"no cost model for method {method!r}")
