"""Every trainer follows the dense gradient-descent trajectory."""

import json
import math

import numpy as np
import pytest
from naive import gradient_descent

import corrtree as ct
from corrtree import _config
from corrtree.training import _ntk

EXACT_METHODS = ["dense", "dtree", "wtree"]


def _problem(n, m, d, outputs, seed):
    ds = ct.datasets.sphere(n=n, d=d, outputs=outputs, seed=seed)
    return ds.X_train, ds.y_train, ct.TwoLayerReLU.init(d=d, m=m, outputs=outputs, seed=seed + 7)


def _naive_ntk(model, X):
    """H from the dense fire indicator, by its definition."""
    F = (X @ model.W.T >= model.b).astype(float)  # n × m
    a = model.a.reshape(model.m, -1)
    G = X @ X.T
    K = a.shape[1]
    H = np.einsum("ir,jr,rk,rl->ikjl", F, F, a, a) / model.m * G[:, None, :, None]
    return H.reshape(X.shape[0] * K, X.shape[0] * K)


@pytest.mark.parametrize(
    ("n", "m", "d", "outputs", "seed"),
    [
        (1, 1, 1, 1, 0),
        (7, 50, 3, 1, 1),
        (40, 700, 17, 1, 2),
        (25, 300, 9, 3, 3),
        (60, 2000, 32, 2, 4),
    ],
)
def test_methods_match_naive_gradient_descent(n, m, d, outputs, seed):
    X, y, model0 = _problem(n, m, d, outputs, seed)
    model0 = ct.TwoLayerReLU(model0.W, model0.a, b=0.5 * model0.b)  # more firing pairs
    lr = 0.5 / max(_ntk_lambda(model0, X), 1e-3)
    W_ref, losses_ref = gradient_descent(model0.W, model0.a, model0.b, X, y, lr, 12)
    for method in EXACT_METHODS:
        model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
        hist = ct.train(model, X, y, method=method, lr=lr, iters=12)
        assert hist.method == method and len(hist) == 12
        np.testing.assert_allclose(hist.loss, losses_ref, rtol=1e-9, atol=1e-12 * losses_ref[0])
        scale = np.abs(W_ref).max()
        assert np.abs(model.W - W_ref).max() <= 1e-9 * scale, method


def _ntk_lambda(model, X):
    return float(np.linalg.eigvalsh(_naive_ntk(model, X))[-1])


@pytest.mark.parametrize("outputs", [1, 3])
def test_lr_auto_is_inverse_lambda_max(outputs):
    X, y, model = _problem(30, 400, 8, outputs, 5)
    want = 1.0 / _ntk_lambda(model, X)
    for method in EXACT_METHODS:
        m2 = ct.TwoLayerReLU(model.W, model.a, model.b)
        hist = ct.train(m2, X, y, method=method, iters=0)
        assert hist.lr == pytest.approx(want, rel=1e-10)
        assert hist.info["lr_auto"] is True


def test_lanczos_path_matches_dense_eigenvalue(monkeypatch):
    X, _, model = _problem(40, 500, 8, 2, 6)
    F = X @ model.W.T >= model.b
    indptr, idx = ct.training._sparse.keys_to_csr(np.flatnonzero(F.T), model.m, 40)
    G = X @ X.T
    a = model.output_weights
    dense = _ntk.lambda_max(indptr, idx, G, a, X)
    monkeypatch.setattr(_config, "NTK_DENSE_EIG_LIMIT", 10)
    monkeypatch.setattr(_config, "NTK_DENSE_MATVEC_LIMIT", 10)
    assert _ntk.lambda_max(indptr, idx, G, a, X) == pytest.approx(dense, rel=1e-4)  # Lanczos
    H = _ntk.ntk_matrix(indptr, idx, G, a)
    np.testing.assert_allclose(H, _naive_ntk(model, X), rtol=1e-12, atol=1e-15)


