"""The lazy and kernel trainers reproduce dense gradient descent exactly."""

import itertools
import mmap
import pickle
import sys

import numpy as np
import pytest

import corrtree as ct
from corrtree.training._pool import CAP, Pool, zeros
from corrtree.training.band import row_groups

FAST = ["lazy", "kernel"]


def _problem(n, m, d, outputs, seed, b_scale=1.0):
    ds = ct.datasets.sphere(n=n, d=d, outputs=outputs, seed=seed)
    model = ct.TwoLayerReLU.init(d=d, m=m, outputs=outputs, seed=seed + 1)
    model = ct.TwoLayerReLU(model.W, model.a, model.b * b_scale)
    return ds.X_train, ds.y_train, model


def _run(model0, X, y, method, **kw):
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    hist = ct.train(model, X, y, method=method, **kw)
    return hist, model.W.copy()


def assert_same_trajectory(hist, W, ref_hist, ref_W):
    """Loss at every iteration and final W as dense's (float64, 1e-9 relative)."""
    loss, ref = np.asarray(hist.loss), np.asarray(ref_hist.loss)
    assert loss.shape == ref.shape
    np.testing.assert_allclose(loss, ref, rtol=1e-9, atol=1e-12 * ref[0])
    assert np.linalg.norm(W - ref_W) <= 1e-9 * np.linalg.norm(ref_W)
    assert hist.fired_pairs == ref_hist.fired_pairs
    assert hist.flips == ref_hist.flips


@pytest.mark.parametrize("method", FAST)
@pytest.mark.parametrize(
    ("n", "m", "d", "outputs", "seed"),
    [(1, 3, 2, 1, 0), (30, 500, 8, 1, 1), (120, 3000, 24, 1, 2), (40, 800, 12, 3, 3)],
)
def test_same_trajectory_as_dense(method, n, m, d, outputs, seed):
    X, y, model0 = _problem(n, m, d, outputs, seed, b_scale=0.7)
    ref = _run(model0, X, y, "dense", lr="auto", iters=20)
    hist, W = _run(model0, X, y, method, lr="auto", iters=20)
    assert hist.method == method and hist.lr == ref[0].lr
    assert_same_trajectory(hist, W, *ref)


@pytest.mark.parametrize(
    ("rank", "enter", "leave", "own"),
    [
        (32, 0.25, 0.05, None),  # the defaults: own clocks on this coherent data
        (32, 0.0, np.inf, "half"),  # own and global clocks in turn, a switch every step
        (32, np.inf, 0.0, "all"),  # own clocks throughout
        (32, np.inf, 0.0, "all, no move"),  # own clocks without the step's own norm
        (0, 0.0, 0.0, "none"),  # no leading directions: the global clock only
    ],
)
def test_kernel_clocks_keep_the_trajectory(monkeypatch, rank, enter, leave, own):
    """Which neurons the kernel trainer visits, by own clocks or the global one, and
    switches between them, change nothing of the trajectory."""
    from corrtree import _config
    from corrtree.training import kernel

    monkeypatch.setattr(_config, "PROJECTION_RANK", rank)
    monkeypatch.setattr(_config, "OWN_CLOCK_ENTER", enter)
    monkeypatch.setattr(_config, "OWN_CLOCK_LEAVE", leave)
    if own == "all, no move":
        monkeypatch.setattr(_config, "OWN_CLOCK_MOVE_DIM", 0)
    ct.warmup("kernel")  # loaded first: a first run's warm-up trains too, and would count
    calls = []
    inner = kernel.own_clocks
    monkeypatch.setattr(kernel, "own_clocks", lambda *a: calls.append(1) or inner(*a))
    X, y, model0 = _problem(70, 1500, 6, 2, 8, b_scale=0.8)
    ref = _run(model0, X, y, "dense", iters=16)
    hist, W = _run(model0, X, y, "kernel", iters=16)
    assert_same_trajectory(hist, W, *ref)
    expected = {"half": 8, "all": 16, "all, no move": 16, "none": 0}
    if own is None:
        assert len(calls) > 0
    else:
        assert len(calls) == expected[own]


