"""The sparsity lemma at initialization, with sound statistical tolerances."""

import math

import numpy as np
import pytest

import corrtree as ct


@pytest.mark.parametrize("m", [2**12, 2**14])
def test_fired_share_at_init_matches_Q_b(m):
    ds = ct.datasets.sphere(n=64, d=48, seed=m)
    model = ct.TwoLayerReLU.init(d=48, m=m, seed=m + 1)
    k = model.fire_counts(ds.X_train)
    q = ct.theory.fire_probability(model.b)
    # For a unit-norm x, <w_r, x> ~ N(0, 1) exactly, so each k_i ~ Binomial(m, Q(b)).
    # The k_i share W, so their mean varies at most as much as one of them:
    # 6 standard deviations bound the deviation with probability > 1 - 1e-8.
    sd = math.sqrt(m * q * (1 - q))
    assert abs(k.mean() - m * q) <= 6 * sd
    assert abs(k[0] - m * q) <= 6 * sd
    # lemma "Sparsity after initialization": every point fires O(m exp(-b²/2)) neurons
    assert k.max() <= ct.theory.sparsity_bound(m, model.b)
    assert ct.theory.expected_fired(m, model.b) <= ct.theory.paper_sparsity(m)


def test_theory_formulas():
    assert ct.theory.fire_probability(0.0) == pytest.approx(0.5)
    assert ct.theory.sparsity_bound(100, 0.0) == 100
    assert ct.theory.paper_sparsity(2**10) == pytest.approx(2**8)
    assert ct.theory.convergence_rate(2.0, 0.5) == 0.5
    D = ct.theory.movement_bound(0.5, 16, 4, np.array([3.0, 4.0]))
    assert D == pytest.approx(4 / 0.5 / 4 * 2 * 5)
