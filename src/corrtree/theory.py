"""The paper's quantitative statements, as functions to compare measurements with."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

__all__ = [
    "convergence_rate",
    "expected_fired",
    "fire_probability",
    "movement_bound",
    "paper_sparsity",
    "sparsity_bound",
]


def fire_probability(b: float) -> float:
    """``Q(b) = P[N(0, 1) >= b]``: the chance a neuron fires on a unit-norm point at init."""
    return float(ndtr(-b))


def expected_fired(m: int, b: float) -> float:
    """``m · Q(b)``: expected number of neurons firing on a unit-norm point at init."""
    return m * fire_probability(b)


def sparsity_bound(m: int, b: float) -> float:
    """``m · exp(-b²/2)``: lemma "Sparsity after initialization" (up to its constant)."""
    return m * math.exp(-b * b / 2.0)


def paper_sparsity(m: int) -> float:
    """``m^(4/5)``: the remark after the lemma, for ``b = sqrt(0.4 ln m)``."""
    return float(m) ** 0.8


def convergence_rate(lr: float, lam_min: float) -> float:
    """Per-iteration contraction ``1 - η·λ/2`` of ``||err||²`` in the over-parameterized regime."""
    return 1.0 - lr * lam_min / 2.0


def movement_bound(lam_min: float, m: int, n: int, err0: np.ndarray) -> float:
    """``D = 4·λ⁻¹·m^(-1/2)·sqrt(n)·||err(0)||``, the paper's bound on
    ``max_r ||w_r(t) - w_r(0)||``."""
    return 4.0 / lam_min / math.sqrt(m) * math.sqrt(n) * float(np.linalg.norm(err0))