@pytest.mark.parametrize("method", FAST)
@pytest.mark.parametrize(
    ("band", "anchor", "gemm"),
    list(itertools.product([0.05, 3.0], ["float64", "float32"], ["float64", "float32"])),
)
def test_options_keep_the_trajectory(method, band, anchor, gemm):
    """Tiny bands (re-anchoring all the time) or wide ones; float32 storage or GEMM."""
    X, y, model0 = _problem(80, 1500, 16, 2, 5)
    ref = _run(model0, X, y, "dense", iters=15)
    hist, W = _run(model0, X, y, method, iters=15, band=band, anchor_dtype=anchor, gemm_dtype=gemm)
    assert_same_trajectory(hist, W, *ref)
    assert hist.info["anchor_dtype"] == anchor and hist.info["gemm_dtype"] == gemm
    if band == 0.05:
        assert sum(hist.reanchored) > 0
    # every firing pair is tracked (a dropped band tracks no more than those: settle_band)
    assert all(e >= f for e, f in zip(hist.band_pairs, hist.fired_pairs, strict=True))


@pytest.mark.parametrize("method", FAST)
@pytest.mark.parametrize("scatter", [0.0, 1e9])
def test_values_from_g_or_from_the_data_keep_the_trajectory(monkeypatch, method, scatter):
    """Pair values and drift bounds read from ``G`` or rebuilt from ``X``."""
    X, y, model0 = _problem(60, 1200, 40, 2, 6, b_scale=0.8)
    ref = _run(model0, X, y, "dense", iters=25)
    monkeypatch.setattr(ct._config, "SCATTER_COST", scatter)
    # the lazy trainer's route by the moves reads no G: its coefficient route here
    opts = {"moves": False} if method == "lazy" else {}
    hist, W = _run(model0, X, y, method, iters=25, band=0.2, **opts)
    assert_same_trajectory(hist, W, *ref)
    assert sum(hist.flips) > 0 and sum(hist.reanchored) > 0


@pytest.mark.parametrize("scatter", [0.0, 1e9])
def test_early_reanchoring_keeps_the_trajectory(monkeypatch, scatter):
    """Isotropic data at ``lr="auto"``: the error shrinks several times a step, so the
    kernel trainer re-anchors at the first step the neurons whose path will leave their
    band (:func:`~corrtree.training._clocks.lookahead`), skipping their values; with the
    look-ahead off they are re-anchored later.  Both follow dense, by either route."""
    X, y, model0 = _problem(64, 3000, 64, 1, 8)
    ref = _run(model0, X, y, "dense", iters=12)
    monkeypatch.setattr(ct._config, "SCATTER_COST", scatter)
    first = []
    for contraction in (ct._config.LOOKAHEAD_CONTRACTION, 0.0):
        monkeypatch.setattr(ct._config, "LOOKAHEAD_CONTRACTION", contraction)
        hist, W = _run(model0, X, y, "kernel", iters=12)
        assert_same_trajectory(hist, W, *ref)
        first.append(hist.reanchored[0])
    assert first[0] > 2 * first[1]


def test_lookahead_is_the_geometric_tail_of_fast_contractions():
    from corrtree.training._clocks import lookahead

    assert lookahead(1.0, 4.0) == pytest.approx(1 / 3)
    assert lookahead(0.0, 4.0) == 0.0
    assert lookahead(3.0, 4.0) == 0.0  # slow contraction: no look-ahead
    assert lookahead(1.0, 0.0) == 0.0 and lookahead(0.0, 0.0) == 0.0


