"""Exact training with the neurons sharded over a Dask cluster.

Each worker owns a contiguous slice of neurons: a :class:`Shard` (a Dask actor,
so its state stays on its worker) holds the slice's weights and the method's
whole state -- trees, anchored products, tracked pairs, its share of the NTK
matrix.  The neurons are independent given the error, so one iteration moves
only vectors of length ``nK``: the driver sends ``err = u - Y`` to every shard
and receives each shard's share of the next outputs ``u`` (the kernel method's
share already holds its ``H_s·err`` and flip corrections).  The sum over
shards is the single-process trajectory up to rounding.

``W`` never travels during training: each shard receives its rows once and
the model gets ``W(T)`` block by block at the end.  A checkpoint is one
atomic manifest plus one file per shard; resuming with the same shards
restores every state bit for bit, with another number of workers each new
shard starts from ``W(t)`` of the old shards that cover its neurons (the same
trajectory, exact up to rounding).  A worker that dies stops the run with a
one-line :class:`WorkerLost` that names the checkpoint to resume from.

Needs ``dask.distributed`` (``pip install 'corrtree[distributed]'``) only for
a Dask client; the same driver runs shards in this process without it.
See ``docs/distributed.md``.
"""

from __future__ import annotations

import logging
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import _config, _validation
from ._io import open_npz
from ._shard import SHARD_THREADS, Shard
from ._shard_files import SHARDED_FORMAT, arrays_of, check_manifest, save_shards
from ._threads import OPENBLAS_THREAD_TIMEOUT
from .model import TwoLayerReLU
from .training._base import PHASES
from .training._choice import check_run_memory
from .training._choice import slices as _slices
from .training._loop import STOP_SIGNALS, Run, check_divergence
from .training._ntk import (
    dense_top_eigenvalue,
    lr_from_lambda,
    top_eigenvalue,
    warm_start,
)
from .training._registry import TRAINERS
from .training._state import CheckpointError
from .training.checkpoint import (
    data_digest,
    digest_of,
    model_from_arrays,
    read_manifest,
)
from .training.history import History

__all__ = [
    "SHARDED_FORMAT",
    "Shard",
    "WorkerLost",
    "local_client",
    "resume_sharded",
    "train_sharded",
]

_STATS = ("fired_pairs", "moved_neurons", "flips", "band_pairs", "reanchored", "evaluated_pairs")


class WorkerLost(RuntimeError):
    """A worker holding a shard stopped answering; the message names the checkpoint."""


# ---------------------------------------------------------------------------------------
# Where the shards live: Dask actors, or objects in this process
# ---------------------------------------------------------------------------------------


class _Actors:
    """Shards as Dask actors, one per worker; calls wait without hanging on a dead worker."""

    def __init__(self, client: Any, count: int) -> None:
        workers = list(client.scheduler_info()["workers"])
        if not workers:
            raise ValueError("the Dask client has no workers")
        self.client = client
        self.workers = [workers[k % len(workers)] for k in range(count)]
        futures = [client.submit(Shard, actor=True, workers=[w], pure=False) for w in self.workers]
        self.shards = [f.result() for f in futures]

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        futures = [getattr(s, method)(*a) for s, a in zip(self.shards, args, strict=True)]
        out = []
        for k, fut in enumerate(futures):
            while True:
                try:
                    out.append(fut.result(timeout=1.0))
                    break
                except TimeoutError:
                    if self.workers[k] not in self.client.scheduler_info()["workers"]:
                        raise WorkerLost(f"worker {self.workers[k]} is gone") from None
                except OSError as exc:
                    raise WorkerLost(f"worker {self.workers[k]} is gone ({exc})") from None
        return out

    def memory(self) -> list[dict[str, Any]]:
        return [{"worker": w} for w in self.workers]


class _InProcess:
    """Shards as objects of this process (no Dask): the same driver, e.g. to resume a
    sharded checkpoint on one machine."""

    def __init__(self, count: int) -> None:
        self.shards = [Shard() for _ in range(count)]
        self.workers = ["this process"] * count

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        return [getattr(s, method)(*a) for s, a in zip(self.shards, args, strict=True)]


