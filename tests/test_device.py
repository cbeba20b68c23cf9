"""The array path (``device=``) on ``device="cpu"``: the same trajectory as the CPU
trainers, checkpoints across paths, and the one-line refusals.  The exactness tests run
on ``CORRTREE_TEST_DEVICE`` when it is set (e.g. ``cuda`` on a machine with a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from runs import interrupted

import corrtree as ct

torch = pytest.importorskip("torch")

DEVICE = os.environ.get("CORRTREE_TEST_DEVICE", "cpu")


def _resolved():
    from corrtree._device import resolve

    return resolve(DEVICE)


def _data(n=64, d=10, K=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.standard_normal((n, K)) if K > 1 else rng.standard_normal(n)
    return X, y


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize(
    "kw",
    [{}, {"batch_size": 16, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3, "lr": 0.5}],
)
def test_device_dense_follows_the_cpu_trajectory(K, kw):
    X, y = _data(K=K)
    cpu = ct.TwoLayerReLU.init(d=10, m=2048, outputs=K, seed=1)
    dev = ct.TwoLayerReLU(cpu.W, cpu.a, cpu.b)
    hc = ct.train(cpu, X, y, method="dense", iters=12, **kw)
    hd = ct.train(dev, X, y, method="dense", iters=12, device=DEVICE, **kw)
    assert hd.info["device"] == str(_resolved())
    assert hd.lr == pytest.approx(hc.lr, rel=1e-12)
    np.testing.assert_allclose(hd.loss, hc.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.W, cpu.W, rtol=0, atol=1e-9)
    assert hd.fired_pairs == hc.fired_pairs and hd.flips == hc.flips
    assert hd.moved_neurons == hc.moved_neurons


@pytest.mark.parametrize(("first", "then"), [(DEVICE, None), (None, DEVICE)])
def test_checkpoints_resume_on_the_other_path(tmp_path, first, then):
    X, y = _data(seed=3)
    whole = ct.TwoLayerReLU.init(d=10, m=1024, seed=2)
    part = ct.TwoLayerReLU(whole.W, whole.a, whole.b)
    ct.train(whole, X, y, method="dense", iters=10, lr=1.0, momentum=0.5)
    ck = tmp_path / "run.npz"
    interrupted(
        part,
        X,
        y,
        ck,
        4,
        method="dense",
        iters=10,
        lr=1.0,
        momentum=0.5,
        device=first,
        checkpoint_every=3,
    )
    model, hist = ct.resume(ck, X, y, device=then)
    assert len(hist) == 10
    np.testing.assert_allclose(model.W, whole.W, rtol=0, atol=1e-9)


def test_devices_and_methods_that_are_not_there_are_refused_in_one_line():
    X, y = _data()
    model = ct.TwoLayerReLU.init(d=10, m=256)
    cases = [
        ({"device": "cuda:7"}, "device='cuda:7' is not there; devices found: cpu"),
        ({"device": "warp-drive"}, "is not a device torch knows; devices found: cpu"),
        ({"device": 3}, "device must be a string"),
        ({"device": "cpu", "method": "wtree"}, "method='wtree' has no device path"),
        ({"device": "cpu", "method": "dtree"}, "method='dtree' has no device path"),
        ({"device": "cpu", "method": "dense", "shards": 2}, "device= runs in one process"),
        ({"device": "cpu", "method": "dense", "block": 0}, "block must be >= 1"),
    ]
    if torch.cuda.is_available():
        cases = cases[3:]
    for kw, text in cases:
        with pytest.raises(ValueError, match=text) as err:
            ct.train(model, X, y, iters=1, **{"method": "dense", **kw})
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="unknown option 'band' for method='dense'"):
        ct.train(model, X, y, method="dense", iters=1, device="cpu", band=0.5)


def test_a_run_that_does_not_fit_on_the_device_is_refused_before_it_starts(monkeypatch):
    import corrtree._validation as v

    X, y = _data()
    model = ct.TwoLayerReLU.init(d=10, m=4096)
    W0 = model.W.copy()
    monkeypatch.setattr(v, "available_memory", lambda: 200_000.0)
    with pytest.raises(
        MemoryError,
        match=r"method='dense' at n=64, m=4096, d=10 needs .* available on cpu; m=\d+ would fit",
    ):
        ct.train(model, X, y, method="dense", iters=1, device="cpu")
    np.testing.assert_array_equal(model.W, W0)  # nothing written


def test_the_core_imports_no_torch():
    code = (
        "import sys, numpy as np, corrtree as ct\n"
        "ds = ct.datasets.sphere(n=16, d=4, seed=0)\n"
        "m = ct.TwoLayerReLU.init(d=4, m=64)\n"
        "ct.train(m, ds.X_train, ds.y_train, method='dense', iters=2)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_estimator_and_cli_take_a_device(tmp_path):
    pytest.importorskip("sklearn")
    from test_cli import run

    from corrtree.sklearn import CorrTreeRegressor

    X, y = _data(n=80)
    est = CorrTreeRegressor(width=512, iters=5, method="dense", device="cpu", random_state=0)
    est.fit(X, y)
    assert est.history_.info["device"] == "cpu"
    out = tmp_path / "run"
    run(
        "train",
        "--data",
        "breast_cancer",
        "--width",
        256,
        "--iters",
        3,
        "--device",
        "cpu",
        "--out",
        out,
        "--quiet",
    )
    assert ct.TwoLayerReLU.load(out / "model.npz").m == 256
    bad = run("train", "--data", "breast_cancer", "--device", "cuda:9", "--out", out, check=False)
    assert bad.returncode != 0 and "devices found" in bad.stderr.splitlines()[-1]


def test_gpu_benchmark_runs_on_the_cpu(tmp_path, monkeypatch):
    """``benchmarks/bench_gpu.py``'s measurement, shrunk, on ``device="cpu"``: the first
    losses of every device method agree with PyTorch float64 and the whole runs' weights
    with each other (recorded in the JSON, not asserted there: a disagreement on a device
    must not end the suite), its plan is printed first, and the JSON holds every run."""
    import json

    from corrtree.bench import gpu

    tiny = {**gpu.SIZES["small"], "cases": ("W5", "W1 lr/2"), "threads": (1,)}
    monkeypatch.setitem(gpu.SIZES, "tiny", tiny)
    gpu.run("tiny", str(tmp_path))
    res = json.loads((tmp_path / "gpu_tiny.json").read_text())
    assert set(res["results"]) == {"W5", "W1 lr/2"}
    assert 0 < res["plan"]["planned_s"] <= gpu.PLAN_LIMIT_S
    assert set(gpu._cases(tiny)) == set(res["results"])  # the plan prices what runs
    for case in res["results"].values():
        for method in ("dense", "lazy", "kernel", "auto"):
            assert case["runs"][method]["first_loss_agrees"], method
            if not case["runs"][method]["extrapolated"]:
                assert case["runs"][method]["weights_agree"], method
    runs = res["results"]["W1 lr/2"]["runs"]
    assert {"dense", "auto", "torch float64", "torch float32", "torch tf32"} <= set(runs)
    assert runs["dense"]["lr"] == pytest.approx(runs["auto"]["lr"])
    cpu = res["results"]["W5"]["cpu"]["1"]
    assert cpu["dense"]["total_s"] > 0 and cpu["lazy"]["total_s"] > 0
    # the device's rates measured first, and the model's predictions of the runs
    from corrtree import _config

    measured = set(res["rates_measured"]["rates"])
    assert measured == set(_config.RATE_NAMES) | set(_config.OPTIONAL_RATE_NAMES)
    assert set(_config.RATE_NAMES) <= set(res["rates_stored"]) <= measured
    check = res["results"]["W5"]["model"]
    assert check["rates"] == "measured"
    for method in ("dense", "lazy", "kernel", "torch float64"):
        assert check[method]["predicted_s"] > 0 and check[method]["ratio"] > 0, method
    assert check["kernel"]["steps"] == len(check["kernel"]["launches"]) > 1
    assert "model" not in res["results"]["W1 lr/2"] or not res["results"]["W1 lr/2"]["model"]
    # the README's table of the JSON (benchmarks/tables.py)
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = tables.gpu_table(str(tmp_path), "tiny")
    assert "| W1 lr/2 |" in text and "| W5 | 1 |" in text
    assert "| W5 | kernel | first " in text and "| float64 GEMM flop/s |" in text


def test_gpu_benchmark_runs_take_two_steps_before_their_budget_stops_them():
    """A device run past its budget stops and is extrapolated, but only after its second
    step: on a slow or busy machine the per-step time and a model check still rest on
    steps after the first."""
    from corrtree.bench import gpu

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 8))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Y = rng.uniform(-1.0, 1.0, 64)
    model = ct.TwoLayerReLU.init(8, 256, b=0.3, seed=0)
    for method in ("dense", "kernel"):
        run = gpu.device_run(X, Y, model, method, 0.5, 9, 3, "cpu", budget_s=0.0)
        assert run["extrapolated"] and len(run["iteration_times"]) == gpu.MIN_STEPS, method
        assert run["iteration_s"] == run["iteration_times"][1], method
        whole = gpu.device_run(X, Y, model, method, 0.5, 9, 3, "cpu", budget_s=60.0)
        assert len(whole["iteration_times"]) == (4 if method == "dense" else 9), method


@pytest.mark.parametrize("method", ["lazy", "kernel"])
@pytest.mark.parametrize("K", [1, 3])
def test_device_band_trainers_follow_the_dense_trajectory(K, method):
    """The tracked-pair trainers of the array path: the dense trajectory and its History
    (fire counts, flips), re-anchoring included (small n: many neurons re-anchor)."""
    X, y = _data(n=48, d=8, K=K, seed=5)
    dense = ct.TwoLayerReLU.init(d=8, m=2048, outputs=K, seed=6)
    lazy = ct.TwoLayerReLU(dense.W, dense.a, dense.b)
    hd = ct.train(dense, X, y, method="dense", iters=20)
    hl = ct.train(lazy, X, y, method=method, iters=20, device=DEVICE)
    assert hl.info["device"] == str(_resolved()) and sum(hl.reanchored) > 0
    np.testing.assert_allclose(hl.loss, hd.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(lazy.W, dense.W, rtol=0, atol=1e-9)
    assert hl.fired_pairs == hd.fired_pairs and hl.flips == hd.flips
    assert hl.moved_neurons == hd.moved_neurons


@pytest.mark.parametrize("method", ["lazy", "kernel"])
@pytest.mark.parametrize("by_gemm", [False, True])
def test_device_band_trainers_own_errors_either_way(monkeypatch, method, by_gemm):
    """Each row's share of the errors at its tracked places, ``<a_r, E_j>`` with three
    outputs, by three gathers a place or by the GEMM ``A·Eᵀ`` and one gather: the dense
    trajectory both ways, and the way taken is the one asked for."""
    from corrtree.training import device_band

    taken = []

    def forced(rates, n, Q, K):
        taken.append(K)
        return by_gemm

    monkeypatch.setattr(device_band, "own_by_gemm", forced)
    X, y = _data(n=48, d=8, K=3, seed=5)
    dense = ct.TwoLayerReLU.init(d=8, m=1024, outputs=3, seed=6)
    band = ct.TwoLayerReLU(dense.W, dense.a, dense.b)
    hd = ct.train(dense, X, y, method="dense", iters=15)
    hb = ct.train(band, X, y, method=method, iters=15, device=DEVICE)
    assert taken and set(taken) == {3}
    np.testing.assert_allclose(hb.loss, hd.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(band.W, dense.W, rtol=0, atol=1e-9)
    assert hb.fired_pairs == hd.fired_pairs and hb.flips == hd.flips


def test_own_at_against_a_loop_and_its_choice():
    """:func:`own_at` both ways against a loop over the places (pads included), and
    :func:`own_by_gemm`: the GEMM at the H200's rates where a row's ``Q·K`` gathers
    outnumber the products, never with one output or where ``n + 1 > Q·K``."""
    import torch

    from corrtree import _config
    from corrtree.training.device_band import own_at, own_by_gemm

    rng = np.random.default_rng(4)
    n, Q, k = 30, 12, 7
    for K in (1, 4):
        E = rng.standard_normal((n + 1, K))
        E[n] = 0.0  # the pad point
        A = rng.standard_normal((k, K))
        J = rng.integers(0, n + 1, size=(k, Q))
        want = np.array([[A[r] @ E[J[r, q]] for q in range(Q)] for r in range(k)])
        for by_gemm in (False, True):
            got = own_at(torch.as_tensor(E), torch.as_tensor(J), torch.as_tensor(A), by_gemm)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-13, atol=1e-15)
    h200 = _config.DEVICE_RATES["cuda"]
    assert own_by_gemm(h200, 1797, 400, 10)  # W3's digits: 4000 gathers a row against 1798
    assert not own_by_gemm(h200, 1797, 400, 1)
    assert not own_by_gemm(h200, 1797, 100, 10)  # the products would take more memory
    slow_flops = {**h200, "flops64": 1e3}
    assert not own_by_gemm(slow_flops, 1797, 400, 10)


#: device rates under which one way of changing N always wins
_BY_SCATTERS = {
    "flops64": 1.0,
    "flops32": 1.0,
    "gathers": 1e30,
    "scatters": 1e30,
    "bytes": 1.0,
    "sync": 0.0,
    "launch": 0.0,
}
_BY_GEMMS = {
    "flops64": 1e30,
    "flops32": 1e30,
    "gathers": 1.0,
    "scatters": 1.0,
    "bytes": 1e30,
    "sync": 0.0,
    "launch": 0.0,
}


#: the GEMMs' way with the whole visited batch always (a launch costs more than any
#: rows' GEMMs), not the touched rows picked
_BY_WHOLE_BATCH = {**_BY_GEMMS, "flops32": 1e300, "launch": 1.0}


@pytest.mark.parametrize("route", ["scatters", "gemms", "whole"])
@pytest.mark.parametrize("K", [1, 3])
def test_device_kernel_each_route_follows_the_dense_trajectory(monkeypatch, K, route):
    """The device kernel trainer's ways of changing ``N``: entry by entry, or by float32
    GEMMs of the visited rows with a flip (picked from the batch) or of the whole batch,
    with ``H`` rebuilt; one output (the flags alone) and several.  The dense trajectory
    and its History every way, re-anchoring included, and ``H`` equal to the one built
    from the final fire sets."""
    from corrtree import _config
    from corrtree.training.device_kernel import DeviceKernelTrainer

    rates = {"gemms": _BY_GEMMS, "whole": _BY_WHOLE_BATCH, "scatters": _BY_SCATTERS}[route]
    monkeypatch.setitem(_config.DEVICE_RATES, _resolved().type, rates)
    events, trainers = [], []
    add, keep = DeviceKernelTrainer._add_counts, DeviceKernelTrainer._counts
    change = DeviceKernelTrainer._change_counts

    def adding(self, *args, **kwargs):
        events.append(("add", args[0].shape[0]))
        return add(self, *args, **kwargs)

    def counts(self):
        trainers.append(self)
        return keep(self)

    def changing(self, J, *args, **kwargs):
        events.append(("change", J.shape[0]))
        return change(self, J, *args, **kwargs)

    monkeypatch.setattr(DeviceKernelTrainer, "_add_counts", adding)
    monkeypatch.setattr(DeviceKernelTrainer, "_counts", counts)
    monkeypatch.setattr(DeviceKernelTrainer, "_change_counts", changing)
    X, y = _data(n=48, d=8, K=K, seed=5)
    dense = ct.TwoLayerReLU.init(d=8, m=2048, outputs=K, seed=6)
    kernel = ct.TwoLayerReLU(dense.W, dense.a, dense.b)
    hd = ct.train(dense, X, y, method="dense", iters=20)
    hk = ct.train(kernel, X, y, method="kernel", iters=20, device=DEVICE)
    assert sum(hk.reanchored) > 0 and sum(hk.flips) > 0
    (t,) = trainers
    # each count after the set-up's with the visit's batch size before it
    pairs = zip(events[1:], events[:-1], strict=True)
    after = [(e[1], s) for e, s in pairs if e[0] == "add"]
    assert events[0][0] == "add" and all(s[0] == "change" for _, s in after)
    added = [(rows, s[1]) for rows, s in after]
    if route == "scatters":  # the set-up's count only
        assert not added
    elif route == "whole":  # each visit with flips: its whole batch
        assert len(added) > 1 and all(rows == batch for rows, batch in added)
    else:  # the touched rows picked: fewer than the batch somewhere
        assert len(added) > 1 and any(rows < batch for rows, batch in added)
    np.testing.assert_allclose(hk.loss, hd.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(kernel.W, dense.W, rtol=0, atol=1e-9)
    assert hk.fired_pairs == hd.fired_pairs and hk.flips == hd.flips
    H = t.H.clone()
    t._counts()  # N and H from the fire sets as they are
    assert bool((t.H == H).all())


def test_device_kernel_visit_reanchors_each_row_at_its_exact_products(monkeypatch):
    """A visit re-anchors every row it visits at ``W(t+1)``: afterwards the row's clock is
    0, its tracked points hold every point whose product is within its band of ``b``, and
    its anchored products are ``<w_r(t+1), x_j>`` of the dense trajectory's row, to
    rounding."""
    from corrtree.training.device_kernel import DeviceKernelTrainer

    X, y = _data(n=48, d=8, seed=5)
    Y = y[:, None]
    model = ct.TwoLayerReLU.init(d=8, m=2048, seed=6)
    tr = DeviceKernelTrainer(model, X, Y, X @ X.T, "auto", device=_resolved())
    visit, visited = DeviceKernelTrainer._visit, []

    def recording(self, idx, live):
        got = visit(self, idx, live)
        visited.append(idx[got[1]].cpu().numpy())  # the rows re-anchored (written)
        return got

    monkeypatch.setattr(DeviceKernelTrainer, "_visit", recording)
    checked = 0
    for t in range(10):
        visited.clear()
        tr.advance(tr.outputs() - Y)
        dense = ct.TwoLayerReLU(model.W, model.a, model.b)
        ct.train(dense, X, y, method="dense", iters=t + 1, lr=tr.lr)
        rows = np.concatenate(visited) if visited else np.zeros(0, dtype=int)
        J = tr.J.cpu().numpy()
        uref, clock = tr.uref.cpu().numpy(), tr.clock.cpu().numpy()
        beta = tr.beta.cpu().numpy()
        for r in rows:
            U = dense.W[r] @ X.T
            places = J[r][J[r] < tr.n]
            np.testing.assert_allclose(uref[r, : places.size], U[places], rtol=0, atol=1e-12)
            assert clock[r] == 0.0
            inside = np.flatnonzero(U >= model.b - beta[r] + 1e-9)
            assert np.isin(inside, places).all()
            checked += 1
    assert checked > 100


def test_device_lazy_certificate_is_what_keeps_it_exact(monkeypatch):
    """With the drift certificate switched off (no neuron ever re-anchored), pairs that
    crossed b outside the band are missed and the trajectory leaves dense's: the test
    above can fail."""
    from corrtree.training import device_band

    X, y = _data(n=48, d=8, seed=5)
    dense = ct.TwoLayerReLU.init(d=8, m=2048, seed=6)
    lazy = ct.TwoLayerReLU(dense.W, dense.a, dense.b)
    ct.train(dense, X, y, method="dense", iters=20)
    monkeypatch.setattr(device_band, "_EPS", -1e300)  # D² clamped to 0: never expires
    ct.train(lazy, X, y, method="lazy", iters=20, device=DEVICE)
    assert np.abs(lazy.W - dense.W).max() > 1e-6


def test_device_kernel_clock_is_what_keeps_it_exact(monkeypatch):
    """With the clocks stopped (no neuron is ever due), the flips are missed and the
    trajectory leaves dense's: the trajectory test can fail."""
    from corrtree.training.device_kernel import DeviceKernelTrainer

    X, y = _data(n=48, d=8, seed=5)
    dense = ct.TwoLayerReLU.init(d=8, m=2048, seed=6)
    kernel = ct.TwoLayerReLU(dense.W, dense.a, dense.b)
    ct.train(dense, X, y, method="dense", iters=20)
    monkeypatch.setattr(DeviceKernelTrainer, "_steps", lambda self, E: 1e-300 * self.clock)
    ct.train(kernel, X, y, method="kernel", iters=20, device=DEVICE)
    assert np.abs(kernel.W - dense.W).max() > 1e-6