@pytest.mark.parametrize("method", FAST)
def test_too_tight_certificate_is_caught(method):
    """Shrinking the drift bounds on purpose misses crossings: the checks above fail."""
    X, y, model0 = _problem(60, 1500, 16, 1, 2)
    ref = _run(model0, X, y, "dense", iters=15)
    hist, W = _run(model0, X, y, method, iters=15, _certificate_scale=0.3)
    with pytest.raises(AssertionError):
        assert_same_trajectory(hist, W, *ref)


def test_too_tight_own_clocks_are_caught(monkeypatch):
    """The kernel trainer's own clocks with the step's own norm (low-dimensional data),
    shrunk on purpose, miss crossings: the trajectory check fails."""
    from corrtree import _config

    monkeypatch.setattr(_config, "PROJECTION_RANK", 32)
    monkeypatch.setattr(_config, "OWN_CLOCK_ENTER", np.inf)
    monkeypatch.setattr(_config, "OWN_CLOCK_LEAVE", 0.0)
    X, y, model0 = _problem(70, 1500, 6, 2, 8, b_scale=0.8)
    assert X.shape[1] <= _config.OWN_CLOCK_MOVE_DIM
    ref = _run(model0, X, y, "dense", iters=16)
    hist, W = _run(model0, X, y, "kernel", iters=16, _certificate_scale=0.3)
    with pytest.raises(AssertionError):
        assert_same_trajectory(hist, W, *ref)


def test_own_clocks_visit_fewer_neurons_with_the_steps_own_norm(monkeypatch):
    """On low-dimensional data (scikit-learn's diabetes set, d = 10) the step's own norm
    makes fewer neurons due than the triangle and σ bounds alone, and the trajectory is
    the dense one either way."""
    from sklearn.datasets import load_diabetes

    from corrtree import _config
    from corrtree.training import kernel

    X, y = load_diabetes(return_X_y=True)
    X, y = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    X, y = X[:200], y[:200]
    model0 = ct.TwoLayerReLU.init(d=10, m=2048, seed=3)
    ref = _run(model0, X, y, "dense", iters=30)
    visited = {}
    inner = kernel.KernelTrainer._visit
    for move in (True, False):
        monkeypatch.setattr(_config, "OWN_CLOCK_MOVE_DIM", 16 if move else 0)
        rows = []

        def counted(self, r, *args, rows=rows, **kwargs):
            rows.append(len(r))
            return inner(self, r, *args, **kwargs)

        monkeypatch.setattr(kernel.KernelTrainer, "_visit", counted)
        hist, W = _run(model0, X, y, "kernel", iters=30)
        assert_same_trajectory(hist, W, *ref)
        visited[move] = sum(rows)
    assert visited[True] < 0.9 * visited[False], visited


@pytest.mark.parametrize("method", FAST)
def test_many_flips_and_none(method):
    X, y, model0 = _problem(50, 1200, 10, 1, 7)
    lr = ct.train(ct.TwoLayerReLU(model0.W, model0.a, model0.b), X, y, method="dense", iters=0).lr
    for scale in (1.8, 1e-6):  # large steps (flips early) and tiny ones (no flip at all)
        ref = _run(model0, X, y, "dense", lr=lr * scale, iters=6, patience=6)
        hist, W = _run(model0, X, y, method, lr=lr * scale, iters=6, patience=6)
        assert_same_trajectory(hist, W, *ref)
        if scale > 1:
            assert sum(ref[0].flips) > 100
        else:
            assert sum(ref[0].flips) == 0


def test_kernel_outputs_are_the_model_outputs():
    """The kernel trainer never computes f(x) directly: compare with predict."""
    X, y, model0 = _problem(40, 900, 8, 2, 9)
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    hist = ct.train(model, X, y, method="kernel", iters=10)
    assert hist.final_loss == pytest.approx(model.loss(X, y), rel=1e-9, abs=1e-12)


