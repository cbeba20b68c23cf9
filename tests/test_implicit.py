"""Implicit W(0): the counter-based generator, implicit models, their training, files and
checkpoints (``corrtree/_philox.py``, ``corrtree/_implicit.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from naive import implicit_weight, philox4x32_10
from runs import interrupted

import corrtree as ct
from corrtree import _philox
from corrtree.training import CheckpointError

# Random123's known-answer vectors for Philox-4×32-10 (kat_vectors): counter, key, output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF,) * 4,
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def _sphere(n=128, d=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True), rng


@pytest.mark.parametrize(("ctr", "key", "want"), KAT)
def test_philox_known_answers(ctr, key, want):
    got = _philox.philox4x32(np.array([ctr], dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert tuple(int(v) for v in got[0]) == want
    assert philox4x32_10(ctr, key) == want  # the test's own reference agrees
    cols = [np.array([v], dtype=np.int64) for v in ctr]
    twin = _philox.philox_array(np, *cols, *key)
    assert tuple(int(v[0]) for v in twin) == want


def test_normals_follow_their_definition():
    seed = 2**40 + 12345  # both key words in use
    rows = np.array([0, 1, 7, 2**33 + 5], dtype=np.int64)  # both row words in use
    out = _philox.normal_take(seed, 0, rows, np.empty((4, 7)))
    want = np.array([[implicit_weight(seed, int(r), c) for c in range(7)] for r in rows])
    np.testing.assert_allclose(out, want, rtol=1e-14, atol=1e-15)


def test_rows_are_independent_of_the_block_they_come_in():
    seed = 3
    whole = _philox.normal_rows(seed, 0, np.empty((300, 33)))
    np.testing.assert_array_equal(
        _philox.normal_rows(seed, 120, np.empty((17, 33))), whole[120:137]
    )
    perm = np.random.default_rng(0).permutation(300)
    np.testing.assert_array_equal(
        _philox.normal_take(seed, 0, perm, np.empty((300, 33))), whole[perm]
    )
    # a shard's row r is the generator's offset + r
    np.testing.assert_array_equal(
        _philox.normal_take(seed, 100, np.arange(5), np.empty((5, 33))), whole[100:105]
    )
    # columns: a narrower row is a prefix of a wider one
    np.testing.assert_array_equal(_philox.normal_rows(seed, 0, np.empty((300, 10))), whole[:, :10])
    other = _philox.normal_rows(seed + 1, 0, np.empty((300, 33)))
    assert not np.isclose(other, whole).any(axis=1).all()


def test_numpy_twin_and_torch_agree_with_the_kernel():
    torch = pytest.importorskip("torch")
    seed, d = 987654321, 9
    rows = np.array([0, 3, 1000, 2**32 + 1], dtype=np.int64)
    fast = _philox.normal_take(seed, 0, rows, np.empty((4, d)))
    ref = _philox.normals_array(np, seed, rows, d)
    np.testing.assert_allclose(ref, fast, rtol=4e-16 * 8, atol=1e-15)
    # the integers of both libraries are the same bits
    cols = [np.array([1, 2**31 + 7], dtype=np.int64), np.array([5, 0xFFFFFFFF], dtype=np.int64)] * 2
    want = _philox.philox_array(np, *cols, 0xDEADBEEF, 17)
    got = _philox.philox_array(torch, *(torch.from_numpy(c) for c in cols), 0xDEADBEEF, 17)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g.numpy())
    t = _philox.normals_array(torch, seed, torch.from_numpy(rows), d)
    np.testing.assert_allclose(t.numpy(), fast, rtol=4e-16 * 8, atol=1e-15)


def test_normals_are_standard_gaussian():
    from scipy import stats

    z = _philox.normal_rows(11, 0, np.empty((2000, 500))).ravel()
    assert abs(z.mean()) < 5 / np.sqrt(z.size)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / z.size)
    assert stats.kstest(z[:200_000], "norm").pvalue > 1e-3
    # neighbouring columns (the two outputs of one Box-Muller pair) are uncorrelated
    W = z.reshape(2000, 500)
    assert abs(np.corrcoef(W[:, 0], W[:, 1])[0, 1]) < 5 / np.sqrt(2000)
    a = _philox.sign_rows(11, 0, np.empty((4000, 3)))
    assert set(np.unique(a)) == {-1.0, 1.0}
    assert abs(a.mean()) < 5 / np.sqrt(a.size)


def test_implicit_model_interface(tmp_path):
    model = ct.TwoLayerReLU.init(d=6, m=50, outputs=2, seed=4, implicit=True)
    assert model.implicit and model.seed == 4 and (model.m, model.d, model.outputs) == (50, 6, 2)
    with pytest.raises(
        AttributeError, match=r"W: an implicit model .* \(it would take 2\.34 KiB\).*weights\(start"
    ):
        _ = model.W
    W = model.weights()
    np.testing.assert_array_equal(W, _philox.normal_rows(4, 0, np.empty((50, 6))))
    np.testing.assert_array_equal(model.weights(10, 20), W[10:20])
    assert model.weights(5, 5).shape == (0, 6)
    X, _ = _sphere(20, 6)
    explicit = model.to_explicit()
    assert not explicit.implicit and explicit.seed is None
    np.testing.assert_array_equal(explicit.W, W)
    np.testing.assert_allclose(model.predict(X), explicit.predict(X), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(explicit.weights(3, 9), W[3:9])
    model.export_weights(tmp_path / "W.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "W.npy", mmap_mode="r"), W)
    with pytest.raises(ValueError, match="start must be an integer or None"):
        model.weights(1.5, 3)
    with pytest.raises(ValueError, match="set_weights: an implicit"):
        model.set_weights(W)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\) for an implicit"):
        ct.TwoLayerReLU.init(d=3, m=4, seed=2**64, implicit=True)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        ct.TwoLayerReLU.init(d=3, m=4, seed=-1, implicit=True)
    with pytest.raises(ValueError, match="implicit must be"):
        ct.TwoLayerReLU.init(d=3, m=4, implicit="yes")


def test_implicit_init_checks_memory_of_a_only(monkeypatch):
    import corrtree._validation as v

    monkeypatch.setattr(v, "available_memory", lambda: 2.0**30)
    model = ct.TwoLayerReLU.init(d=10_000, m=2**20, implicit=True)  # W: 78 GiB, a: 8 MiB
    assert model.m == 2**20
    with pytest.raises(MemoryError, match=r"m=\d+ would fit"):
        ct.TwoLayerReLU.init(d=10_000, m=2**20)


@pytest.mark.parametrize("method", ["lazy", "kernel"])
@pytest.mark.parametrize("K", [1, 3])
def test_implicit_and_explicit_runs_follow_one_trajectory(method, K):
    X, rng = _sphere(96, 12)
    y = rng.standard_normal((96, K)) if K > 1 else rng.standard_normal(96)
    implicit = ct.TwoLayerReLU.init(d=12, m=2**16, outputs=K, seed=9, implicit=True)
    explicit = implicit.to_explicit()
    hi = ct.train(implicit, X, y, method=method, iters=25)
    he = ct.train(explicit, X, y, method=method, iters=25)
    assert hi.info["implicit"] and not he.info["implicit"]
    np.testing.assert_allclose(hi.loss, he.loss, rtol=1e-12, atol=0)
    np.testing.assert_allclose(implicit.weights(), explicit.W, rtol=0, atol=1e-12)
    # the final loss is that of a streamed dense forward pass of the final implicit weights
    assert implicit.loss(X, y) == pytest.approx(hi.final_loss, rel=1e-9, abs=1e-12)
    # the model keeps one coefficient per pair that ever fired, and no W
    assert implicit.implicit_weights.pairs > 0 and implicit._W is None


def test_implicit_matches_the_dense_reference_with_momentum_and_weight_decay():
    X, rng = _sphere(64, 10)
    y = rng.standard_normal(64)
    kw = dict(iters=20, lr=0.5, momentum=0.9, weight_decay=1e-3, batch_size=16)
    implicit = ct.TwoLayerReLU.init(d=10, m=2**12, seed=2, implicit=True)
    explicit = implicit.to_explicit()
    hi = ct.train(implicit, X, y, method="lazy", **kw)
    hd = ct.train(explicit, X, y, method="dense", **kw)
    np.testing.assert_allclose(hi.loss, hd.loss, rtol=1e-9)
    np.testing.assert_allclose(implicit.weights(), explicit.W, atol=1e-9)


def test_training_an_implicit_model_again():
    X, rng = _sphere(64, 10)
    X2, _ = _sphere(48, 10, seed=5)
    y, y2 = rng.standard_normal(64), rng.standard_normal(48)
    implicit = ct.TwoLayerReLU.init(d=10, m=2**12, seed=1, implicit=True)
    explicit = implicit.to_explicit()
    for data in ((X, y), (X, y), (X2, y2)):  # same points (one C), then new points
        ct.train(implicit, *data, method="kernel", iters=8, lr=0.5, weight_decay=1e-3)
        ct.train(explicit, *data, method="lazy", iters=8, lr=0.5, weight_decay=1e-3)
        np.testing.assert_allclose(implicit.weights(), explicit.W, atol=1e-11)
    assert (
        implicit.implicit_weights.update[0].shape[0] == 64 + 48
    )  # the points of both data sets, once


def test_methods_that_need_the_matrix_refuse_an_implicit_model():
    X, rng = _sphere(32, 5)
    model = ct.TwoLayerReLU.init(d=5, m=256, implicit=True)
    for method in ("dense", "dtree", "wtree"):
        with pytest.raises(ValueError, match=f"method='{method}' needs the stored weight matrix"):
            ct.train(model, X, rng.standard_normal(32), method=method, iters=2)
    hist = ct.train(model, X, rng.standard_normal(32), iters=2)  # auto: lazy or kernel
    assert hist.method in ("lazy", "kernel")


def test_implicit_model_file(tmp_path):
    X, rng = _sphere(64, 8)
    y = rng.standard_normal((64, 2))
    model = ct.TwoLayerReLU.init(d=8, m=2**12, outputs=2, seed=6, implicit=True)
    ct.train(model, X, y, method="lazy", iters=10)
    path = tmp_path / "model.npz"
    model.save(path)
    back = ct.TwoLayerReLU.load(path)
    assert back.implicit and back.seed == 6
    np.testing.assert_array_equal(back.weights(), model.weights())
    np.testing.assert_array_equal(back.predict(X), model.predict(X))
    # 12 bytes a pair that ever fired plus O(m) (and the points); no m×d matrix
    pairs = model.implicit_weights.pairs
    size = path.stat().st_size
    assert size < 12 * pairs + 8 * (model.m + 1) + model.m * 2 + X.nbytes + 20_000
    # tampered: any changed member is refused in one line
    with np.load(path) as data:
        arrays = {k: np.array(data[k]) for k in data.files}
    for name, change in (
        ("w_coef", lambda a: a + 1e-3),
        ("w_seed", lambda a: np.array(int(a) + 1, dtype=np.uint64)),
        ("w_cols", lambda a: a[::-1].copy()),
    ):
        bad = dict(arrays, **{name: change(arrays[name])})
        np.savez(tmp_path / "bad.npz", **bad)
        with pytest.raises(ValueError, match="digest does not match") as err:
            ct.TwoLayerReLU.load(tmp_path / "bad.npz")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_implicit_checkpoint_resumes_bit_for_bit(tmp_path, method):
    X, rng = _sphere(80, 10)
    y = rng.standard_normal((80, 2))
    whole = ct.TwoLayerReLU.init(d=10, m=2**16, outputs=2, seed=8, implicit=True)
    explicit = whole.to_explicit()  # the same W(0)
    hw = ct.train(whole, X, y, method=method, iters=20)
    part = ct.TwoLayerReLU.init(d=10, m=2**16, outputs=2, seed=8, implicit=True)
    ck = tmp_path / "run.ckpt"
    interrupted(part, X, y, ck, 9, method=method, iters=20, checkpoint_every=7)
    with np.load(ck) as data:
        assert "model_W" not in data.files and "model_w_seed" in data.files
    model, hr = ct.resume(ck, X, y)
    assert model.implicit
    np.testing.assert_array_equal(hr.loss, hw.loss)
    np.testing.assert_array_equal(model.weights(), whole.weights())
    # the explicit model from the same W(0), interrupted and resumed too
    ck2 = tmp_path / "explicit.ckpt"
    interrupted(explicit, X, y, ck2, 9, method=method, iters=20, checkpoint_every=7)
    back, _ = ct.resume(ck2, X, y)
    np.testing.assert_allclose(back.W, model.weights(), rtol=0, atol=1e-9)
    # a tampered seed is refused before anything runs
    with np.load(ck) as data:
        arrays = {k: np.array(data[k]) for k in data.files}
    arrays["model_w_seed"] = np.array(9, dtype=np.uint64)
    np.savez(tmp_path / "bad.ckpt.npz", **arrays)
    with pytest.raises(CheckpointError, match="damaged"):
        ct.resume(tmp_path / "bad.ckpt.npz", X, y)


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_sharded_implicit_runs_regenerate_their_rows(tmp_path, method):
    X, rng = _sphere(64, 8)
    y = rng.standard_normal((64, 2))
    one = ct.TwoLayerReLU.init(d=8, m=2**12, outputs=2, seed=3, implicit=True)
    ct.train(one, X, y, method=method, iters=12)
    sharded = ct.TwoLayerReLU.init(d=8, m=2**12, outputs=2, seed=3, implicit=True)
    hist = ct.train(sharded, X, y, method=method, iters=12, shards=3)
    assert sharded.implicit and hist.info["shards"] == 3
    np.testing.assert_allclose(sharded.weights(), one.weights(), atol=1e-12)
    # a sharded checkpoint stores no rows and resumes on its own shards only
    part = ct.TwoLayerReLU.init(d=8, m=2**12, outputs=2, seed=3, implicit=True)
    ck = tmp_path / "sharded.npz"
    interrupted(part, X, y, ck, 5, method=method, iters=12, shards=3, checkpoint_every=4)
    for f in tmp_path.glob("*.npz"):
        with np.load(f) as data:
            assert not any(k.endswith("_W") for k in data.files), f.name
    model, _ = ct.resume(ck, X, y)
    np.testing.assert_array_equal(model.weights(), sharded.weights())
    with pytest.raises(ValueError, match="resumes on its own 3 shards only"):
        ct.resume(ck, X, y, shards=2)


def _forward_products(W, X):
    """``<W[r], X[j]>`` as the implicit forward's float64 pass sums them (its own kernel,
    every pair a candidate; negative products read 0)."""
    from corrtree._implicit import _fire_exact

    U = np.empty((W.shape[0], X.shape[0]))
    for r in range(W.shape[0]):
        out, counts = np.zeros((X.shape[0], 1)), np.zeros(X.shape[0], dtype=np.int64)
        UT = np.zeros((X.shape[0], 1), dtype=np.float32)
        _fire_exact(UT, np.full(1, -np.inf), W[r : r + 1], X, np.ones((1, 1)), 0.0, out, counts)
        U[r] = out[:, 0]
    return U


def test_implicit_forward_finds_the_same_firing_pairs():
    """predict of an implicit model: float32 GEMM, float64 near b; the float64 GEMM's
    firing set and values."""
    X, rng = _sphere(300, 40)
    model = ct.TwoLayerReLU.init(d=40, m=3000, outputs=2, seed=12, implicit=True)
    ct.train(model, X[:100], rng.standard_normal((100, 2)), method="kernel", iters=5)
    explicit = model.to_explicit()
    np.testing.assert_array_equal(model.fire_counts(X), explicit.fire_counts(X))
    np.testing.assert_allclose(model.predict(X), explicit.predict(X), rtol=0, atol=1e-13)
    # b exactly at one product: that pair fires in both.  The float64 GEMM and the
    # implicit forward's sums may round a product apart (BLAS kernels differ by CPU), so
    # the tie is a product on which both agree
    W = model.weights()
    U64 = W @ X.T
    both = (U64[:40] > 0) & (U64[:40] == _forward_products(W[:40], X))
    assert both.sum() > 100  # most products round alike
    r, j = np.argwhere(both)[0]
    edge = ct.TwoLayerReLU._of_implicit(model.implicit_weights, model._a, float(U64[r, j]), False)
    counts = edge.fire_counts(X)
    assert counts[j] >= 1
    np.testing.assert_array_equal(counts, edge.to_explicit().fire_counts(X))
    # b just below a product that float32 rounds further below it: only the error bound
    # of the float32 GEMM makes that pair a candidate
    U32 = (W.astype(np.float32) @ X.astype(np.float32).T).astype(np.float64)
    gap = np.where(U64 > 1.0, (U64 - U32) / U64, 0.0)
    r, j = np.unravel_index(np.argmax(gap), gap.shape)
    b = U64[r, j] * (1 - 1e-12)
    assert U32[r, j] < b
    edge = ct.TwoLayerReLU._of_implicit(model.implicit_weights, model._a, float(b), False)
    np.testing.assert_array_equal(edge.fire_counts(X), edge.to_explicit().fire_counts(X))


def test_cli_trains_and_predicts_an_implicit_model(tmp_path):
    from test_cli import run

    out = tmp_path / "run"
    run(
        "train",
        "--data",
        "breast_cancer",
        "--width",
        1024,
        "--iters",
        5,
        "--implicit",
        "--out",
        out,
        "--quiet",
    )
    model = ct.TwoLayerReLU.load(out / "model.npz")
    assert model.implicit and model.m == 1024
    ds = ct.datasets.breast_cancer()
    np.savetxt(tmp_path / "x.csv", ds.X_test, delimiter=",")
    proc = run("predict", "--model", out / "model.npz", "--data", tmp_path / "x.csv")
    assert len(proc.stdout.split()) >= ds.X_test.shape[0]
    bad = run(
        "train",
        "--data",
        "breast_cancer",
        "--width",
        256,
        "--implicit",
        "--method",
        "dense",
        "--out",
        tmp_path / "bad",
        "--quiet",
        check=False,
    )
    assert bad.returncode != 0 and "needs the stored weight matrix" in bad.stderr.splitlines()[-1]


def test_estimators_train_implicit_models():
    pytest.importorskip("sklearn")
    from corrtree.sklearn import CorrTreeClassifier

    ds = ct.datasets.breast_cancer()
    kw = dict(width=2048, iters=20, random_state=0, method="kernel")
    implicit = CorrTreeClassifier(implicit=True, **kw).fit(ds.X_train, ds.y_train)
    assert implicit.model_.implicit
    assert implicit.score(ds.X_test, ds.y_test) > 0.8


def test_wide_benchmark_measures_what_it_reports(tmp_path):
    """The pieces of ``benchmarks/bench_wide.py`` at a tiny size, in this process."""
    from corrtree.bench import wide

    path = str(tmp_path / "wide.npz")
    res = wide.implicit_run(64, 16, 2**11, 6, path)
    assert res["m"] == 2**11 and res["pairs_ever_fired"] > 0
    assert abs(res["final_loss"] - res["dense_forward_loss"]) <= 1e-9 * max(1, res["final_loss"])
    phases = ("generate_s", "gemm_s", "scan_s", "exact_s", "lr_s", "iterations_s")
    assert sum(res[k] for k in phases) <= res["total_s"] + 1e-6
    assert res["file_bytes"] == (tmp_path / "wide.npz").stat().st_size
    pred = wide.predict_run(path, 50, 16)
    assert pred["finite"] and pred["points"] == 50


def test_a_streamed_run_that_would_not_fit_is_refused_in_one_line(monkeypatch):
    import corrtree._validation as v
    from corrtree.training.costs import memory_need

    X, rng = _sphere(128, 16)
    model = ct.TwoLayerReLU.init(d=16, m=2**16, implicit=True)
    implicit = memory_need("kernel", 128, 2**16, 16, 1, 0.05, implicit=True)
    monkeypatch.setattr(v, "available_memory", lambda: 0.5 * implicit)
    with pytest.raises(MemoryError, match=r"method='kernel' at n=128, m=65536, d=16 needs") as err:
        ct.train(model, X, rng.standard_normal(128), method="kernel", iters=2)
    assert "\n" not in str(err.value) and "would fit" in str(err.value)
    assert "'dense'" not in str(err.value)  # a method that cannot train it is not offered


def test_weight_source_and_absorb_update_check_their_input():
    explicit = ct.TwoLayerReLU.init(d=4, m=8, seed=0)
    assert np.array_equal(explicit.weight_source.rows(2, 5), explicit.W[2:5])
    with pytest.raises(ValueError, match="implicit_weights"):
        explicit.implicit_weights  # noqa: B018
    model = ct.TwoLayerReLU.init(d=4, m=8, seed=0, implicit=True)
    X = np.eye(4)[:3]
    indptr = np.zeros(9, dtype=np.int64)
    indptr[1:] = 1
    cols, coef = np.array([2], dtype=np.int32), np.array([0.5])
    bad = {
        "X": (np.full((3, 4), np.nan), indptr, cols, coef, 1.0),
        "columns": (np.eye(5)[:3], indptr, cols, coef, 1.0),
        "indptr": (X, indptr[:-1], cols, coef, 1.0),
        "cols": (X, indptr, np.array([3]), coef, 1.0),
        "coef": (X, indptr, cols, np.array([np.inf]), 1.0),
        "entries": (X, indptr, cols, np.array([0.5, 0.5]), 1.0),
        "alpha": (X, indptr, cols, coef, 0.0),
    }
    before = model.weights()
    for what, args in bad.items():
        with pytest.raises((ValueError, IndexError)):
            model.absorb_update(*args)
        assert np.array_equal(model.weights(), before), what
    model.absorb_update(X, indptr, cols, coef, 1.0)
    want = before.copy()
    want[0] -= 0.5 * X[2]
    np.testing.assert_allclose(model.weights(), want, rtol=0, atol=1e-15)
