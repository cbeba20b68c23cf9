"""The visits' exchange rate between their two routes, measured once per process
(``corrtree.training._calibrate``)."""

import math

import numpy as np
import pytest
from test_lazy_kernel import _problem, _run, assert_same_trajectory

import corrtree as ct
from corrtree.training import _calibrate, _train
from corrtree.training._calibrate import SCATTER_COST_VAR, scatter_cost


@pytest.fixture
def fresh(monkeypatch):
    """No rate measured yet in this process, and none fixed by the environment."""
    monkeypatch.setattr(_calibrate, "_RATES", {})
    monkeypatch.delenv(SCATTER_COST_VAR, raising=False)


def test_the_timed_loops_compute_both_routes_values():
    """The two loops the rate is measured on do the routes' work, so the compiler cannot
    drop it: ``-G[P, P]·dc`` and the Gershgorin bound by the Gram route, and
    ``X_P·(X_Pᵀ·dc)`` from the data, the same values where ``G = XXᵀ``."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 7))
    G = X @ X.T
    points = rng.integers(0, 40, (5, 9)).astype(np.int32)
    dc = rng.standard_normal(9)
    gram_vals, data_vals = np.zeros((5, 9)), np.zeros((5, 9))
    total = _calibrate._by_gram(G, points, dc, gram_vals)
    _calibrate._by_data(X, points, dc, np.zeros((5, 7)), data_vals)
    for k, P in enumerate(points):
        np.testing.assert_allclose(gram_vals[k], -G[np.ix_(P, P)] @ dc, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(data_vals[k], X[P] @ (X[P].T @ dc), rtol=1e-12, atol=1e-12)
    bounds = [np.abs(G[np.ix_(P, P)]).sum(axis=1).max() for P in points]  # Gershgorin's
    np.testing.assert_allclose(total, gram_vals[:, -1].sum() + sum(bounds), rtol=1e-12)


def test_the_row_loops_compute_both_routes_due_values():
    """The loops of the row rate do a visit's two ways to its due values: ``Σ_l dc_l
    G[l, j]`` from the prefix's rows of G, and ``<x_j, Σ_l dc_l x_l>`` from the data, the
    same values where ``G = XXᵀ``; each returns the sum of its first values."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 7))
    G = X @ X.T
    points = rng.integers(0, 40, (5, 9)).astype(np.int32)
    due = rng.integers(0, 40, (5, 6))
    dc = rng.standard_normal(9)
    firsts = []
    for k in range(5):
        want = G[np.ix_(points[k], due[k])].T @ dc
        np.testing.assert_allclose(want, X[due[k]] @ (X[points[k]].T @ dc), rtol=1e-10)
        gram, data = np.zeros(6), np.zeros(6)
        _calibrate._rows_by_gram(G, points[k : k + 1], due[k : k + 1], dc, gram)
        _calibrate._rows_by_move(X, points[k : k + 1], due[k : k + 1], dc, np.zeros(7), data)
        np.testing.assert_allclose(gram, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(data, want, rtol=1e-12, atol=1e-12)
        firsts.append(want[0])
    total = _calibrate._rows_by_gram(G, points, due, dc, np.zeros(6))
    assert total == pytest.approx(sum(firsts), rel=1e-12)
    total = _calibrate._rows_by_move(X, points, due, dc, np.zeros(7), np.zeros(6))
    assert total == pytest.approx(sum(firsts), rel=1e-12)


def test_the_rate_is_measured_once_per_process_and_shape(fresh):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 24))
    G = X @ X.T
    first = scatter_cost(G, X)
    assert first.seconds > 0 and first.read_s > 0 and first.madd_s > 0
    assert first.measured == pytest.approx(first.read_s / first.madd_s)
    # a power of two within the bounds, the nearest to the measurement
    assert _calibrate.LOWEST <= first.scatter <= _calibrate.HIGHEST
    assert math.log2(first.scatter) == round(math.log2(first.scatter))
    clipped = min(max(first.measured, _calibrate.LOWEST), _calibrate.HIGHEST)
    assert abs(math.log2(first.scatter / clipped)) <= 0.5
    # the rate of a read of a row of G at due points: the same rounding, its own number
    assert first.row_measured > 0 and math.log2(first.row) == round(math.log2(first.row))
    clipped = min(max(first.row_measured, _calibrate.LOWEST), _calibrate.HIGHEST)
    assert abs(math.log2(first.row / clipped)) <= 0.5
    again = scatter_cost(G, X)
    assert again == first._replace(seconds=0.0)  # cached: nothing measured again
    other = scatter_cost(G[:200, :200], X[:200])
    assert other.seconds > 0  # another shape is measured on its own


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf"])
def test_a_fixed_rate_must_be_a_positive_number(fresh, monkeypatch, value):
    monkeypatch.setenv(SCATTER_COST_VAR, value)
    X = np.eye(3)
    with pytest.raises(ValueError, match=f"^{SCATTER_COST_VAR} must be a positive number"):
        scatter_cost(X @ X.T, X)

    def never(*args, **kwargs):
        raise AssertionError("kernels loaded before the rate was checked")

    monkeypatch.setattr(_train, "ensure", never)  # refused before anything compiles
    model = ct.TwoLayerReLU.init(d=3, m=16, seed=0)
    with pytest.raises(ValueError, match=f"^{SCATTER_COST_VAR} must be a positive number"):
        ct.train(model, X, np.ones(3), method="lazy", iters=1)