def test_device_kernel_with_sgd_follows_the_cpu_kernel():
    """Mini-batches (the error zero outside the batch): the CPU kernel trainer's run,
    History included."""
    X, y = _data(n=48, d=8, K=2, seed=5)
    cpu = ct.TwoLayerReLU.init(d=8, m=2048, outputs=2, seed=6)
    dev = ct.TwoLayerReLU(cpu.W, cpu.a, cpu.b)
    kw = {"method": "kernel", "iters": 24, "batch_size": 16, "lr": 0.5}
    hc = ct.train(cpu, X, y, **kw)
    hd = ct.train(dev, X, y, device=DEVICE, **kw)
    np.testing.assert_allclose(hd.loss, hc.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.W, cpu.W, rtol=0, atol=1e-9)
    assert hd.flips == hc.flips and hd.fired_pairs == hc.fired_pairs


def test_device_kernel_sigma_bounds_the_fire_sets_top_eigenvalue():
    """``σ_r² >= λ_max(G[S_r, S_r])`` for every neuron: the clocks' step bound."""
    from corrtree.training.device_kernel import DeviceKernelTrainer

    X, y = _data(n=40, d=6, seed=2)
    model = ct.TwoLayerReLU.init(d=6, m=512, seed=3)
    tr = DeviceKernelTrainer(model, X, y[:, None], X @ X.T, 0.5, device=_resolved())
    sigma = tr._sigma(tr.F, tr.J).cpu().numpy()
    J, F = tr.J.cpu().numpy(), tr.F.cpu().numpy()
    G = X @ X.T
    for r in range(model.m):
        S = J[r][F[r]]
        top = np.linalg.eigvalsh(G[np.ix_(S, S)])[-1] if S.size else 0.0
        assert sigma[r] ** 2 >= top * (1 - 1e-12)


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_device_band_checkpoint_resumes_bit_for_bit(tmp_path, method):
    X, y = _data(n=48, d=8, K=2, seed=7)
    whole = ct.TwoLayerReLU.init(d=8, m=1024, outputs=2, seed=8)
    part = ct.TwoLayerReLU(whole.W, whole.a, whole.b)
    hw = ct.train(whole, X, y, method=method, iters=15, device=DEVICE)
    ck = tmp_path / "run.npz"
    interrupted(part, X, y, ck, 6, method=method, iters=15, device=DEVICE, checkpoint_every=4)
    model, hist = ct.resume(ck, X, y, device=DEVICE)
    np.testing.assert_array_equal(model.W, whole.W)
    np.testing.assert_array_equal(hist.loss, hw.loss)
    assert hist.flips == hw.flips
    with pytest.raises(ct.training.CheckpointError, match="written by the array path"):
        ct.resume(ck, X, y)
    with pytest.raises(ValueError, match="plain gradient steps"):
        ct.train(part, X, y, method=method, iters=2, device="cpu", momentum=0.5, lr=0.1)


