"""``corrtree.train``: full-batch gradient descent with a choice of exact methods."""

from __future__ import annotations

import math
import numbers
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._validation import as_matrix
from ..model import TwoLayerReLU, as_targets
from ._base import Trainer
from ._ntk import lambda_max
from .checkpoint import CheckpointError, data_digest, load_checkpoint, save_checkpoint
from .costs import coherence, estimate, fire_share
from .dense import DenseTrainer
from .dtree import DTreeTrainer
from .history import History
from .kernel import KernelTrainer
from .lazy import LazyTrainer, default_band
from .wtree import WTreeTrainer

__all__ = ["METHODS", "TrainingDiverged", "resume", "train"]

TRAINERS: dict[str, type[Trainer]] = {
    "dense": DenseTrainer,
    "dtree": DTreeTrainer,
    "wtree": WTreeTrainer,
    "lazy": LazyTrainer,
    "kernel": KernelTrainer,
}
METHODS = ("auto", *TRAINERS)


class TrainingDiverged(RuntimeError):
    """The loss became non-finite or kept growing: the learning rate is too large."""


def _check_lr(lr: object) -> float | str:
    if isinstance(lr, str):
        if lr != "auto":
            raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}")
        return lr
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}")
    if not math.isfinite(float(lr)) or float(lr) <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    return float(lr)


def _check_iters(iters: object, name: str = "iters") -> int:
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or int(iters) < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {iters!r}")
    return int(iters)


def auto_lr(trainer: Trainer) -> float:
    """``1 / λ_max(H(0))``, the NTK matrix of the initial fire sets (see :mod:`._ntk`)."""
    indptr, idx = trainer.initial_fire_sets()
    lam = lambda_max(indptr, idx, trainer.G, trainer.a, trainer.ntk())
    if not lam > 0:
        raise ValueError(
            "lr='auto' needs at least one firing pair (no neuron fires on the data at "
            "initialization); give lr explicitly or lower the threshold b"
        )
    return 1.0 / lam


def choose_method(
    X: np.ndarray, G: np.ndarray, model: TwoLayerReLU, iters: int
) -> tuple[str, dict[str, float]]:
    """The exact method with the smallest modelled run time (see :mod:`.costs`).

    Returns the method and the modelled seconds of each candidate.
    """
    n, d = X.shape
    norms = np.linalg.norm(X, axis=1)
    share = fire_share(norms, model.b)
    band_share = fire_share(norms, model.b - default_band(n, model.m, d))
    coh = coherence(G)
    costs = {k: estimate(k, n, model.m, d, model.outputs, iters, share, band_share, coh)
             for k in TRAINERS}
    return min(costs, key=costs.__getitem__), costs


def train(
    model: TwoLayerReLU,
    X: np.ndarray,
    y: np.ndarray,
    method: str = "auto",
    lr: float | str = "auto",
    iters: int = 100,
    callback: Callable[[int, History], bool | None] | None = None,
    *,
    patience: int = 5,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    **options: Any,
) -> History:
    """Train ``model.W`` by full-batch gradient descent, in place.

    ``W(t+1) = W(t) - lr · ∂L/∂W(t)`` with
    ``∂L/∂w_r = (1/sqrt m) · Σ_{i: <w_r, x_i> >= b} (a_r · err_i) · x_i`` and
    ``err_i = f(x_i) - y_i``: the paper's update, only ``W`` trained.  Every
    method follows the same trajectory up to floating-point rounding.

    Parameters
    ----------
    model : TwoLayerReLU
        Trained in place.
    X : array_like, shape (n, d)
        Inputs (the paper assumes unit-norm rows; any finite data works).
    y : array_like, shape (n,) or (n, K)
        Targets, one column per model output.
    method : {"auto", "dense", "dtree", "wtree", "lazy", "kernel"}
        ``"dense"``: BLAS reference; ``"dtree"``/``"wtree"``: the paper's two
        algorithms; ``"lazy"``/``"kernel"``: exact methods whose iterations
        cost O(Σ k̃²) and O((nK)²), independent of ``d``; ``"auto"``: the
        cheapest by a cost model (recorded in ``History.info["costs"]``).
    lr : float or "auto"
        Learning rate; ``"auto"`` is ``1/λ_max`` of the NTK matrix
        ``H = (FᵀF/m) ∘ (XXᵀ)`` of the fire sets at initialization, computed
        from the sparse fire sets.
    iters : int
        Number of gradient steps ``T``.
    callback : callable, optional
        ``callback(t, history)`` after every iteration; returning ``False``
        stops training.
    patience : int
        Stop with :class:`TrainingDiverged` when the loss grows this many
        iterations in a row (or at once when it is not finite).
    checkpoint : path, optional
        Where to write the full training state (see :func:`resume`): every
        ``checkpoint_every`` iterations (0: never on a schedule) and when
        SIGINT (Ctrl-C) arrives, after which :class:`KeyboardInterrupt` is
        raised.  Written atomically.
    checkpoint_every : int
        See ``checkpoint``.
    **options
        Method options (e.g. ``block`` for ``"dense"``, ``band`` for
        ``"lazy"``/``"kernel"``).

    Returns
    -------
    History
    """
    if not isinstance(model, TwoLayerReLU):
        raise ValueError(f"model must be a TwoLayerReLU, got {type(model).__name__}")
    X = model.check_X(X)
    Y = as_targets(y, X.shape[0], model.outputs)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    lr = _check_lr(lr)
    iters = _check_iters(iters)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
    checkpoint_every = _check_iters(checkpoint_every, "checkpoint_every")
    n, d = X.shape
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    G = X @ X.T
    if method == "auto":
        method, info["costs"] = choose_method(X, G, model, iters)
        info["auto"] = True
    trainer = TRAINERS[method](model, X, Y, G, **options)
    trainer.lr = auto_lr(trainer) if lr == "auto" else lr
    trainer.timer.pop()  # preprocessing is not part of the first iteration
    hist = History(method=method, lr=trainer.lr, n=n, m=model.m, d=d, outputs=model.outputs,
                   b=model.b, preprocess_time=time.perf_counter() - t0,
                   info={**info, **trainer.info, "lr_auto": lr == "auto"})
    meta = {"iters": iters, "patience": patience, "checkpoint_every": checkpoint_every}
    if checkpoint is not None:
        meta["data_digest"] = data_digest(X, Y)
    return _run(model, trainer, hist, meta, callback, checkpoint)


