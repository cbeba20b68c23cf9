"""What a user meets first: memory checked before it is spent, unknown options named,
and kernels loaded before a run's clock starts."""

import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import corrtree as ct
from corrtree import _validation
from corrtree.training._choice import method_options


def _fake_free(monkeypatch, nbytes):
    monkeypatch.setattr(_validation, "available_memory", lambda: int(nbytes))


def test_init_that_does_not_fit_is_one_line_before_allocating(monkeypatch):
    _fake_free(monkeypatch, 4 * 2**30)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError) as exc:
            ct.TwoLayerReLU.init(d=784, m=2**21)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(exc.value)
    assert "\n" not in msg
    assert "m=2097152" in msg and "12.27 GiB" in msg and "4.00 GiB" in msg
    assert "m=524288 would fit" in msg  # 8·2^19·785 bytes = 3.07 GiB
    assert peak < 2**20


def test_init_fills_W_in_place():
    tracemalloc.start()
    try:
        model = ct.TwoLayerReLU.init(d=64, m=2**14, seed=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * model.W.nbytes
    rng = np.random.default_rng(3)  # the same draws as one standard_normal((m, d))
    assert np.array_equal(model.W, rng.standard_normal((2**14, 64)))


def test_run_that_does_not_fit_names_what_would(monkeypatch):
    ds = ct.datasets.sphere(n=256, d=64, seed=0)
    model = ct.TwoLayerReLU.init(d=64, m=2**15, seed=0)
    W0 = model.W.copy()
    # the lazy run needs ~82 MB here (16 MB of it the moves it keeps at d = 64), dense
    # ~17 MB; at m = 4096 lazy and the model fit
    _fake_free(monkeypatch, 24 * 2**20)
    with pytest.raises(MemoryError) as exc:
        ct.train(model, ds.X_train, ds.y_train, method="lazy", iters=2)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "method='lazy' at n=256, m=32768" in msg
    assert "method='dense' would fit" in msg and "m=4096 would fit" in msg
    assert np.array_equal(model.W, W0)
    monkeypatch.undo()
    ct.train(model, ds.X_train, ds.y_train, method="lazy", iters=2)  # it fits for real


def test_estimator_with_a_width_that_does_not_fit(monkeypatch):
    from corrtree.sklearn import CorrTreeRegressor

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((50, 8)), rng.standard_normal(50)
    _fake_free(monkeypatch, 2**20)
    with pytest.raises(MemoryError, match=r"TwoLayerReLU\.init"):
        CorrTreeRegressor(width=2**16, iters=2).fit(X, y)


@pytest.mark.parametrize("method", ["dense", "dtree", "wtree", "lazy", "kernel", "auto"])
def test_unknown_option_names_the_option_and_the_accepted_ones(method):
    ds = ct.datasets.sphere(n=16, d=4, seed=0)
    model = ct.TwoLayerReLU.init(d=4, m=64)
    with pytest.raises(TypeError) as exc:
        ct.train(model, ds.X_train, ds.y_train, method=method, iters=1, devcie="cpu")
    msg = str(exc.value)
    assert "'devcie'" in msg and "_prepare" not in msg
    if method != "auto":
        assert f"method={method!r}" in msg


def test_method_options_are_what_the_trainers_take():
    assert method_options("dense") == ("block",)
    assert method_options("dtree") == ()
    assert {"band", "anchor_dtype", "gemm_dtype"} <= set(method_options("kernel"))
    ds = ct.datasets.sphere(n=16, d=4, seed=0)
    for method in ("lazy", "kernel"):  # each accepted option reaches the trainer
        model = ct.TwoLayerReLU.init(d=4, m=64)
        ct.train(model, ds.X_train, ds.y_train, method=method, iters=1, band=0.7)


def test_no_compilation_inside_a_timed_run():
    """In a fresh process: after the warm-up of a method, runs of several shapes, outputs
    and flip patterns add no compiled version to any corrtree kernel, compiled (numba's
    compile events) or loaded from the cache (a dispatcher's overloads, which grow either
    way), so the check holds whatever the cache holds.  The kernel trainer: it reaches
    the most kernels; then an implicit model's."""
    code = """
import gc
import corrtree as ct
from numba.core import event
from numba.core.dispatcher import Dispatcher
from corrtree.training._train import train
from corrtree.training._warmup import ensure

def versions():
    return {
        id(o): (o.py_func.__qualname__, len(o.overloads))
        for o in gc.get_objects()
        if isinstance(o, Dispatcher) and o.py_func.__module__.startswith("corrtree")
    }

def added(before):
    return sorted(
        name for key, (name, count) in versions().items() if count > before.get(key, ("", 0))[1]
    )

ensure(train, "kernel")
before = versions()
assert sum(count > 0 for _, count in before.values()) > 25, before
compiled = []
class Count(event.Listener):
    def on_start(self, ev): pass
    def on_end(self, ev): compiled.append(ev.data["dispatcher"].py_func.__name__)
with event.install_listener("numba:compile", Count()):
    # K > 1; many flips, written in place; few flips on a wide network
    for n, d, m, K in ((40, 16, 2048, 3), (256, 64, 4096, 1), (300, 50, 20000, 1)):
        ds = ct.datasets.sphere(n=n, d=d, outputs=K, seed=0)
        model = ct.TwoLayerReLU.init(d=d, m=m, outputs=K, seed=0)
        hist = ct.train(model, ds.X_train, ds.y_train, method="kernel", iters=20)
        assert hist.info["compile_s"] == 0.0
print("trainer", compiled, added(before))
# an implicit model: its generator, its coefficients, a second run from them
ensure(train, "kernel", False, True)
before = versions()
with event.install_listener("numba:compile", Count()):
    ds = ct.datasets.sphere(n=256, d=64, seed=0)
    model = ct.TwoLayerReLU.init(d=64, m=8192, seed=0, implicit=True)
    for _ in range(2):
        hist = ct.train(model, ds.X_train, ds.y_train, method="kernel", iters=20)
        assert hist.info["compile_s"] == 0.0
print("implicit", compiled, added(before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["trainer [] []", "implicit [] []"]


def test_warmup_reports_loading_from_the_cache():
    took = ct.warmup(["dense"])
    assert took.seconds >= 0 and took.compiled >= 0
    assert ct.warmup(["dense"]) == ct.Warmup(0.0, 0)  # once per process
    with pytest.raises(ValueError, match="methods"):
        ct.warmup(["fast"])


def test_cli_warmup_and_version(capsys):
    from corrtree.cli import main

    assert main(["warmup", "--methods", "dense"]) == 0
    out = capsys.readouterr().out  # compiled now, or loaded from the cache
    assert "once per install" in out or "loaded from the cache" in out
    assert main(["warmup", "--methods", "fast"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'fast'" in err
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"corrtree {ct.__version__}"


def test_progress_rate_leaves_out_what_came_before_the_first_iteration():
    import time

    from corrtree._progress import Progress

    hist = ct.History(method="dense", lr=1.0, n=1, m=1, d=1, outputs=1, b=0.0)
    bar = Progress(10, "dense", quiet=True)
    time.sleep(0.3)  # set-up and compilation
    for name in ("time_query", "time_forward", "time_backward", "time_update"):
        getattr(hist, name).append(0.0025)
    assert bar.rate(0, hist) > 20  # one iteration of 10 ms, not 0.3 s
