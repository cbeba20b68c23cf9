"""A slice of neurons and its trainer: the worker's side of sharded training.

A :class:`Shard` lives on one worker (a Dask actor, or an object of the driver's process)
and owns the neurons ``start:stop`` of the network: their rows of ``W``, their output
weights and the method's whole state.  The driver in :mod:`corrtree.distributed` sends it
the error each step and receives its share of the outputs; nothing else travels during
training.  Before a slice's set-up allocates, its modelled memory is checked against
what its worker may still allocate (:func:`_check_shard_memory`).
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import numpy as np

from . import _validation
from ._implicit import ImplicitWeights
from .model import TwoLayerReLU
from .training._choice import shard_need
from .training._ntk import NTKOperator, ntk_matrix
from .training._registry import TRAINERS
from .training.checkpoint import load_checkpoint, save_checkpoint
from .training.history import History
from .training.optim import LinearStep

__all__ = ["SHARD_THREADS", "Shard"]

#: Environment variable: the numba threads a shard may use (set by :func:`local_client`).
SHARD_THREADS = "CORRTREE_SHARD_THREADS"


def _limit_threads() -> None:
    """Apply :data:`SHARD_THREADS` to the calling thread's numba kernels (the limit is
    per thread, and a Dask actor runs its calls in a thread of its own)."""
    limit = os.environ.get(SHARD_THREADS)
    if limit:
        import numba

        most = int(getattr(numba.config, "NUMBA_NUM_THREADS"))  # noqa: B009 - set at import
        numba.set_num_threads(max(1, min(int(limit), most)))


def _peak_rss() -> int:
    """Peak resident memory of this process, bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Shard:
    """The neurons ``start:stop`` of a network of ``width`` and their trainer.

    Created empty on a worker (as a Dask actor) and given its neurons by
    :meth:`prepare`, :meth:`restore` or :meth:`warm`; afterwards every call
    moves at most ``nK``-sized vectors (the rows of ``W`` come only at the
    end, from :meth:`weights`).
    """

    def __init__(self) -> None:
        self.trainer: Any = None  # the slice's Trainer once started
        self._prepared: Any = None  # a Prepared trainer between prepare and start
        self._ntk: NTKOperator | None = None

    # -- building --------------------------------------------------------------------
    def prepare(
        self,
        method: str,
        X: np.ndarray,
        Y: np.ndarray,
        W: np.ndarray | ImplicitWeights,
        a: np.ndarray,
        b: float,
        width: int,
        options: dict[str, Any],
        linear: bool = False,
    ) -> dict:
        """Preprocess the slice (``W``, ``a`` its rows; an implicit slice regenerates its
        own rows from the seed); the learning rate comes later.  ``linear``: steps with
        momentum or weight decay.  The slice's modelled memory is checked first, against
        what this worker may still allocate."""
        _limit_threads()
        self._data(X, Y)
        if isinstance(W, ImplicitWeights):
            self.model = TwoLayerReLU._of_implicit(W, np.array(a), b, squeeze=False)
        else:
            self.model = TwoLayerReLU(W, a, b, copy=False)  # the received rows are this shard's
        _check_shard_memory(method, self.X, self.model, linear, options, width)
        self._prepared = TRAINERS[method].prepare(
            self.model, self.X, self.Y, self.G, width, **options
        )
        return dict(self._prepared.info)

    def ntk(self, dense: bool) -> np.ndarray | None:
        """This slice's share of the NTK matrix at ``W(0)`` (dense), or ``None`` after
        readying :meth:`ntk_product`."""
        _limit_threads()
        indptr, idx = self._prepared.initial_fire_sets()
        width = self._prepared.width
        if dense:
            H = self._prepared.ntk()
            return (
                ntk_matrix(indptr, idx, self.G, self.model.output_weights, width)
                if H is None
                else H
            )
        self._ntk = NTKOperator(
            indptr, idx, self.G, np.array(self.model.output_weights), self.X, width
        )
        return None

    def ntk_product(self, product: str, v: np.ndarray) -> np.ndarray:
        """This slice's share of one product of the NTK operator (``"matvec"``,
        ``"sample_matvec"`` or ``"ritz"``) with ``v``."""
        _limit_threads()
        return getattr(self._ntk, product)(v)

    def start(self, lr: float) -> np.ndarray:
        """Begin training at ``lr``; returns the slice's share of ``u(0)``."""
        _limit_threads()
        self.trainer = self._prepared.start(lr)
        self._prepared = self._ntk = None
        return self.trainer.outputs()

    def restore(self, path: str, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Take the exact state of a shard file; returns the slice's share of ``u``."""
        _limit_threads()
        self._data(X, Y)
        self.model, self.trainer, _, _ = load_checkpoint(path, self.X, self.Y, self.G)
        return self.trainer.outputs()

    def warm(
        self,
        method: str,
        pieces: list[tuple[str, int, int]],
        X: np.ndarray,
        Y: np.ndarray,
        width: int,
        lr: float,
        options: dict[str, Any],
    ) -> np.ndarray:
        """Start from ``W(t)`` of old shards: ``pieces`` are ``(file, first, last)``, the
        rows of each old shard file that belong to this slice, in order."""
        _limit_threads()
        self._data(X, Y)
        rows, a = [], []
        for path, first, last in pieces:
            model, trainer, _, _ = load_checkpoint(path, self.X, self.Y, self.G)
            rows.append(trainer.weights(first, last))
            a.append(np.array(model.output_weights[first:last]))
            b = model.b
            del model, trainer
        self.model = TwoLayerReLU(np.concatenate(rows), np.concatenate(a), b)
        _check_shard_memory(method, self.X, self.model, False, options, width)
        prepared = TRAINERS[method].prepare(self.model, self.X, self.Y, self.G, width, **options)
        self.trainer = prepared.start(lr)
        return self.trainer.outputs()

    def _data(self, X: np.ndarray, Y: np.ndarray) -> None:
        self.X, self.Y = X, Y
        self.G = X @ X.T

    # -- training ----------------------------------------------------------------------
    def advance(
        self, err: np.ndarray, step: LinearStep | None, batch: np.ndarray | None
    ) -> tuple[dict[str, Any], np.ndarray, int]:
        """One step (``step``: of a linear optimizer): the History row (no loss), the
        share of ``u(t+1)`` at the points ``batch`` of the next step (all: ``None``),
        peak RSS."""
        _limit_threads()
        row = self.trainer.advance(err, step)
        u = self.trainer.outputs() if batch is None else self.trainer.batch_outputs(batch)
        return row, u, _peak_rss()

    def final_outputs(self) -> np.ndarray:
        return self.trainer.outputs()

    def outputs_at(self, X: np.ndarray) -> np.ndarray:
        """The share of the outputs at held-out points ``X``."""
        _limit_threads()
        return self.trainer.outputs_at(X)

    def weights(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (slice-local) of the current weights."""
        _limit_threads()
        return self.trainer.weights(start, stop)

    def implicit_update(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """The slice's coefficients (``BandTrainer.implicit_update``)."""
        _limit_threads()
        return self.trainer.implicit_update()

    def save(self, path: str, meta: dict[str, Any]) -> str:
        """Write this shard's exact state to ``path`` (atomic); returns its digest."""
        _limit_threads()
        history = History(
            method=self.trainer.name,
            lr=self.trainer.lr,
            n=self.X.shape[0],
            m=self.model.m,
            d=self.model.d,
            outputs=self.model.outputs,
            b=self.model.b,
        )
        return save_checkpoint(path, self.model, self.trainer, history, meta)

    def pid(self) -> int:
        return os.getpid()


def _worker_available() -> tuple[float, str]:
    """Bytes this shard's process may still allocate (the host's available memory, and
    under a Dask worker's ``memory_limit`` what its process does not hold yet), and
    whose memory that is."""
    avail = float(_validation.available_memory())
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # no Dask, or not in a worker: shards in-process
        return avail, ""
    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    if limit:
        import psutil

        avail = min(avail, float(limit) - psutil.Process().memory_info().rss)
    return max(avail, 0.0), f" on worker {worker.address}"


def _check_shard_memory(
    method: str,
    X: np.ndarray,
    shard: TwoLayerReLU,
    linear: bool,
    options: dict[str, Any],
    width: int,
) -> None:
    """One line, before the slice's set-up allocates, when the slice of ``shard.m``
    neurons of a network of ``width`` does not fit in this worker's memory; it names the
    width whose slices would fit."""
    need = shard_need(method, X, shard, linear, options)
    avail, where = _worker_available()
    if need(shard.m) <= avail:
        return
    share = shard.m / width
    fits = _validation.widest_fitting(lambda m: need(int(np.ceil(m * share))), width, avail)
    _validation.check_memory(
        need(shard.m),
        f"a shard of {shard.m} neurons of method={method!r} at n={X.shape[0]}, m={width}, "
        f"d={X.shape[1]}",
        f"m={fits} would fit" if fits else "no width fits on this worker",
        available=avail,
        where=where,
    )