def resume(
    path: str | os.PathLike,
    X: np.ndarray,
    y: np.ndarray,
    callback: Callable[[int, History], bool | None] | None = None,
    *,
    iters: int | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> tuple[TwoLayerReLU, History]:
    """Continue a run from a checkpoint written by :func:`train`.

    The trainer's whole state is restored, so the run ends with exactly the
    weights of an uninterrupted one.  ``X`` and ``y`` must be the training
    data of the checkpoint (checked by a SHA-256 digest).  ``iters`` is the
    total number of iterations (default: the checkpointed run's).  Further
    checkpoints go to ``checkpoint`` (default: ``path``).

    Returns
    -------
    model : TwoLayerReLU
        The model, trained in place to the end.
    history : History
        The whole history, from iteration 0.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            outputs = int(np.asarray(data["model_a"]).shape[1])
            d = int(np.asarray(data["model_W"]).shape[1])
    except FileNotFoundError:
        raise
    except Exception as exc:  # corrupt archives raise many types
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    Xc = as_matrix("X", X)
    if Xc.shape[1] != d:
        raise ValueError(f"X has {Xc.shape[1]} columns but the checkpointed model has d={d}")
    Y = as_targets(y, Xc.shape[0], outputs)
    model, trainer, hist, meta = load_checkpoint(path, Xc, Y, Xc @ Xc.T)
    if iters is not None:
        meta["iters"] = _check_iters(iters)
    return model, _run(model, trainer, hist, meta, callback, checkpoint or path)


def _run(model, trainer, hist, meta, callback, checkpoint) -> History:
    """The iterations from ``len(hist)`` to ``meta["iters"]`` (see :func:`train`)."""
    interrupted = []

    def on_sigint(signum, frame):  # finish the iteration, save, then stop
        interrupted.append(signum)

    use_signal = checkpoint is not None and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if use_signal else None
    try:
        for t in range(len(hist), meta["iters"]):
            row = trainer.step()
            hist.append(**row)
            _check_divergence(hist, trainer.lr, meta["patience"])
            if callback is not None and callback(t, hist) is False:
                break
            every = meta["checkpoint_every"]
            if checkpoint is not None and (interrupted or (every and (t + 1) % every == 0)):
                save_checkpoint(checkpoint, model, trainer, hist, meta)
            if interrupted:
                raise KeyboardInterrupt(f"interrupted after iteration {t}; state saved to "
                                        f"{checkpoint}")
    finally:
        if use_signal:
            signal.signal(signal.SIGINT, previous)
    hist.final_loss = trainer.final_loss()
    trainer.finish()
    return hist


def _check_divergence(hist: History, lr: float, patience: int) -> None:
    t = len(hist) - 1
    loss = hist.loss[t]
    if not math.isfinite(loss):
        raise TrainingDiverged(f"loss is {loss} at iteration {t} with lr={lr:.6g}; "
                               "use a smaller lr")
    # growth below 1e-20 of the initial loss is rounding noise, not divergence
    growing = 0
    while (growing < t and hist.loss[t - growing] > hist.loss[t - growing - 1]
           > 1e-20 * hist.loss[0]):
        growing += 1
    if growing >= patience:
        raise TrainingDiverged(
            f"loss grew {patience} iterations in a row, to {loss:.6g}, at iteration {t} "
            f"with lr={lr:.6g}; use a smaller lr"
        )