def test_kernel_needs_room_for_the_ntk_matrix(monkeypatch):
    from corrtree import _config

    X, y, model = _problem(20, 100, 4, 1, 0)
    monkeypatch.setattr(_config, "available_memory", lambda: 100)
    with pytest.raises(MemoryError, match="NTK matrix"):
        ct.train(model, X, y, method="kernel", iters=1)


@pytest.mark.parametrize("method", FAST)
@pytest.mark.parametrize(
    ("option", "value"),
    [("gemm_dtype", "float16"), ("anchor_dtype", "int64"), ("anchor_dtype", "no such type")],
)
def test_bad_dtype_options(method, option, value):
    X, y, model = _problem(20, 100, 4, 1, 0)
    with pytest.raises(ValueError, match=f"{option} must be 'float32' or 'float64'"):
        ct.train(model, X, y, method=method, iters=1, **{option: value})


def test_default_storage_follows_the_gemm():
    X, y, model = _problem(20, 100, 4, 1, 0)
    assert ct.train(model, X, y, method="lazy", iters=1).info["anchor_dtype"] == "float32"
    hist = ct.train(model, X, y, method="lazy", iters=1, gemm_dtype="float64")
    assert hist.info["anchor_dtype"] == "float64"


@pytest.mark.parametrize("method", FAST)
def test_bad_band(method):
    X, y, model = _problem(20, 100, 4, 1, 0)
    with pytest.raises(ValueError, match="band must be > 0"):
        ct.train(model, X, y, method=method, band=0.0)


def test_auto_picks_the_cheapest_modelled_method():
    X, y, model = _problem(64, 20000, 32, 1, 0)
    hist = ct.train(model, X, y, iters=3)
    costs = hist.info["costs"]
    assert set(costs) == {"dense", "dtree", "wtree", "lazy", "kernel"}
    assert hist.method == min(costs, key=costs.get)
    assert hist.method in FAST  # wide and sparse: the implicit methods win


@pytest.mark.parametrize("records", [1, 7, 2**30])  # a neuron a group, a few, one group
def test_kernel_flip_record_groups_keep_the_trajectory(monkeypatch, records):
    X, y, model0 = _problem(60, 1200, 16, 2, 8, b_scale=0.8)
    ref = _run(model0, X, y, "dense", iters=15)
    monkeypatch.setattr(ct._config, "FLIP_RECORD_ENTRIES", records)
    hist, W = _run(model0, X, y, "kernel", iters=15)
    assert_same_trajectory(hist, W, *ref)
    assert sum(hist.flips) > 0


@pytest.mark.parametrize("budget", [1, 3, 5, 6, 100])
@pytest.mark.parametrize("counts", [[], [3], [10], [3, 3, 3], [0, 4, 0, 2, 9, 1, 1]])
def test_row_groups_cover_the_rows_within_the_budget(counts, budget):
    counts = np.array(counts, dtype=np.int64)
    bounds = row_groups(counts, budget)
    assert bounds[0] == 0 and bounds[-1] == len(counts)
    if len(counts) == 0:
        assert bounds == [0, 0]  # one empty group
        return
    assert all(b0 < b1 for b0, b1 in itertools.pairwise(bounds))
    for b0, b1 in itertools.pairwise(bounds):
        # within the budget unless one row alone exceeds it; a group stops only when
        # the next row would not fit
        assert counts[b0:b1].sum() <= budget or b1 - b0 == 1
        if b1 < len(counts):
            assert counts[b0 : b1 + 1].sum() > budget


def _in_mmap(a: np.ndarray) -> bool:
    return isinstance(getattr(a.base, "obj", a.base), mmap.mmap)


