"""``corrtree.train``: full-batch gradient descent with a choice of exact methods."""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..model import TwoLayerReLU, as_targets
from ._base import Trainer
from ._ntk import lambda_max
from .costs import coherence, estimate, fire_share
from .dense import DenseTrainer
from .dtree import DTreeTrainer
from .history import History
from .kernel import KernelTrainer
from .lazy import LazyTrainer, default_band
from .wtree import WTreeTrainer

__all__ = ["METHODS", "TrainingDiverged", "train"]

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


def _check_iters(iters: object) -> int:
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or int(iters) < 0:
        raise ValueError(f"iters must be an integer >= 0, got {iters!r}")
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
    method : {"auto", "dense", "dtree", "wtree"}
        ``"dense"``: BLAS reference; ``"dtree"``/``"wtree"``: the paper's two
        algorithms; ``"auto"``: the cheapest by a cost model (recorded in
        ``History.info["costs"]``).
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
    **options
        Method options (e.g. ``block`` for ``"dense"``).

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
    growing = 0
    for t in range(iters):
        row = trainer.step()
        hist.append(**row)
        loss = row["loss"]
        if not math.isfinite(loss):
            raise TrainingDiverged(f"loss is {loss} at iteration {t} with lr={trainer.lr:.6g}; "
                                   "use a smaller lr")
        # growth below 1e-20 of the initial loss is rounding noise, not divergence
        growing = growing + 1 if t and loss > hist.loss[t - 1] > 1e-20 * hist.loss[0] else 0
        if growing >= patience:
            raise TrainingDiverged(
                f"loss grew {patience} iterations in a row, to {loss:.6g}, at iteration {t} "
                f"with lr={trainer.lr:.6g}; use a smaller lr"
            )
        if callback is not None and callback(t, hist) is False:
            break
    hist.final_loss = trainer.final_loss()
    trainer.finish()
    return hist
