"""Compiling the numba kernels ahead of a run, so that no speed figure includes it.

corrtree's kernels are compiled by numba the first time they run and cached on disk:
in the package's ``__pycache__`` folders when they are writable, else in numba's user
cache folder (``~/.cache/numba``, or ``NUMBA_CACHE_DIR`` when set), so a system-wide,
read-only install still compiles once per user.  Compiling a method's kernels takes
tens of seconds; loading them from the cache, about a second.

:func:`corrtree.train` calls :func:`ensure` with the method it is about to run, before
its clock starts: the first run of a method in a process trains a tiny problem with it
(compiling or loading every kernel the method can reach), and the time this took is
recorded apart, in ``History.info["compile_s"]`` (``History.info["compiled"]``: how
many functions were compiled, 0 when every one came from the cache).  ``corrtree
warmup`` (or :func:`corrtree.warmup`) does the same for every method ahead of time.  Only the
chosen method's kernels are compiled.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _jit
from ..datasets import sphere
from ..model import TwoLayerReLU
from . import _calibrate, _flips, _heap, _ntk
from ._pool import SIGMA
from ._registry import TRAINERS
from ._sparse import keys_to_csr

__all__ = ["WARM_METHODS", "Warmup", "ensure"]

logger = logging.getLogger("corrtree")

#: The trainers whose kernels :func:`corrtree.warmup` compiles, in this order.
WARM_METHODS = ("dense", "dtree", "wtree", "lazy", "kernel")

#: Seconds to wait for a helper process still compiling when the caller is done (it only
#: fills the cache: what it has not written yet, the caller compiled itself).
_HELPER_WAIT = 2.0

_warm: set[tuple[str, bool, bool]] = set()  # (method, linear steps, implicit) loaded here
_busy = False  # a warm-up is running: its own train() calls do not warm up again


class Warmup(NamedTuple):
    """What a warm-up took: ``seconds`` of wall time and the number of functions
    ``compiled`` (0: every kernel was loaded from numba's cache)."""

    seconds: float
    compiled: int


class _CompileCounter:
    """Counts numba's compile events (loads from the cache raise none) while installed,
    and calls ``on_first`` when the first one starts."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        from numba.core import event

        count = [0]
        started = [False]

        class Listener(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                if not started[0]:
                    started[0] = True
                    on_first()

            def on_end(self, ev: event.Event) -> None:
                count[0] += 1

        self._count = count
        self._guard = event.install_listener("numba:compile", Listener())

    def __enter__(self) -> list[int]:
        self._guard.__enter__()
        return self._count

    def __exit__(self, *exc: Any) -> None:
        self._guard.__exit__(*exc)


def _small() -> tuple[Any, TwoLayerReLU]:
    """The problem with many flips at once (the kernel trainer's flips by rows)."""
    return sphere(n=64, d=256, outputs=2, seed=1), TwoLayerReLU.init(d=256, m=4096, outputs=2)


def _tiny() -> tuple[Any, TwoLayerReLU]:
    """A problem of a few points and neurons."""
    return sphere(n=8, d=4, outputs=2, seed=1), TwoLayerReLU.init(d=4, m=64, outputs=2)


def _late_kernels(method: str) -> None:
    """The kernels a long run adds to a short one: the kernel trainer's heap and its flips
    in place by several threads, and for ``lr="auto"`` beyond the formed NTK matrix the
    sparse mat-vec both ways and the warm start."""
    if method == "kernel":
        _heap_kernels()
        _flips_in_place()
    _ntk_kernels()


def _heap_kernels() -> None:
    """The kernel trainer's heap, which a short run of coherent data does not reach."""
    keys, ids = np.empty(2), np.empty(2, dtype=np.int64)
    size = _heap.push_all(keys, ids, 0, np.arange(2), np.zeros((2, SIGMA + 1)))
    _heap.pop_due(keys, ids, size, 0.0)


def _flips_in_place(by_rows: bool = False) -> None:
    """The kernel trainer's flips written in place by several threads, which the tiny runs
    apply by rows (from a fresh trainer: its set-up's kernels too); with ``by_rows`` the
    flips by rows first (:func:`_helper`: the caller's wide run reaches them late)."""
    tiny, model = _tiny()
    X = tiny.X_train
    t: Any = TRAINERS["kernel"](model, X, tiny.y_train, X @ X.T, "auto")
    none = np.empty(0, dtype=np.int64)
    flips = (none, none, np.empty(0), np.empty(0, np.bool_))
    args = (t.store.seg, t.store.pool.arrays, t.u, t.H)
    scalars = (t.a, t.G, t.b, t.scale, float(t.width))
    if by_rows:
        _flips.apply_flips_by_rows(*flips, *args, np.zeros_like(t.H), *scalars, none)
    _flips._apply_flips(*flips, *args, *scalars, 2)


def _ntk_kernels() -> None:
    """For ``lr="auto"`` beyond the formed NTK matrix: the sparse mat-vec both ways and the
    warm start (no trainer needed)."""
    tiny, model = _tiny()
    X, a = tiny.X_train, model.output_weights
    indptr, idx = keys_to_csr(np.flatnonzero(model.W @ X.T >= model.b), model.m, X.shape[0])
    v = np.ones((X.shape[0], a.shape[1]))
    f32 = (X.astype(np.float32), a.astype(np.float32), v.astype(np.float32))
    _ntk._ntk_matvec_data(indptr, idx, *f32, _ntk._work_bounds(indptr, 2), float(model.m))
    _ntk.ntk_matvec(indptr, idx, X @ X.T, a)(v.ravel())
    _ntk.NTKOperator(indptr, idx, X @ X.T, np.array(a), X).ritz(v[:, 0])
    _ntk._fire_set_norms(indptr, idx, X, np.ones(X.shape[0]), np.array([0, model.m]))


def _tiny_runs(train: Callable[..., Any], method: str, linear: bool) -> None:
    """Train two tiny problems with ``method`` (one with many flips at once), then load
    :func:`_late_kernels`."""
    options = {"batch_size": 4, "momentum": 0.5} if linear else {}
    small, wide = _small()
    train(wide, small.X_train, small.y_train, method=method, iters=3, **options)
    tiny, model = _tiny()
    train(model, tiny.X_train, tiny.y_train, method=method, iters=3, **options)
    _late_kernels(method)


def _helper(method: str) -> None:
    """What a helper process compiles into the cache while the caller compiles the rest,
    in an order that complements the caller's (which trains :func:`_small`'s problem
    first, then :func:`_tiny`'s): the loops that measure the visits' exchange rate
    (:mod:`._calibrate`), which the caller reaches after its first set-up; the late
    kernels that need no trainer; for the kernel
    trainer :func:`_tiny`'s run, whose visits of a few rows take the serial visit
    (``visit_few``, the caller's last long compilation) while the caller compiles the
    parallel one, and its flips by rows and in place; the re-anchoring of the band
    trainers (which a short run reaches last), from a fresh trainer."""
    global _busy
    tiny, _ = _tiny()  # the caller measures its visits' exchange rate after its first set-up
    _calibrate.scatter_cost(tiny.X_train @ tiny.X_train.T, tiny.X_train)
    if method == "kernel":
        _heap_kernels()
    _ntk_kernels()
    if method == "kernel":
        from ._train import train

        _busy = True  # the run's own warm-up is this process's work
        tiny, model = _tiny()
        train(model, tiny.X_train, tiny.y_train, method=method, iters=3)
        _flips_in_place(by_rows=True)
    small, model = _small()
    X = small.X_train
    trainer: Any = TRAINERS[method](model, X, small.y_train, X @ X.T, "auto")
    trainer._reanchor(np.arange(model.m, dtype=np.int64))


#: The helper's first lines, before anything slow is imported: a thread that ends the
#: process once its standard input closes, which happens when the process that started
#: it ends, however it ends (an exception, a signal, SIGKILL), or when it lets go.
_HELPER_CODE = (
    "import os, sys, threading\n"
    "threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()\n"
    "from corrtree.training._warmup import _helper\n"
    "_helper({method!r})\n"
)


def _start_helper(method: str) -> subprocess.Popen | None:
    """A process running :func:`_helper` (``None`` on one core, without a cache to fill,
    or where processes cannot be started): numba compiles on one thread, so two processes
    compile a method's kernels sooner.  A plain interpreter, not ``multiprocessing``,
    whose ``spawn`` would run the caller's main script again; in a session of its own, so
    that a terminal's Ctrl-C reaches only the caller, which ends it
    (:func:`_end_helper`).  It never outlives the caller: it exits when its standard
    input, a pipe only the caller holds, closes."""
    if method not in ("lazy", "kernel") or (os.cpu_count() or 1) < 2 or _jit.uncached:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _HELPER_CODE.format(method=method)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:  # no processes here: compile alone
        return None


def _end_helper(proc: subprocess.Popen, wait: float) -> None:
    """Give the helper ``wait`` seconds to finish writing, then end it.  Its pipe is
    closed first thing in the ``finally``, so that it exits even if a second interrupt
    stops this function before the kill."""
    try:
        if wait > 0:
            proc.wait(wait)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _implicit_runs(train: Callable[..., Any], method: str, linear: bool) -> None:
    """What a run of an implicit model adds (:mod:`corrtree._implicit`): the generator,
    a set-up and re-anchoring from rows with coefficients (a model trained twice), the
    coefficients' export and the float32 forward."""
    options = {"batch_size": 4, "momentum": 0.5} if linear else {}
    small = sphere(n=64, d=256, outputs=2, seed=1)
    model = TwoLayerReLU.init(d=256, m=4096, outputs=2, implicit=True)
    for _ in range(2):
        train(model, small.X_train, small.y_train, method=method, iters=3, **options)
    model.weight_source.take(np.arange(3, dtype=np.int64))
    model.predict(small.X_train)


def ensure(
    train: Callable[..., Any], method: str, linear: bool = False, implicit: bool = False
) -> Warmup:
    """Load (compiling them if the cache has none) the kernels a run of ``method`` uses,
    once per process; ``linear``: steps with momentum or weight decay; ``implicit``: of an
    implicit model.  Returns what it took (``Warmup(0, 0)`` when they are loaded already).

    A compilation is announced on the ``corrtree`` logger (INFO) when it starts; a
    helper process (:func:`_helper`) then compiles part of the kernels into the cache
    at the same time.
    """
    global _busy
    if implicit and method in ("lazy", "kernel"):
        first = ensure(train, method, linear)
        rest = _ensure(train, method, linear, True)
        return Warmup(first.seconds + rest.seconds, first.compiled + rest.compiled)
    return _ensure(train, method, linear, False)


def _ensure(train: Callable[..., Any], method: str, linear: bool, implicit: bool) -> Warmup:
    global _busy
    key = (method, bool(linear), implicit)
    if key in _warm or _busy:
        return Warmup(0.0, 0)
    helper = []

    def first_compile() -> None:
        if _jit.uncached:
            logger.warning(
                "no writable cache folder (NUMBA_CACHE_DIR, the package folder and the "
                "home folder are read-only): compiling the kernels of method=%r in memory, "
                "for this process only; set NUMBA_CACHE_DIR to a writable folder to keep them",
                method,
            )
        else:
            logger.info("compiling the kernels of method=%r, once per install ...", method)
        helper.append(_start_helper(method))

    t0 = time.perf_counter()
    _busy = True
    try:
        with _CompileCounter(first_compile) as count:
            (_implicit_runs if implicit else _tiny_runs)(train, method, linear)
    except BaseException:  # an interrupt, or an error: the helper goes at once
        _busy = False
        for proc in helper:
            if proc is not None:
                _end_helper(proc, 0.0)
        raise
    _busy = False
    for proc in helper:
        if proc is not None:
            _end_helper(proc, _HELPER_WAIT)
    _warm.add(key)
    return Warmup(time.perf_counter() - t0, count[0])