def test_device_lazy_that_would_not_fit_is_refused_in_one_line(monkeypatch):
    import corrtree._validation as v

    X, y = _data()
    model = ct.TwoLayerReLU.init(d=10, m=4096)
    monkeypatch.setattr(v, "available_memory", lambda: 50_000.0)
    with pytest.raises(
        MemoryError, match=r"method='lazy' at n=64, m=4096, d=10 needs .* on cpu; m=\d+ would fit"
    ):
        ct.train(model, X, y, method="lazy", iters=1, device="cpu")


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_device_band_trainers_train_an_implicit_model(method):
    """W(0) regenerated on the device by the generator's torch twin: the explicit dense
    trajectory from the same W(0), and a model that stays implicit (trained twice)."""
    X, y = _data(n=48, d=8, K=2, seed=9)
    implicit = ct.TwoLayerReLU.init(d=8, m=2048, outputs=2, seed=4, implicit=True)
    explicit = implicit.to_explicit()
    for _ in range(2):
        hist = ct.train(implicit, X, y, iters=10, device=DEVICE, method=method)
        ct.train(explicit, X, y, method="dense", iters=10)
        assert hist.method == method and implicit.implicit
        np.testing.assert_allclose(implicit.weights(), explicit.W, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="an implicit model trains there with method='lazy' or"):
        ct.train(implicit, X, y, method="dense", iters=1, device="cpu")