def test_a_resume_refuses_a_bad_rate_before_anything_loads(fresh, monkeypatch, tmp_path):
    X, y, model0 = _problem(30, 200, 8, 1, 2)
    path = tmp_path / "run.npz"
    _run(model0, X, y, "lazy", iters=2, checkpoint=str(path), checkpoint_every=2)
    monkeypatch.setenv(SCATTER_COST_VAR, "-3")

    def never(*args, **kwargs):
        raise AssertionError("kernels loaded before the rate was checked")

    monkeypatch.setattr(_train, "ensure", never)
    with pytest.raises(ValueError, match=f"^{SCATTER_COST_VAR} must be a positive number"):
        ct.resume(path, X, y, iters=4)


def _pool_values(tmp_path, name, model0, X, y, method):
    path = tmp_path / f"{name}.npz"
    # the lazy trainer's route by the moves takes no values from G: its other route here
    opts = {"moves": False} if method == "lazy" else {}
    hist, W = _run(
        model0, X, y, method, iters=12, checkpoint=str(path), checkpoint_every=12, **opts
    )
    with np.load(path) as data:
        return hist, W, data["state_pool_val"].copy()


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_the_visits_take_the_route_the_rate_chooses_and_keep_the_trajectory(
    fresh, monkeypatch, tmp_path, method
):
    """With every value read from ``G`` (a rate of almost nothing) or rebuilt from the
    data (an enormous one) the run is dense's.  The runs are deterministic, so the state
    they hold differing (the routes evaluate at different times: from ``G`` a step may
    be bounded by ``σ_r`` instead of evaluated) shows that each took its own route."""
    X, y, model0 = _problem(80, 1500, 16, 1, 4, b_scale=0.8)
    ref = _run(model0, X, y, "dense", iters=12)
    held = {}
    for rate in ("1e-9", "1e9"):
        monkeypatch.setenv(SCATTER_COST_VAR, rate)
        hist, W, held[rate] = _pool_values(tmp_path, rate, model0, X, y, method)
        assert_same_trajectory(hist, W, *ref)
        assert hist.info["scatter_cost"] == float(rate)
        assert hist.info["gram_row_cost"] == float(rate)  # both rates fixed by the one
        assert "calibration_s" not in hist.info  # fixed: nothing measured
    gram, data = held["1e-9"], held["1e9"]
    assert gram.shape == data.shape and not np.array_equal(gram, data)


def test_a_run_measures_the_rate_before_its_clock_and_reports_it(fresh):
    X, y, model0 = _problem(80, 1500, 16, 1, 4, b_scale=0.8)
    hist, _ = _run(model0, X, y, "lazy", iters=3)
    assert hist.info["calibration_s"] > 0
    assert hist.info["scatter_cost"] == scatter_cost(X @ X.T, X).scatter
    assert hist.info["gram_row_cost"] == scatter_cost(X @ X.T, X).row
    again, _ = _run(model0, X, y, "kernel", iters=3)
    assert "calibration_s" not in again.info  # measured once per process
    assert again.info["scatter_cost"] == hist.info["scatter_cost"]