def test_pool_zeros_in_small_page_memory(monkeypatch):
    monkeypatch.setattr(ct._config, "POOL_SMALL_PAGES_BYTES", 64)
    big, small = zeros(100, np.float64), zeros(7, np.int32)
    assert _in_mmap(big) == sys.platform.startswith("linux")  # 800 bytes: small pages
    assert not _in_mmap(small)  # 28 bytes: numpy's own
    for a, n, dt in ((big, 100, np.float64), (small, 7, np.int32)):
        assert a.shape == (n,) and a.dtype == dt and not a.any()
        assert a.flags.writeable and a.flags.c_contiguous and a.flags.aligned
    big[:] = np.arange(100.0)
    assert np.array_equal(pickle.loads(pickle.dumps(big)), np.arange(100.0))
    assert zeros(0, np.float64).shape == (0,)


def test_band_buffers_in_small_page_memory_zeroed_and_reused(monkeypatch):
    """The band trainers' scratch buffers (GEMM blocks, flip records) live in small pages
    where the platform can say so: a transparent huge page's first touch may wait for
    the kernel to compact memory."""
    from corrtree.training._anchors import BandState

    monkeypatch.setattr(ct._config, "POOL_SMALL_PAGES_BYTES", 64)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 5))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    W0, a = rng.standard_normal((30, 5)), np.ones((30, 1))
    st = BandState(W0, X, X @ X.T, a, 0.3, 0.4, gemm_dtype="float32")
    assert {"leaves", "weights32"} <= set(st._buffers)  # the set-up GEMM's blocks
    linux = sys.platform.startswith("linux")
    for name, have in st._buffers.items():
        assert _in_mmap(have) == (linux and have.nbytes >= 64), name
    buf = st.buffer("scratch", (20, 10))
    assert buf.shape == (20, 10) and buf.dtype == np.float64 and not buf.any()
    assert _in_mmap(st._buffers["scratch"]) == linux
    buf[:] = 1.0
    # reused while large enough (contents kept: the caller overwrites what it reads)
    again = st.buffer("scratch", (5, 10))
    assert np.shares_memory(again, buf) and again.shape == (5, 10)
    # a larger request is a fresh zeroed buffer with a quarter to spare
    grown = st.buffer("scratch", (40, 10))
    assert not np.shares_memory(grown, buf) and not grown.any()
    assert st._buffers["scratch"].shape == (500,) and _in_mmap(st._buffers["scratch"]) == linux
    small = st.buffer("flags", (3,), np.bool_)  # 3 bytes: numpy's own memory
    assert small.dtype == np.bool_ and not small.any() and not _in_mmap(st._buffers["flags"])


def test_pool_growth_in_small_page_memory_keeps_the_entries(monkeypatch):
    monkeypatch.setattr(ct._config, "POOL_SMALL_PAGES_BYTES", 1)
    pool = Pool(16)
    seg = np.zeros((3, 5), dtype=np.int64)
    pool.place(seg, np.arange(3), np.array([2, 3, 1]))
    used = pool.used
    pool.arrays.uref[:used] = np.arange(used) + 0.5
    pool.arrays.j[:used] = np.arange(used)
    pool.reserve(1000)
    assert pool.capacity >= used + 1000
    assert _in_mmap(pool.arrays.uref) == sys.platform.startswith("linux")
    assert np.array_equal(pool.arrays.uref[:used], np.arange(used) + 0.5)
    assert np.array_equal(pool.arrays.j[:used], np.arange(used))
    assert not pool.arrays.uref[used:].any() and not pool.arrays.fire.any()
    pool.use_velocities()
    assert pool.arrays.vel.shape == (pool.capacity,) and not pool.arrays.vel.any()