GPU_RATES = {"gemm": 5e13, "gather": 1e11, "stream": 5e11, "launch": 1e-5}


def test_device_cost_model_ranks_the_methods_by_their_work():
    """Calibrated rates of a GPU: the kernel trainer for a wide W1-like run, dense for a
    narrow or short one (launches dominate), and no kernel when its matrices do not fit."""
    from corrtree.training.device_costs import estimate_device

    def costs(m, iters, free=np.inf, n=1024, K=1):
        args = (n, m, 784, K, iters, 0.015, 0.07, 0.03, GPU_RATES, free)
        return {k: estimate_device(k, *args) for k in ("dense", "lazy", "kernel")}

    wide = costs(2**17, 300)
    assert min(wide, key=wide.get) == "kernel" and wide["kernel"] < wide["lazy"]
    narrow = costs(256, 3)
    assert min(narrow, key=narrow.get) == "dense"
    assert costs(2**17, 300, free=1e9, n=8192)["kernel"] == np.inf


def test_device_auto_picks_a_method_that_takes_the_run(monkeypatch):
    """auto on a device: calibrated once (its seconds reported apart from the run), an
    implicit model never gets dense, momentum always does."""
    from corrtree.training import device_costs

    X, y = _data(n=48, d=8, seed=5)
    model = ct.TwoLayerReLU.init(d=8, m=1024, seed=6)
    h1 = ct.train(ct.TwoLayerReLU(model.W, model.a, model.b), X, y, iters=5, device=DEVICE)
    assert h1.info["auto"] and set(h1.info["costs"]) == {"dense", "lazy", "kernel"}
    assert h1.info["calibration_s"] >= 0 and h1.method == min(
        h1.info["costs"], key=h1.info["costs"].get
    )
    assert str(_resolved()) in device_costs._RATES
    hm = ct.train(
        ct.TwoLayerReLU(model.W, model.a, model.b),
        X,
        y,
        iters=3,
        lr=0.1,
        momentum=0.5,
        device=DEVICE,
    )
    assert hm.method == "dense" and set(hm.info["costs"]) == {"dense"}
    # a device where dense would win: an implicit model still gets a band trainer
    monkeypatch.setitem(device_costs._RATES, str(_resolved()), {**GPU_RATES, "gemm": 1e20})
    implicit = ct.TwoLayerReLU.init(d=8, m=1024, seed=6, implicit=True)
    hi = ct.train(implicit, X, y, iters=3, device=DEVICE)
    assert hi.method in ("lazy", "kernel") and "dense" not in hi.info["costs"]
    assert hi.info["calibration_s"] == 0.0