def local_client(workers: int, threads: int = 1, silence_logs: int = logging.CRITICAL):
    """A ``LocalCluster`` of ``workers`` processes bound to 127.0.0.1 (no dashboard),
    each limited to ``threads`` threads (numba and BLAS included), and its client.

    ``silence_logs`` is the level below which Dask's own log lines (scheduler,
    nanny, workers) stay off the terminal.  corrtree reports what goes wrong in a
    worker as an exception in the driver (a shard's error, or :class:`WorkerLost`),
    so by default only critical lines pass: a heartbeat cut short while the
    cluster closes would otherwise print a traceback after a run's one-line error.
    Give ``logging.WARNING`` (Dask's default) to see the cluster's own diagnostics.
    """
    workers = _validation.check_positive_int("workers", workers)
    threads = _validation.check_positive_int("threads", threads)
    if isinstance(silence_logs, bool) or not isinstance(silence_logs, int):
        raise TypeError(
            f"silence_logs must be a logging level such as logging.WARNING, got {silence_logs!r}"
        )
    from dask.distributed import Client, LocalCluster

    limit = str(threads)
    # numba's own variable cannot change once its threads run (dask sets a worker's
    # environment around the spawn); shards apply SHARD_THREADS themselves
    env = {
        SHARD_THREADS: limit,
        "OMP_NUM_THREADS": limit,
        "OPENBLAS_NUM_THREADS": limit,
        "MKL_NUM_THREADS": limit,
        "OPENBLAS_THREAD_TIMEOUT": OPENBLAS_THREAD_TIMEOUT,
    }
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        # the scheduler's HTTP server (health and metrics, no dashboard) on a free port:
        # on Dask's default 8787 a second cluster on the machine warns over three lines
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        env=env,
        silence_logs=silence_logs,
    )
    client = Client(cluster)
    # the cluster returns once its worker processes start, which may be before each has
    # registered with the scheduler; a run sized from the registered workers must see all
    client.wait_for_workers(workers, timeout=120)
    return client


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def train_sharded(
    model: TwoLayerReLU,
    X: np.ndarray,
    Y: np.ndarray,
    method: str,
    lr: float | str,
    meta: dict[str, Any],
    client: Any,
    callback: Callable | None,
    checkpoint: Any,
    options: dict[str, Any],
    shards: int | None,
    run: Run,
) -> History:
    """:func:`corrtree.train` with ``client``: one shard per worker (or ``shards``)."""
    if method not in TRAINERS:
        raise ValueError(
            f"method must be one of {', '.join(TRAINERS)} with a client "
            f"(not 'auto'), got {method!r}"
        )
    t0 = time.perf_counter()
    if shards is None:
        shards = len(client.scheduler_info()["workers"]) if client is not None else 1
    count = max(1, min(shards, model.m))
    if client is None:  # every shard in this process: their sum must fit here
        check_run_memory(method, X, model, run.sgd.linear, options, shards=count)
    pool = _Actors(client, count) if client is not None else _InProcess(count)
    slices = _slices(model.m, count)
    a = model.output_weights
    if model.implicit:  # no rows travel: each shard regenerates its own
        if not TRAINERS[method].implicit_ok:
            raise ValueError(f"method={method!r} needs the stored weight matrix")
        rows: list[Any] = [model.implicit_weights.shard(s, e) for s, e in slices]
    else:
        rows = [model.W[s:e] for s, e in slices]  # views: no copies
    infos = pool.call(
        "prepare",
        [
            (method, X, Y, W, a[s:e], model.b, model.m, options, run.sgd.linear)
            for W, (s, e) in zip(rows, slices, strict=True)
        ],
    )
    t_lr = time.perf_counter()
    if lr == "auto":
        order = X.shape[0] * model.outputs
        if order <= _config.NTK_DENSE_MATVEC_LIMIT:  # the shares, summed once
            lam = dense_top_eigenvalue(sum(pool.call("ntk", [(True,)] * count)))
        else:  # Lanczos from a warm start, one round trip per product
            pool.call("ntk", [(False,)] * count)

            def summed(product: str) -> Callable:
                return lambda v: sum(pool.call("ntk_product", [(product, v)] * count))

            v0 = warm_start(X.shape[0], model.outputs, summed("sample_matvec"), summed("ritz"))
            lam = top_eigenvalue(order, summed("matvec"), v0=v0)
        lr = lr_from_lambda(lam, run.loss.curvature)
    info = {
        **infos[0],
        "lr_s": time.perf_counter() - t_lr,
        "shards": count,
        "workers": pool.workers,
        "slices": slices,
    }
    parts = pool.call("start", [(lr,)] * count)
    hist = History.of_run(
        method, float(lr), model, X, t0, {**info, "lr_auto": meta.get("lr_auto", False)}
    )
    meta = {**meta, "options": options}
    return _drive(model, X, Y, pool, slices, parts, hist, meta, callback, checkpoint, run)