def test_pool_reserves_room_to_reanchor_and_states_keep_the_used_places():
    X, y, model0 = _problem(60, 1200, 16, 2, 8, b_scale=0.8)
    trainer = ct.training.lazy.LazyTrainer(model0, X, y.reshape(60, -1), X @ X.T, lr=0.5)
    pool, seg = trainer.store.pool, trainer.store.seg
    caps = seg[:, CAP].sum()  # the set-up's places, slack included
    assert pool.used == caps
    # the reserve, estimated from the first block, leaves room for re-anchored segments
    assert pool.capacity >= 1.5 * caps
    assert pool.nbytes == pool.used * sum(a.itemsize for a in pool.arrays if a.shape[0])
    arrays, scalars = trainer.state()
    assert scalars["pool_used"] == pool.used
    assert all(arrays[f"pool_{k}"].shape == (pool.used,) for k in ("j", "val", "fire"))


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_pool_in_small_page_memory_keeps_the_trajectory(monkeypatch, method):
    X, y, model0 = _problem(60, 1200, 16, 2, 8, b_scale=0.8)
    ref = _run(model0, X, y, "dense", iters=15)
    monkeypatch.setattr(ct._config, "POOL_SMALL_PAGES_BYTES", 1)  # every field in mmap memory
    hist, W = _run(model0, X, y, method, iters=15)
    assert_same_trajectory(hist, W, *ref)
    assert sum(hist.flips) > 0


@pytest.mark.parametrize("moves", [True, False])
@pytest.mark.parametrize(
    ("outputs", "loss", "band", "steps"),
    [
        (1, "squared", None, {}),
        (3, "squared", 0.05, {}),  # tiny bands: re-anchoring all the time
        (3, "cross_entropy", None, {"batch_size": 16, "shuffle_seed": 3}),
        (1, "logistic", 0.2, {"batch_size": 20, "schedule": "cosine"}),
        (2, "squared", 0.2, {"momentum": 0.5}),  # linear steps: the moves are handed back
    ],
)
def test_lazy_moves_and_coefficients_keep_the_trajectory(moves, outputs, loss, band, steps):
    """The lazy trainer's two routes (each neuron's move since its anchor kept and
    stepped, or rebuilt from the coefficients every step) follow dense, with K = 1 and
    3, every loss, mini-batches, schedules and momentum."""
    X, y, model0 = _problem(60, 1500, 12, outputs, 4, b_scale=0.8)
    if loss != "squared":
        y = np.argmax(y, axis=1) if outputs > 1 else (y > np.median(y)).astype(float)
    opts = {"iters": 18, "loss": loss, **steps}
    ref = _run(model0, X, y, "dense", **opts)
    hist, W = _run(model0, X, y, "lazy", band=band, moves=moves, **opts)
    if "batch_size" in steps:  # the histories count pairs differently: losses and W
        np.testing.assert_allclose(hist.loss, ref[0].loss, rtol=1e-9)
        assert np.linalg.norm(W - ref[1]) <= 1e-9 * np.linalg.norm(ref[1])
    else:
        assert_same_trajectory(hist, W, *ref)
    assert hist.info["moves"] is (moves and "momentum" not in steps)
    assert sum(hist.flips) > 0
    if band == 0.05:
        assert sum(hist.reanchored) > 0


@pytest.mark.parametrize("moves", [True, False])
def test_too_tight_certificate_is_caught_on_either_lazy_route(moves):
    X, y, model0 = _problem(60, 1500, 16, 1, 2)
    ref = _run(model0, X, y, "dense", iters=15)
    hist, W = _run(model0, X, y, "lazy", iters=15, moves=moves, _certificate_scale=0.3)
    with pytest.raises(AssertionError):
        assert_same_trajectory(hist, W, *ref)