def test_device_kernel_keys_let_quiet_neurons_rest(monkeypatch):
    """Pads are never due, and a neuron is due only when its clock reached a key: as the
    steps shrink, fewer neurons are due (with heavy re-anchoring and wider rows: the
    widths grow without slack, so that rows outgrow them and a second pass runs)."""
    from corrtree.training import device_band, device_kernel
    from corrtree.training.device_kernel import DeviceKernelTrainer

    monkeypatch.setattr(device_band, "_SLACK", 10**9)
    monkeypatch.setattr(device_kernel, "_SLACK", 10**9)

    X, y = _data(n=48, d=8, seed=5)
    Y = y[:, None]
    model = ct.TwoLayerReLU.init(d=8, m=2048, seed=6)
    # a narrow band: re-anchored rows outgrow the padding
    tr = DeviceKernelTrainer(model, X, Y, X @ X.T, "auto", device=_resolved(), band=0.1)
    widths, reanchored = {tr.J.shape[1]}, 0
    for _ in range(25):
        reanchored += tr.advance(tr.outputs() - Y)["reanchored"]
        widths.add(tr.J.shape[1])
        pads = tr.J >= tr.n
        assert torch.isinf(tr.key[pads]).all()
        assert (tr.limit > tr.clock).all()  # every neuron visited when due
    assert reanchored > 0 and len(widths) > 1