def test_ntk_matrix_counts_by_gemm_where_fire_sets_are_dense(monkeypatch):
    """With one output of weights ±1 and dense fire sets (low-dimensional data: a
    neuron fires on a large share of the points) ``H`` counts ``FᵀF`` by float32
    GEMMs of 0/1 rows, in blocks: the same matrix as the additions, bit for bit, and
    as the brute-force one; other output weights, or sparse fire sets, take the
    additions."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, 4))
    model = ct.TwoLayerReLU.init(d=4, m=700, seed=2)
    F = X @ model.W.T >= 0.3 * model.b  # (n, m): a third of the pairs fire
    indptr, idx = ct.training._sparse.keys_to_csr(np.flatnonzero(F.T), model.m, 60)
    G, a = X @ X.T, model.output_weights
    k = np.diff(indptr).astype(float)
    assert _ntk.ntk_cost(a, 60, float(k @ k))[1]  # dense: the GEMMs
    assert not _ntk.ntk_cost(1.5 * a, 60, float(k @ k))[1]  # weights not ±1
    assert not _ntk.ntk_cost(a, 60, 100.0)[1]  # few pairs: the additions
    monkeypatch.setattr(_config, "NTK_COUNT_BLOCK_BYTES", 4 * 60 * 128)  # 6 blocks
    by_gemm = _ntk.ntk_matrix(indptr, idx, G, a)
    monkeypatch.setattr(_config, "NTK_COUNT_GEMM_FLOPS", 1e-30)  # the additions
    by_adds = _ntk.ntk_matrix(indptr, idx, G, a)
    assert np.array_equal(by_gemm, by_adds) and by_gemm.any()
    want = np.einsum("ir,jr->ij", F, F.astype(float)) * G / model.m
    np.testing.assert_allclose(by_gemm, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_methods_agree_with_each_other_lr_auto(seed):
    X, y, model0 = _problem(80, 3000, 24, 1, seed)
    results = {}
    for method in EXACT_METHODS:
        model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
        results[method] = (ct.train(model, X, y, method=method, iters=15), model.W.copy())
    ref_hist, ref_W = results["dense"]
    assert ref_hist.loss[-1] < 1e-2 * ref_hist.loss[0]
    for hist, W in results.values():
        assert hist.lr == ref_hist.lr
        np.testing.assert_allclose(hist.loss, ref_hist.loss, rtol=1e-9)
        assert hist.final_loss == pytest.approx(ref_hist.final_loss, rel=1e-9)
        assert np.linalg.norm(W - ref_W) <= 1e-9 * np.linalg.norm(ref_W)
        assert hist.fired_pairs == ref_hist.fired_pairs
        assert hist.moved_neurons == ref_hist.moved_neurons
        assert hist.flips == ref_hist.flips


def test_history_statistics_against_brute_force():
    X, y, model = _problem(20, 200, 6, 1, 3)
    W0 = model.W.copy()
    lr = 5.0
    hist = ct.train(model, X, y, method="wtree", lr=lr, iters=4)
    W = W0.copy()
    prev = None
    for t in range(4):
        F = W @ X.T >= model.b
        assert hist.fired_pairs[t] == F.sum()
        assert hist.moved_neurons[t] == F.any(axis=1).sum()
        assert hist.flips[t] == (0 if prev is None else (F != prev).sum())
        prev = F
        W, _ = gradient_descent(W, model.a, model.b, X, y, lr, 1)
    assert all(v >= 0 for v in hist.time_query + hist.time_forward + hist.time_update)
    assert hist.total_time >= hist.preprocess_time


def test_dense_blocks_match_single_block():
    X, y, model0 = _problem(30, 500, 10, 2, 8)
    out = []
    for block in (500, 7):
        model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
        hist = ct.train(model, X, y, method="dense", lr=3.0, iters=6, block=block)
        assert hist.info["block"] == block
        out.append((hist, model.W.copy()))
    np.testing.assert_allclose(out[0][0].loss, out[1][0].loss, rtol=1e-12)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-12, atol=1e-12)
    assert out[0][0].flips == out[1][0].flips


def test_history_roundtrip(tmp_path):
    X, y, model = _problem(10, 64, 4, 1, 0)
    hist = ct.train(model, X, y, method="dense", iters=3)
    hist.to_json(tmp_path / "h.json")
    back = ct.History.from_dict(json.loads((tmp_path / "h.json").read_text()))
    assert back.as_dict() == json.loads(json.dumps(hist.as_dict()))
    hist.to_csv(tmp_path / "h.csv")
    lines = (tmp_path / "h.csv").read_text().splitlines()
    assert lines[0].startswith("iteration,loss,fired_pairs") and len(lines) == 4


def test_callback_stops_training():
    X, y, model = _problem(10, 64, 4, 1, 0)
    seen = []
    hist = ct.train(
        model, X, y, method="dense", iters=10, callback=lambda t, h: seen.append(t) or t < 2
    )
    assert seen == [0, 1, 2] and len(hist) == 3


def test_divergence_names_lr_and_iteration():
    X, y, model = _problem(10, 64, 4, 1, 0)
    with pytest.raises(ct.TrainingDiverged, match=r"iteration \d+ with lr=1e\+06"):
        ct.train(model, X, y, method="dense", lr=1e6, iters=50)


def test_auto_picks_a_method_and_records_costs():
    X, y, model = _problem(10, 64, 4, 1, 0)
    hist = ct.train(model, X, y, iters=2)
    assert hist.method in ct.METHODS and hist.info["auto"] is True
    assert set(hist.info["costs"]) >= {"dense", "dtree", "wtree"}
    assert hist.method == min(hist.info["costs"], key=hist.info["costs"].get)


def test_no_firing_pair_makes_lr_auto_fail():
    model = ct.TwoLayerReLU(np.zeros((4, 2)), np.ones(4), b=1.0)
    with pytest.raises(ValueError, match="needs at least one firing pair"):
        ct.train(model, np.eye(2), np.zeros(2), method="dense")


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"y": np.zeros(9)}, ValueError, r"y must have shape \(10,\)"),
        ({"y": np.zeros((10, 2))}, ValueError, r"y must have shape \(10,\)"),
        ({"y": np.full(10, np.nan)}, ValueError, "y contains NaN"),
        ({"X": np.full((10, 4), np.inf)}, ValueError, "X contains NaN"),
        ({"X": np.ones((10, 5))}, ValueError, "X has 5 columns"),
        ({"method": "sgd"}, ValueError, "method must be one of"),
        ({"lr": 0.0}, ValueError, "lr must be a finite number > 0"),
        ({"lr": -1}, ValueError, "lr must be a finite number > 0"),
        ({"lr": "fast"}, ValueError, "lr must be a positive number or 'auto'"),
        ({"iters": -1}, ValueError, "iters must be an integer >= 0"),
        ({"iters": 2.5}, ValueError, "iters must be an integer >= 0"),
        ({"patience": 0}, ValueError, "patience must be an integer >= 1"),
        ({"model": "model"}, ValueError, "model must be a TwoLayerReLU"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    X, y, model = _problem(10, 64, 4, 1, 0)
    args = {"model": model, "X": X, "y": y, **kwargs}
    W0 = model.W.copy()
    with pytest.raises(exc, match=match):
        ct.train(**args)
    np.testing.assert_array_equal(model.W, W0)


def test_loss_decreases_geometrically_when_over_parameterized():
    """||err(t)||² <= (1 - η λ_min / 2)^t ||err(0)||² (the paper's convergence regime)."""
    X, y, model = _problem(16, 8192, 64, 1, 11)
    lam = np.linalg.eigvalsh(_naive_ntk(model, X))
    hist = ct.train(model, X, y, method="dense", iters=30)
    rate = ct.theory.convergence_rate(hist.lr, lam[0])
    assert 0 < rate < 1
    for t, loss in enumerate(hist.loss):
        assert loss <= rate**t * hist.loss[0] * (1 + 1e-9)
    assert hist.final_loss < 1e-6 * hist.loss[0]
    assert math.isfinite(hist.final_loss)


@pytest.mark.parametrize("scatter_cost", [0.0, 1e9])  # Gram reads, or sums rebuilt from X
def test_ntk_matvec_both_ways_against_the_dense_matrix(monkeypatch, scatter_cost):
    X, _, model = _problem(30, 400, 5, 3, 8)
    F = X @ model.W.T >= model.b
    indptr, idx = ct.training._sparse.keys_to_csr(np.flatnonzero(F.T), model.m, 30)
    G = X @ X.T
    a = np.array(model.output_weights)
    monkeypatch.setattr(_config, "SCATTER_COST", scatter_cost)
    H = _ntk.ntk_matrix(indptr, idx, G, a)
    v = np.random.default_rng(0).standard_normal(90)
    matvec = _ntk.ntk_matvec(indptr, idx, G, a, None, X)
    # Gram reads are float64; sums rebuilt from X are float32 (error ~ d·2⁻²⁴)
    tol = 1e-12 if scatter_cost == 0.0 else 1e-5
    np.testing.assert_allclose(matvec(v), H @ v, rtol=tol, atol=tol * np.abs(H @ v).max())
    np.testing.assert_array_equal(matvec(v), matvec(v))  # deterministic
    monkeypatch.setattr(_config, "NTK_DENSE_EIG_LIMIT", 10)
    monkeypatch.setattr(_config, "NTK_DENSE_MATVEC_LIMIT", 10)
    lam = _ntk.lambda_max(indptr, idx, G, a, X)
    assert lam == pytest.approx(np.linalg.eigvalsh(H)[-1], rel=1e-4)


def _fire_csr(model, X, cols=slice(None)):
    F = (X @ model.W.T >= model.b)[:, cols]
    return ct.training._sparse.keys_to_csr(np.flatnonzero(F.T), F.shape[1], X.shape[0])


def test_ntk_operator_products_and_their_shares(monkeypatch):
    """The three products of NTKOperator against the explicit matrices, and the
    shares of two halves of the neurons summing to the whole network's."""
    n, m, K = 30, 400, 3
    X, _, model = _problem(n, m, 5, K, 8)
    G, a = X @ X.T, np.array(model.output_weights)
    monkeypatch.setattr(_config, "NTK_WARM_NEURONS", 100)  # the sample: every 4th neuron
    op = _ntk.NTKOperator(*_fire_csr(model, X), G, a, X)
    halves = [
        _ntk.NTKOperator(*_fire_csr(model, X, part), G, a[part], X, m)
        for part in (slice(0, 200), slice(200, m))
    ]
    H = _naive_ntk(model, X)
    F = (X @ model.W.T >= model.b).astype(float)[:, ::4]
    M = (F * (a[::4] ** 2).mean(axis=1)) @ F.T * G / m
    rng = np.random.default_rng(1)
    v, u = rng.standard_normal(n * K), rng.standard_normal(n)
    u /= np.linalg.norm(u)
    B = np.stack([np.outer(u, e).ravel() for e in np.eye(K)], axis=1)
    for got, want, tol in [
        (lambda o: o.matvec(v), H @ v, 1e-5),  # float32 sums from X, or float64 Gram reads
        (lambda o: o.sample_matvec(u), M @ u, 1e-5),
        (lambda o: o.ritz(u), B.T @ H @ B, 1e-12),
    ]:
        np.testing.assert_allclose(got(op), want, rtol=tol, atol=tol * np.abs(want).max())
        shares = got(halves[0]) + got(halves[1])
        np.testing.assert_allclose(shares, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("outputs", [1, 3])
def test_warm_start_is_near_the_top_eigenvector(monkeypatch, outputs):
    """The start ``u ⊗ c`` has a Rayleigh quotient close to λ_max, where a random
    vector's is far below it; Lanczos from it gives λ_max within its tolerance."""
    n, m = 60, 3000
    X, _, model = _problem(n, m, 8, outputs, 5)
    monkeypatch.setattr(_config, "NTK_WARM_NEURONS", 500)
    op = _ntk.NTKOperator(*_fire_csr(model, X), X @ X.T, np.array(model.output_weights), X)
    v0 = _ntk.warm_start(n, outputs, op.sample_matvec, op.ritz)
    H = _naive_ntk(model, X)
    lam = np.linalg.eigvalsh(H)[-1]
    g = np.random.default_rng(0).standard_normal(n * outputs)
    assert v0 @ H @ v0 / (v0 @ v0) >= 0.85 * lam
    assert g @ H @ g / (g @ g) <= 0.5 * lam
    assert _ntk.top_eigenvalue(n * outputs, op.matvec, v0=v0) == pytest.approx(lam, rel=1e-4)


def test_every_method_takes_the_same_lanczos_way(monkeypatch):
    """Beyond the formed-matrix limit the kernel trainer's own H is not used: every
    method gets the same lr, bit for bit, close to the explicit eigensolver's."""
    X, y, model = _problem(40, 600, 8, 3, 4)
    want = 1.0 / _ntk_lambda(model, X)
    monkeypatch.setattr(_config, "NTK_DENSE_EIG_LIMIT", 10)
    monkeypatch.setattr(_config, "NTK_DENSE_MATVEC_LIMIT", 10)
    monkeypatch.setattr(_config, "SCATTER_COST", 1e9)  # the float32 sums from X
    lrs = {}
    for method in [*EXACT_METHODS, "lazy", "kernel"]:
        m2 = ct.TwoLayerReLU(model.W, model.a, model.b)
        lrs[method] = ct.train(m2, X, y, method=method, iters=0).lr
    assert len(set(lrs.values())) == 1, lrs
    assert lrs["kernel"] == pytest.approx(want, rel=1e-4)


def test_lanczos_on_the_formed_matrix(monkeypatch):
    X, _, model = _problem(40, 500, 8, 2, 6)
    F = X @ model.W.T >= model.b
    indptr, idx = ct.training._sparse.keys_to_csr(np.flatnonzero(F.T), model.m, 40)
    G = X @ X.T
    a = model.output_weights
    want = np.linalg.eigvalsh(_ntk.ntk_matrix(indptr, idx, G, a))[-1]
    monkeypatch.setattr(_config, "NTK_DENSE_EIG_LIMIT", 10)  # 80 > 10: Lanczos on H
    assert _ntk.lambda_max(indptr, idx, G, a, X) == pytest.approx(want, rel=1e-4)