def test_lazy_moves_are_the_coefficients_moves_after_reanchoring():
    """Each neuron's kept move is ``Σ_l (C_rl - cref_rl)·x_l`` to rounding, re-anchored
    neurons (whose moves start again from zero) included, and the drift bounds it."""
    from corrtree.training import _pool
    from corrtree.training.lazy import LazyTrainer

    X, y, model0 = _problem(50, 800, 10, 2, 9, b_scale=0.8)
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    trainer = LazyTrainer(model, X, y, X @ X.T, 0.5, band=0.1)
    reanchored = 0
    for _ in range(12):
        err = trainer.outputs() - y
        reanchored += trainer.advance(err)["reanchored"]
    assert reanchored > 0
    st = trainer.store
    indptr, cols, coef, _ = trainer.implicit_update()
    seg, pool = st.seg, st.pool.arrays
    for r in range(trainer.m):
        s0, ns = seg[r, _pool.START], seg[r, _pool.SUPP]
        j = pool.j[s0 : s0 + ns]
        assert np.array_equal(np.sort(j), np.sort(cols[indptr[r] : indptr[r + 1]]))
        c = dict(zip(cols[indptr[r] : indptr[r + 1]], coef[indptr[r] : indptr[r + 1]], strict=True))
        dc = np.array([c[jj] for jj in j]) - pool.cref[s0 : s0 + ns]
        want = dc @ X[j]
        np.testing.assert_allclose(st.move[r], want, rtol=0, atol=1e-12 * (1 + np.abs(want).max()))
        assert np.linalg.norm(want) <= st.nf[r, _pool.DRIFT] * (1 + 1e-9) + 1e-15


def test_moves_priced_from_the_fire_sets():
    """The moves are kept where their step costs at most LAZY_MOVE_GAIN times the
    coefficient route's, both priced at the set-up's fire sets (2·d·f against
    min(2·d·f, scatter·f·(f + 1)/2) a neuron; neurons that fire nowhere cost nothing),
    and beyond LAZY_MOVE_FREE_DIM features only on coherent data."""
    from corrtree.training.lazy import moves_pay

    long_sets = np.array([40, 0, 25, 60])  # the data route wins each: even
    assert moves_pay(long_sets, 30, 32.0, 0.0)
    assert moves_pay(long_sets, 784, 1e4, 0.5)  # coherent: kept beyond 64 features
    assert not moves_pay(long_sets, 784, 1e4, 0.03)  # random directions at d = 784
    short_sets = np.full(1000, 3)  # G wins: 6 reads of 32 against 2·784 a pair
    assert not moves_pay(short_sets, 784, 32.0, 0.5)
    # one neuron, f = 9, d = 60: by the moves 1080, by G 45·scatter
    gain = ct._config.LAZY_MOVE_GAIN
    f = np.array([9])
    assert moves_pay(f, 60, 1080 / (45 * gain) * 1.01, 0.0)
    assert not moves_pay(f, 60, 1080 / (45 * gain) * 0.99, 0.0)


@pytest.mark.parametrize(("data", "kept"), [("patches", True), ("sphere", False)])
def test_lazy_moves_by_default_beyond_64_features(monkeypatch, data, kept):
    """At d = 108 the default keeps the moves on image patches (coherent, half the
    points firing) and leaves them on random directions with the same fire sets; either
    way the trajectory is dense's."""
    monkeypatch.setenv("CORRTREE_SCATTER_COST", "32")  # a fixed price of a read of G
    if data == "patches":
        ds = ct.datasets.image_patches(n=60, size=6, seed=2)
    else:
        ds = ct.datasets.sphere(n=60, d=108, seed=2)
    X, y = ds.X_train, ds.y_train
    init = ct.TwoLayerReLU.init(d=X.shape[1], m=1500, seed=3)
    model0 = ct.TwoLayerReLU(init.W, init.a, 0.0)  # half the points fire
    ref = _run(model0, X, y, "dense", iters=15)
    hist, W = _run(model0, X, y, "lazy", iters=15)
    assert X.shape[1] == 108
    assert hist.info["moves"] is kept
    assert_same_trajectory(hist, W, *ref)
    assert sum(hist.flips) > 0


@pytest.mark.parametrize(("value", "implicit"), [("yes", False), (1, False), (True, True)])
def test_bad_moves_option(value, implicit):
    X, y, _ = _problem(20, 64, 4, 1, 0)
    model = ct.TwoLayerReLU.init(d=4, m=64, seed=1, implicit=implicit)
    with pytest.raises(ValueError, match="moves"):
        ct.train(model, X, y, method="lazy", iters=1, moves=value)