def test_pytorch_dense_baseline_leaves_the_model_as_it_was():
    """The benchmark's PyTorch loop updates its weights in place: on the CPU in float64
    they must be a copy of ``W(0)``, not the model's own memory."""
    from corrtree.bench.gpu import torch_dense

    ds = ct.datasets.sphere(n=30, d=5, seed=0)
    model = ct.TwoLayerReLU.init(d=5, m=64, seed=0)
    W0 = model.W.copy()
    Y = ds.y_train.reshape(30, -1)
    res = torch_dense(ds.X_train, Y, model, 0.5, 3, 2, torch.device("cpu"), "float64")
    np.testing.assert_array_equal(model.W, W0)
    assert res["first_loss"] == pytest.approx(model.loss(ds.X_train, ds.y_train), rel=1e-12)


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_device_band_trainers_take_w0_without_a_host_copy(monkeypatch, method):
    """``W(0)`` of an explicit model reaches the device from the model's own memory (on
    ``cpu`` the trainer reads that memory itself); the model's ``W(0)`` is untouched until
    the run writes ``W(T)``, the dense trajectory's."""
    from corrtree.training import device_band

    X, y = _data(n=40, d=6, K=1, seed=3)
    model = ct.TwoLayerReLU.init(d=6, m=512, seed=4)
    dense = ct.TwoLayerReLU(model.W, model.a, model.b)
    W0 = model.W.copy()
    shared, seen = [], []
    upload = device_band._uploaded

    def uploaded(torch_, W, dev):
        out = upload(torch_, W, dev)
        shared.append(out.data_ptr() == W.ctypes.data == model.W.ctypes.data)
        return out

    monkeypatch.setattr(device_band, "_uploaded", uploaded)
    ct.train(
        model, X, y, method=method, iters=6, device="cpu",
        callback=lambda t, h: seen.append(np.array_equal(model.W, W0)),
    )  # fmt: skip
    assert shared == [True] and seen == [True] * 6
    ct.train(dense, X, y, method="dense", iters=6)
    np.testing.assert_allclose(model.W, dense.W, rtol=0, atol=1e-9)