def resume_sharded(
    path: Any,
    manifest: dict[str, Any],
    X: np.ndarray,
    Y: np.ndarray,
    client: Any,
    callback: Callable | None,
    checkpoint: Any,
    iters: int | None,
    shards: int | None,
    run: Run,
) -> tuple[TwoLayerReLU, History]:
    """Continue a sharded run: bit for bit with the same shards, from ``W(t)`` otherwise."""
    path = Path(path)
    check_manifest(path, manifest)
    meta = dict(manifest["meta"])
    if meta.get("data_digest") != data_digest(X, Y):
        raise CheckpointError(f"{path} was written for different training data")
    files = [path.parent / s["file"] for s in manifest["shards"]]
    old = [(int(s["start"]), int(s["stop"])) for s in manifest["shards"]]
    for f, shard in zip(files, manifest["shards"], strict=True):
        if not f.is_file():
            raise CheckpointError(f"{path}: shard file {f.name} is missing")
        if read_manifest(f).get("digest") != shard.get("digest"):
            raise CheckpointError(
                f"{path}: shard file {f.name} is not the one the manifest recorded"
            )
    m = old[-1][1]
    if shards is None:
        shards = len(client.scheduler_info()["workers"]) if client is not None else len(old)
    count = max(1, min(shards, m))
    slices = _slices(m, count)
    if slices != old:  # new shards start from W(t): W(t) is their W(0), α(t) their 1
        if _implicit_run(path):
            raise ValueError(
                f"an implicit run resumes on its own {len(old)} shards only (new shards "
                f"would start from stored rows of W(t)); got shards={count}"
            )
        if run.sgd.momentum > 0:
            raise ValueError(
                f"a run with momentum resumes on its own {len(old)} shards only (the "
                f"momentum buffers live in them); got shards={count}"
            )
        meta["optimizer"] = {"alpha": 1.0, "beta": 0.0}
    pool = _Actors(client, count) if client is not None else _InProcess(count)
    if slices == old:
        parts = pool.call("restore", [(str(f), X, Y) for f in files])
    else:
        pieces = [
            [
                (str(f), max(s, os_) - os_, min(e, oe) - os_)
                for f, (os_, oe) in zip(files, old, strict=True)
                if os_ < e and oe > s
            ]
            for s, e in slices
        ]
        parts = pool.call(
            "warm",
            [(manifest["method"], p, X, Y, m, manifest["lr"], manifest["options"]) for p in pieces],
        )
    hist = History.from_dict(manifest["history"])
    arrays = arrays_of(path)
    if manifest.get("digest") != digest_of(manifest, arrays):
        raise CheckpointError(f"checkpoint {path} is damaged (its digest does not match)")
    model = model_from_arrays(path, arrays, manifest, X.shape[1], Y.shape[1])
    if iters is not None:
        meta["iters"] = iters
    hist.info.update(shards=count, workers=pool.workers, slices=slices)
    return model, _drive(
        model, X, Y, pool, slices, parts, hist, meta, callback, checkpoint or path, run
    )


