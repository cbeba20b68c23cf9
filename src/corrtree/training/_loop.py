"""The run loop's pieces that the one-process driver (:mod:`._train`) and the sharded
one (:mod:`corrtree.distributed`) share: the stop signals, the optimizer and held-out
data of a run, and the divergence check."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _config
from ..model import TwoLayerReLU
from ._state import CheckpointError
from .history import History
from .losses import LOSSES, Loss
from .optim import SGD, Optimizer

__all__ = ["STOP_SIGNALS", "Run", "TrainingDiverged", "check_divergence", "check_eval_set"]

#: Signals that stop a run with a checkpoint after the current iteration.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingDiverged(RuntimeError):
    """The loss became non-finite or exploded: the learning rate is too large.

    Attributes
    ----------
    lr : float
        The learning rate of the run that diverged.
    """

    def __init__(self, message: str, lr: float) -> None:
        super().__init__(message)
        self.lr = lr


class Run:
    """The optimizer of a run and its held-out data: what the one-process loop and
    the sharded one (:mod:`corrtree.distributed`) share."""

    def __init__(
        self,
        sgd: SGD,
        eval_set: tuple[np.ndarray, np.ndarray] | None,
        loss: Loss = LOSSES["squared"],
    ) -> None:
        self.sgd, self.eval_set, self.loss = sgd, eval_set, loss

    def start(self, model: TwoLayerReLU, hist: History, meta: dict[str, Any], n: int) -> Optimizer:
        """The :class:`Optimizer` at step ``len(hist)`` (its state from ``meta`` on resume)."""
        if self.eval_set is not None:
            self.eval_set = check_eval_set(model, self.eval_set, self.loss)
            hist.info["test_points"] = self.eval_set[0].shape[0]
        hist.info["loss"] = self.loss.name
        self.opt = Optimizer(self.sgd, n, hist.lr, meta["iters"], self.loss)
        if "optimizer" in meta:
            try:
                self.opt.restore(meta["optimizer"])
            except (AttributeError, ValueError) as exc:
                raise CheckpointError(
                    f"the checkpoint's optimizer state is damaged ({exc})"
                ) from None
        hist.info["steps_per_epoch"] = self.opt.per_epoch
        hist.info["batch_size"] = self.opt.size
        self.records = self.opt.size < n or self.eval_set is not None
        return self.opt

    def end_step(
        self,
        hist: History,
        t: int,
        outputs: Callable[[], np.ndarray],
        outputs_at: Callable[[np.ndarray], np.ndarray],
        Y: np.ndarray,
        meta: dict[str, Any],
    ) -> None:
        """After step ``t``: the epoch's losses if it ended one, the divergence check,
        and the optimizer's state into ``meta`` (for checkpoints)."""
        meta["optimizer"] = self.opt.state()
        if self.loss.probabilistic:
            hist.accuracy.append(self.opt.accuracy)
        if self.records and self.opt.ends_epoch(t):
            t0 = time.perf_counter()
            hist.epoch_loss.append(self.loss.value(outputs(), Y))
            test = math.nan
            if self.eval_set is not None:
                Xv, Yv = self.eval_set
                test = self.loss.value(outputs_at(Xv), Yv)
            hist.epoch_test_loss.append(test)
            hist.info["eval_s"] = hist.info.get("eval_s", 0.0) + time.perf_counter() - t0
        check_divergence(hist, hist.lr, meta["patience"])


def check_eval_set(
    model: TwoLayerReLU, eval_set: Any, loss: Loss = LOSSES["squared"]
) -> tuple[np.ndarray, np.ndarray]:
    """Held-out data ``(X, y)`` checked against the model, ``y`` as the loss's targets."""
    if not isinstance(eval_set, tuple | list) or len(eval_set) != 2:
        raise ValueError("eval_set must be a pair (X, y)")
    Xv = model.check_X(eval_set[0])
    Yv = loss.targets(eval_set[1], Xv.shape[0], model.outputs, "eval_set's y", training=False)
    return Xv, Yv


def check_divergence(hist: History, lr: float, patience: int) -> None:
    """Raise :class:`TrainingDiverged` if the run's losses are not finite, exploded, or
    grew ``patience`` times in a row.  Full batch: the loss of every iteration and the
    final one, once known.  Mini-batches: the batch losses for the first two rules
    (they rise and fall with the batches), the losses of the epochs for all three."""
    final = [] if math.isnan(hist.final_loss) else [hist.final_loss]
    if hist.info.get("steps_per_epoch", 1) > 1:
        _diverged(hist.loss, len(hist), lr, None, "step")
        _diverged(hist.epoch_loss, len(hist.epoch_loss), lr, patience, "epoch")
    else:
        _diverged([*hist.loss, *final], len(hist), lr, patience, "iteration")


def _diverged(losses: list[float], done: int, lr: float, patience: int | None, unit: str) -> None:
    if not losses:
        return
    t = len(losses) - 1
    loss = losses[t]
    where = f"at {unit} {t}" if t < done else "after the last iteration"
    if not math.isfinite(loss):
        raise TrainingDiverged(f"loss is {loss} {where} with lr={lr:.6g}; use a smaller lr", lr)
    if loss > _config.DIVERGED_GROWTH * max(losses[0], 1e-300):
        raise TrainingDiverged(
            f"loss exploded from {losses[0]:.6g} to {loss:.6g} {where} with lr={lr:.6g}; "
            "use a smaller lr",
            lr,
        )
    if patience is None:
        return
    # growth below 1e-20 of the initial loss is rounding noise, not divergence
    growing = 0
    while growing < t and losses[t - growing] > losses[t - growing - 1] > 1e-20 * losses[0]:
        growing += 1
    if growing >= patience:
        raise TrainingDiverged(
            f"loss grew {patience} {unit}s in a row, to {loss:.6g}, {where} "
            f"with lr={lr:.6g}; use a smaller lr",
            lr,
        )
