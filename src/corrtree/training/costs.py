"""Cost model behind ``method="auto"``: modelled seconds of a whole run.

Each method's time is ``preprocessing + iters × per-iteration``, counted in
BLAS flops (at :data:`BLAS_FLOPS` per second) and in scattered memory
operations of the numba kernels (at :data:`SPARSE_OPS` per second).  The
inputs are the sizes and the expected share ``q`` of firing pairs at
initialization (``Q(b/||x||)`` averaged over the data, for Gaussian
weights); a neuron moves in an iteration when it fires on some point,
which happens with probability ``1 - (1 - q)^n``.  The constants are round
numbers measured on a 2-core x86 machine (they are in :mod:`corrtree._config`, with
the reason for each); only their ratios matter for the choice.  The lazy and kernel
terms were calibrated on the five workloads of ``benchmarks/bench_workloads.py``
(per-visit and per-flip times, flips and re-anchorings from their ``History``): each of
their constants can be halved or doubled without changing any of the five choices, but
:data:`~corrtree._config.KERNEL_EVALUATION` doubled.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from .. import _config

__all__ = ["coherence", "estimate", "expected_flips", "fire_share", "memory_need"]


def fire_share(norms: np.ndarray, b: float) -> float:
    """Expected share of firing pairs for ``w ~ N(0, I)``: mean of ``Q(b / ||x_i||)``."""
    norms = np.asarray(norms, dtype=np.float64)
    with np.errstate(divide="ignore"):
        z = np.where(norms > 0, b / np.where(norms > 0, norms, 1.0), np.inf)
    return float(np.mean(ndtr(-z)))


def coherence(G: np.ndarray, sample: int = 256) -> float:
    """Mean ``|cos(x_i, x_j)|`` over a fixed sample of pairs ``i != j`` (0 for n = 1).

    About ``sqrt(2/(π d))`` for random directions, near 1 for data whose points
    all look alike; it sets how far a neuron's step moves its other products.
    """
    n = G.shape[0]
    if n < 2:
        return 0.0
    idx = np.linspace(0, n - 1, min(n, sample)).astype(np.int64)
    diag = np.sqrt(np.maximum(np.diag(G)[idx], 1e-300))
    C = np.abs(G[np.ix_(idx, idx)]) / diag[:, None] / diag[None, :]
    k = idx.shape[0]
    return float((C.sum() - np.trace(C)) / (k * (k - 1)))


def expected_flips(pairs: float, coh: float, k: float) -> float:
    """Flips per iteration of a run with ``pairs`` firing pairs, ``k`` a neuron, on data
    of :func:`coherence` ``coh`` (fitted to the five workloads' kernel runs: few on
    isotropic data, most where many neurons fire on points that look alike)."""
    x = coh * k
    return pairs * 0.002 * x / (1.0 + (x / _config.FLIP_SATURATION) ** 2)


def estimate(
    method: str,
    n: int,
    m: int,
    d: int,
    K: int,
    iters: int,
    q: float,
    q_band: float = 0.0,
    coh: float = 0.0,
) -> float:
    """Modelled seconds of ``iters`` iterations of ``method`` (plus its preprocessing).

    ``q_band`` is the share of pairs tracked by the lazy and kernel methods
    (products within the band of ``b``) and ``coh`` the data's
    :func:`coherence`: it sets the share of tracked pairs those methods must
    evaluate per step, the kernel trainer's visits and flips, and the neurons
    re-anchored in a run (most of them on isotropic data whose neurons fire on
    many points, few on coherent data).
    """
    pairs = q * n * m  # Σ_i k_i
    moved = m * (1.0 - (1.0 - q) ** n)
    gemm = 2.0 * n * m * d / _config.BLAS_FLOPS
    sparse_grad = pairs * (d + K) / _config.SPARSE_OPS  # forward and gradient on fired pairs
    if method == "dense":
        return iters * (
            2 * gemm + 4 * n * m * K / _config.BLAS_FLOPS + 4 * n * m / _config.STREAM_OPS
        )
    if method == "dtree":
        update = gemm * moved / m + n * moved * _config.TREE_VISITS / _config.SPARSE_OPS
        query = pairs * _config.TREE_VISITS / _config.SPARSE_OPS + n * m / 16 / _config.STREAM_OPS
        return gemm + n * m / _config.STREAM_OPS + iters * (query + sparse_grad + update)
    if method == "wtree":
        update = gemm * moved / m + n * moved / _config.STREAM_OPS
        query = pairs * _config.TREE_VISITS / _config.SPARSE_OPS + m / _config.SPARSE_OPS
        return gemm + n * m / _config.STREAM_OPS + iters * (query + sparse_grad + update)
    k = q * n  # fired points per neuron (≈ pairs that ever fired)
    tracked = max(q_band * n, k)
    expired = min(1.0, 0.05 + 0.5 * coh * k)  # share of other tracked pairs evaluated
    others = expired * (tracked - k)  # tracked pairs outside the prefix evaluated
    evaluate = min(k * k / 2 + others * k, (2 * d * k + others * d) / _config.DATA_FLOPS_PER_OP)
    # re-anchorings per neuron over the run: a Gram row and a share of a GEMM row each
    reanchored = min(1.0, (k / _config.REANCHOR_POINTS) ** 2) * max(0.0, 1.0 - coh)
    anchoring = (
        moved
        * reanchored
        * (k * n + 2 * n * d * _config.SPARSE_OPS / _config.BLAS_FLOPS)
        / _config.SPARSE_OPS
    )
    # float32 GEMM, float64 recomputation of the tracked pairs, trees, re-anchorings
    pre = (
        gemm / 2 + m * tracked * d * 4 / _config.BLAS_FLOPS + n * m / _config.STREAM_OPS + anchoring
    )
    if method == "lazy":
        return (
            pre + iters * moved * (evaluate + k * K + _config.LAZY_NEURON_OPS) / _config.SPARSE_OPS
        )
    if method == "kernel":
        if not _config.ntk_fits(n, K):
            return float("inf")  # the NTK matrix does not fit
        pre += m * k * k * K * K / _config.SPARSE_OPS
        # a visit: the move's bound over the prefix, then the pairs whose key passed
        visit = k * (min(_config.PROJECTION_RANK, d) + K) / _config.DATA_FLOPS_PER_OP
        per_visit = (
            visit + _config.KERNEL_DUE_SHARE * tracked * k + k * K + _config.KERNEL_VISIT_OPS
        )
        # every neuron is processed in the first few iterations; afterwards a share
        # that grows with coherence (W1: 5%, W4: 1/2, image patches and digits: 0.6-0.9)
        wave = min(iters, 6.0 + 6.0 * coh * k)
        active = moved * (wave + (iters - wave) * min(0.95, 0.2 * coh * k))
        flips = expected_flips(pairs, coh, k)
        return (
            pre
            + iters
            * (
                2 * (n * K) ** 2 / _config.STREAM_OPS
                + flips * 2 * k * K * _config.FLIP_WRITE_NS * 1e-9
            )
            + active * _config.KERNEL_EVALUATION * per_visit / _config.SPARSE_OPS
        )
    raise ValueError(f"no cost model for method {method!r}")


def memory_need(
    method: str,
    n: int,
    m: int,
    d: int,
    outputs: int,
    band_share: float,
    linear: bool = False,
    implicit: bool = False,
) -> float:
    """Modelled bytes a one-process run of ``method`` allocates beyond the model itself:
    the trainer's copy of ``W`` (dense and the tree methods; its momentum buffers too,
    with ``linear`` steps), the products the paper's trees keep, the tracked pairs of the
    band trainers (``n·m·band_share`` pairs at the start, at
    :data:`~corrtree._config.POOL_BYTES_PER_PAIR`), their per-neuron tables, the kernel
    trainer's ``nK × nK`` NTK matrix and float32 copy of ``X``, the lazy trainer's moves
    (``8·m·d``, up to :data:`~corrtree._config.LAZY_MOVE_MAX_DIM` features), and ``G``.  With
    ``implicit`` (an implicit model, band trainers only): the pairs at
    :data:`~corrtree._config.POOL_BYTES_PER_PAIR_IMPLICIT`,
    a set-up block of regenerated rows, and the trained model's coefficients (12 bytes
    a pair, the tracked pairs bounding those that ever fire)."""
    K = outputs
    common = 8.0 * n * n + 8.0 * n * d
    if method == "dense":
        return common + 8.0 * m * d * (2 if linear else 1)
    if method in ("dtree", "wtree"):
        return common + 8.0 * m * d * (2 if linear else 1) + _config.TREE_BYTES_PER_PAIR * n * m
    tracked = n * m * band_share
    if implicit:
        rows = min(m, _config.block_rows(4 * n, m, _config.ANCHOR_BLOCK_BYTES))
        pairs = tracked * (_config.POOL_BYTES_PER_PAIR_IMPLICIT + 12.0) + 12.0 * rows * d
    else:
        pairs = tracked * _config.POOL_BYTES_PER_PAIR
    need = common + pairs + _config.NEURON_TABLE_BYTES * m + 8.0 * m * K
    if linear:
        need += 8.0 * n * m * band_share  # the pairs' velocities
    if method == "kernel":
        need += _config.ntk_bytes(n, K) + 4.0 * n * d  # and X in float32 (rough_copy)
    if method == "lazy" and not implicit and d <= _config.LAZY_MOVE_MAX_DIM:
        need += 8.0 * m * d  # the moves since the anchors
    return need