def test_w0_is_uploaded_from_the_model_memory():
    from corrtree.training.device_band import _uploaded

    W = np.arange(12.0).reshape(3, 4)
    W.flags.writeable = False
    on_cpu = _uploaded(torch, W, torch.device("cpu"))
    assert on_cpu.data_ptr() == W.ctypes.data  # no copy on the host
    odd = _uploaded(torch, np.asfortranarray(W.astype(np.float32)), torch.device("cpu"))
    assert odd.dtype == torch.float64 and np.array_equal(odd.numpy(), W)


@pytest.mark.parametrize("longest", [1.0, 1.001])
def test_device_kernel_clocks_wait_only_while_no_neuron_can_be_due(longest):
    """The device kernel trainer lets a step's clock increments wait (one output, no visit
    since its thresholds were set) only while no neuron can be due: at every waiting
    step, each moving neuron's clock plus the waiting steps' own bounds, computed by
    brute force from its fire set (``η/√m·min(σ_r·||e_S||, Σ_S |e_l|·||x_l||)``), stays
    below its limit.  Most late steps wait; a checkpoint's state takes the waiting
    steps' bound (at least their sum) into the clocks; the trajectory is dense's.  Unit
    vectors (the largest norm 1 + 2⁻⁵² after rounding) and points of norms up to 1.001
    (the sums' ratio above every threshold's: the ratio 1 taken over the larger sum)."""
    from corrtree.training.device_kernel import DeviceKernelTrainer

    n, d, m, iters = 64, 32, 2**14, 60
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    X *= rng.uniform(1.0, longest, size=(n, 1))
    y = np.tanh(X @ rng.standard_normal(d))
    y2 = y + 0.3 * np.tanh(X @ rng.standard_normal(d))  # then a new target: visits again
    model = ct.TwoLayerReLU.init(d=d, m=m, seed=6)
    tr = DeviceKernelTrainer(model, X, y[:, None], X @ X.T, "auto", device=_resolved())
    xn = np.linalg.norm(X, axis=1)
    waited, settled, shadow, visits = 0, False, None, []
    for t in range(2 * iters):
        err = tr.outputs() - (y if t < iters else y2)[:, None]
        J, F = tr.J.cpu().numpy(), tr.F.cpu().numpy()
        fire = np.zeros((m, n + 1), dtype=bool)
        fire[np.repeat(np.arange(m), J.shape[1]), J.ravel()] = F.ravel()
        fire = fire[:, :n].astype(np.float64)
        e = err[:, 0]
        bound = fire @ (np.abs(e) * xn)
        if tr._sigmas:  # (an unknown σ, inf, times a zero error: nan, which fmin drops)
            with np.errstate(invalid="ignore"):
                bound = np.fmin(bound, tr.sigma.cpu().numpy() * np.sqrt(fire @ (e * e)))
        bound *= tr.eta_s
        lag, clock = tr._lag, tr.clock.cpu().numpy()
        visits.append(tr.advance(err)["reanchored"] > 0)
        if tr._lag > lag:  # this step waited: its clocks are those of the last update
            waited += 1
            shadow = (clock if lag == 0 else shadow) + bound
            moving = fire.any(axis=1)
            assert not ((shadow >= tr.limit.cpu().numpy()) & moving).any(), t
            if waited == 25:  # a checkpoint's state settles the clocks
                tr.state()
                got = tr.clock.cpu().numpy()  # (the sums' orders differ: to rounding)
                assert tr._lag == 0 and np.all(got >= shadow * (1.0 - 1e-12))
                settled = True
    late = visits[iters + 1 :]  # the new target: steps with visits between waiting ones
    assert waited >= 25 and settled and any(late) and not all(late), (waited, late)
    dense = ct.TwoLayerReLU(model.W, model.a, model.b)
    ct.train(dense, X, y, method="dense", iters=iters, lr=tr.lr)
    ct.train(dense, X, y2, method="dense", iters=iters, lr=tr.lr)
    W = np.empty_like(dense.W)
    tr.write_weights(0, W)
    np.testing.assert_allclose(W, dense.W, rtol=0, atol=1e-9)