def _drive(model, X, Y, pool, slices, parts, hist, meta, callback, checkpoint, run) -> History:
    """The iterations from ``len(hist)`` to ``meta["iters"]``, then ``W(T)`` into ``model``."""
    count = len(slices)
    stop: list[int] = []

    def on_signal(signum, frame):
        stop.append(signum)

    use_signal = checkpoint is not None and threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS} if use_signal else {}
    rss = [0] * count
    last_saved = None
    t = len(hist) - 1
    try:
        opt = run.start(model, hist, meta, Y.shape[0])
        if hist.method in ("lazy", "kernel"):
            opt.check_scaling(model.b, len(hist))
        u = sum(parts)
        first = opt.batch(len(hist))
        u = u if first is None else u[first]
        for t in range(len(hist), meta["iters"]):
            t0 = time.perf_counter()
            err, loss, step = opt.errors(t, u, Y)
            following = opt.batch(t + 1) if t + 1 < meta["iters"] else None
            results = pool.call("advance", [(err, step, following)] * count)
            if isinstance(pool, _Actors):  # what crossed the network, serialized
                moved = count * len(pickle.dumps(err, protocol=5)) + sum(
                    len(pickle.dumps(r, protocol=5)) for r in results
                )
                hist.info["bytes_per_iteration"] = moved
            rows = [r[0] for r in results]
            u = sum(r[1] for r in results)
            rss = [max(a, r[2]) for a, r in zip(rss, results, strict=True)]
            row = {k: sum(r[k] for r in rows) for k in _STATS}
            times = {f"time_{p}": max(r[f"time_{p}"] for r in rows) for p in PHASES}
            # what the slowest shard did not spend, the driver spent moving vectors
            times["time_forward"] += max(0.0, time.perf_counter() - t0 - sum(times.values()))
            hist.append(loss=loss, **row, **times)
            hist.info["worker_peak_rss"] = rss
            run.end_step(
                hist,
                t,
                lambda: sum(pool.call("final_outputs", [()] * count)),
                lambda Xv: sum(pool.call("outputs_at", [(Xv,)] * count)),
                Y,
                meta,
            )
            if callback is not None and callback(t, hist) is False:
                break
            every = meta["checkpoint_every"]
            if checkpoint is not None and (stop or (every and (t + 1) % every == 0)):
                last_saved = save_shards(Path(checkpoint), pool, slices, model, hist, meta)
            if stop:
                raise KeyboardInterrupt(
                    f"interrupted after iteration {t}; state saved to {checkpoint}"
                )
        hist.final_loss = run.loss.value(sum(pool.call("final_outputs", [()] * count)), Y)
        check_divergence(hist, hist.lr, meta["patience"])
        _gather_weights(model, X, pool, slices)
    except WorkerLost as exc:
        where = (
            f"resume from the checkpoint {checkpoint} (iteration {last_saved})"
            if last_saved is not None
            else f"resume from {checkpoint} if an earlier checkpoint is there"
            if checkpoint is not None
            else "no checkpoint was written"
        )
        raise WorkerLost(f"{exc} at iteration {t + 1}; {where}") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return hist


def _implicit_run(path: Path) -> bool:
    """Whether the sharded checkpoint at ``path`` holds an implicit model."""
    with open_npz(path) as data:
        return "model_w_seed" in data.files


def _gather_weights(model: TwoLayerReLU, X: np.ndarray, pool, slices) -> None:
    """``W(T)`` into the model in rounds: every shard sends its next block of rows at
    once, so that the driver holds at most :data:`~corrtree._config.MODEL_BLOCK_BYTES`.
    An implicit model gathers the shards' coefficients instead (O(pairs), no rows)."""
    if model.implicit:
        parts = pool.call("implicit_update", [()] * len(slices))
        indptr = np.zeros(model.m + 1, dtype=np.int64)
        for (s, e), (ip, _, _, _) in zip(slices, parts, strict=True):
            indptr[s + 1 : e + 1] = np.diff(ip)
        np.cumsum(indptr, out=indptr)
        cols = np.concatenate([p[1] for p in parts])
        coef = np.concatenate([p[2] for p in parts])
        model.absorb_update(X, indptr, cols, coef, parts[0][3])
        return
    block = _config.block_rows(8 * model.d * len(slices), model.m, _config.MODEL_BLOCK_BYTES)
    longest = max(e - s for s, e in slices)
    for lo in range(0, longest, block):
        bounds = [(min(lo, e - s), min(lo + block, e - s)) for s, e in slices]
        for (s, _), (a, _), rows in zip(slices, bounds, pool.call("weights", bounds), strict=True):
            if rows.shape[0]:
                model.set_weights(rows, start=s + a)
