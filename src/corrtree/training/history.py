"""Per-iteration record of a training run."""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._io import atomic_write_json, atomic_write_text

__all__ = ["History"]

# Per-iteration columns, in the order of ``History.to_csv``.
COLUMNS = (
    "loss",
    "fired_pairs",
    "moved_neurons",
    "flips",
    "time_query",
    "time_forward",
    "time_backward",
    "time_update",
    "band_pairs",
    "reanchored",
    "evaluated_pairs",
)
# Per-epoch columns (mini-batch runs).
EPOCH_COLUMNS = ("epoch_loss", "epoch_test_loss")


@dataclass
class History:
    """What happened at every iteration ``t`` of gradient descent.

    Attributes
    ----------
    method : str
        The method that ran (``"auto"`` is resolved to the method it chose).
    lr : float
        The learning rate used.
    n, m, d, outputs : int
        Problem size.
    b : float
        Threshold of the model.
    preprocess_time : float
        Seconds spent before the first iteration (products, trees, ``lr="auto"``).
    loss : list of float
        ``L(W(t))`` for ``t = 0 .. T-1``: the run's loss (``info["loss"]``: ``"squared"``,
        ``"logistic"`` or ``"cross_entropy"``), summed over the points (of the batch).
    final_loss : float
        ``L(W(T))`` after the last step.
    fired_pairs : list of int
        ``Σ_i k_{i,t}``, the pairs ``(r, i)`` with ``<w_r(t), x_i> >= b``.
    moved_neurons : list of int
        ``|∪_i S_{i,fire}(t)|``, neurons that fire on some point (only they move).
    flips : list of int
        Pairs whose firing state differs between ``W(t-1)`` and ``W(t)`` (0 at ``t = 0``).
    time_query, time_forward, time_backward, time_update : list of float
        Wall time of the iteration's phases, in seconds.
    band_pairs : list of int
        Lazy and kernel methods: pairs whose exact product is tracked
        (candidates inside the drift band); 0 for the other methods.
    reanchored : list of int
        Lazy and kernel methods: neurons re-anchored at that iteration.
    evaluated_pairs : list of int
        Products computed exactly at that iteration (all ``n·m`` for dense GD,
        ``n`` per moved neuron for the tree methods, the certified few for lazy
        and kernel): divided by the flips, the cost of finding them.
    epoch_loss, epoch_test_loss : list of float
        Mini-batch runs (or runs with an ``eval_set``): the loss on all training
        points, and on the ``eval_set`` (NaN without one), after each epoch.
        With mini-batches, ``loss`` holds the loss of each step's batch and
        ``info["steps_per_epoch"]`` the steps of an epoch.
    accuracy : list of float
        Classification losses (logistic, cross-entropy): the share of the step's points
        (the batch's) whose most probable class at ``W(t)`` is their label; empty for
        the squared loss.
    info : dict
        Method-specific details (the cost model's choice, block sizes, ...).
    """

    method: str
    lr: float
    n: int
    m: int
    d: int
    outputs: int
    b: float
    preprocess_time: float = 0.0
    final_loss: float = math.nan
    loss: list[float] = field(default_factory=list)
    fired_pairs: list[int] = field(default_factory=list)
    moved_neurons: list[int] = field(default_factory=list)
    flips: list[int] = field(default_factory=list)
    time_query: list[float] = field(default_factory=list)
    time_forward: list[float] = field(default_factory=list)
    time_backward: list[float] = field(default_factory=list)
    time_update: list[float] = field(default_factory=list)
    band_pairs: list[int] = field(default_factory=list)
    reanchored: list[int] = field(default_factory=list)
    evaluated_pairs: list[int] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    epoch_test_loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    # while training runs: the trainer's W(t) accessor (see current_weights)
    weights_source: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of_run(
        cls, method: str, lr: float, model: Any, X: np.ndarray, started: float, info: dict[str, Any]
    ) -> History:
        """The empty History of a run of ``model`` on ``X`` whose set-up began at
        ``started`` (``time.perf_counter()``) and ends now."""
        return cls(
            method=method,
            lr=float(lr),
            n=X.shape[0],
            m=model.m,
            d=X.shape[1],
            outputs=model.outputs,
            b=model.b,
            preprocess_time=time.perf_counter() - started,
            info=info,
        )

    def current_weights(self) -> np.ndarray:
        """The weights after the last recorded iteration, as a new ``(m, d)`` array.

        Available while training runs (e.g. in a ``callback`` of
        :func:`corrtree.train`); the model itself receives the weights only at
        the end of the run.  O(md) (the lazy and kernel methods materialize them).
        """
        if self.weights_source is None:
            raise RuntimeError("current_weights() is only available while training runs")
        return self.weights_source()

    def __len__(self) -> int:
        return len(self.loss)

    def append(self, **row: Any) -> None:
        """Record one iteration; every per-iteration column (``loss``, ``fired_pairs``,
        ...) must be given."""
        missing = set(COLUMNS) - set(row)
        if missing:
            raise ValueError(f"missing columns {sorted(missing)}")
        for name in COLUMNS:
            getattr(self, name).append(row[name])

    @property
    def iteration_times(self) -> np.ndarray:
        """Total wall time of each iteration (sum of its phases), seconds."""
        return (
            np.asarray(self.time_query)
            + np.asarray(self.time_forward)
            + np.asarray(self.time_backward)
            + np.asarray(self.time_update)
        )

    @property
    def total_time(self) -> float:
        """Preprocessing plus every iteration, seconds."""
        return self.preprocess_time + float(self.iteration_times.sum())

    def as_dict(self) -> dict[str, Any]:
        """Everything as plain Python values (JSON-ready)."""
        out = {
            k: getattr(self, k)
            for k in (
                "method",
                "lr",
                "n",
                "m",
                "d",
                "outputs",
                "b",
                "preprocess_time",
                "final_loss",
            )
        }
        out.update({k: list(getattr(self, k)) for k in (*COLUMNS, *EPOCH_COLUMNS)})
        out["accuracy"] = list(self.accuracy)
        out["info"] = dict(self.info)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        """Inverse of :meth:`as_dict`."""
        scalars = {k: data[k] for k in ("method", "lr", "n", "m", "d", "outputs", "b")}
        hist = cls(
            **scalars,
            preprocess_time=data.get("preprocess_time", 0.0),
            final_loss=_float(data.get("final_loss")),
            info=dict(data.get("info", {})),
        )
        for k in COLUMNS:
            getattr(hist, k).extend(data.get(k, []))
        for k in EPOCH_COLUMNS:
            getattr(hist, k).extend(_float(v) for v in data.get(k, []))
        hist.accuracy.extend(_float(v) for v in data.get("accuracy", []))
        return hist

    def to_json(self, path: str | os.PathLike) -> None:
        """Write :meth:`as_dict` to ``path`` atomically."""
        atomic_write_json(path, self.as_dict())

    def to_csv(self, path: str | os.PathLike) -> None:
        """One row per iteration (``iteration`` plus every per-iteration column),
        written atomically."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(("iteration", *COLUMNS))
        for t in range(len(self)):
            writer.writerow((t, *(getattr(self, k)[t] for k in COLUMNS)))
        atomic_write_text(path, buf.getvalue())


def _float(value: Any) -> float:
    """A number read back from JSON, where NaN is written as null."""
    return math.nan if value is None else float(value)