def test_device_kernel_clocks_wait_where_the_points_norms_exceed_one():
    """Above the thresholds' grid (``s2/s1 > 1``, points of norm above 1, if only by
    rounding): a step waits when ``s2`` lies below the ratio-1 threshold, which bounds
    every neuron (``max(p, q/ρ) >= max(p, q)/ρ``), and not when it does not."""
    import torch

    from corrtree.training.device_kernel import DeviceKernelTrainer

    n, d, m = 64, 32, 2**14
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    X *= rng.uniform(1.0, 1.001, size=(n, 1)) / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.tanh(X @ rng.standard_normal(d))
    model = ct.TwoLayerReLU.init(d=d, m=m, seed=6)
    tr = DeviceKernelTrainer(model, X, y[:, None], X @ X.T, "auto", device=_resolved())
    for _ in range(200):  # until a step without a visit sets the thresholds
        if tr._skip is not None and tr._lag == 0:
            break
        tr.advance(tr.outputs() - y[:, None])
    assert tr._skip is not None and tr._skip.shape[0] > 1 and tr.R > 1.0
    E = torch.zeros((n + 1, 1), dtype=torch.float64, device=tr.device)
    limit = float(tr._skip[0]) / (tr.eta_s * tr.R * np.sqrt(n))  # s2 at e = c·1: c·R·√n
    for c, waits in ((0.5 * limit, True), (2.0 * limit, False)):
        err = np.full((n, 1), c)  # s2/s1 = R > 1 at the first waiting step
        before = (tr._lag, tr._lag_host)
        assert tr._defers(err, E) is waits, (c, limit)
        tr._lag, tr._lag_host = before
