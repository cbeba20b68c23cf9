"""What every trainer provides to :func:`corrtree.train`."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..model import TwoLayerReLU

__all__ = ["Timer", "Trainer"]


class Timer:
    """Accumulates wall time per phase: ``with timer("forward"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._phase = ""
        self._t0 = 0.0

    def __call__(self, phase: str) -> Timer:
        self._phase = phase
        return self

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._phase] = (
            self.seconds.get(self._phase, 0.0) + time.perf_counter() - self._t0
        )

    def pop(self) -> dict[str, float]:
        """Times of the phases since the last ``pop``, as History columns."""
        out = {f"time_{k}": self.seconds.get(k, 0.0)
               for k in ("query", "forward", "backward", "update")}
        self.seconds = {}
        return out


class Trainer:
    """Full-batch gradient descent on a :class:`TwoLayerReLU`, one method.

    A trainer does its preprocessing in ``__init__``; ``step`` performs one
    iteration ``W(t) -> W(t+1)`` and returns that iteration's History row;
    ``finish`` leaves ``W(T)`` in the model.
    """

    name = ""

    def __init__(self, model: TwoLayerReLU, X: np.ndarray, Y: np.ndarray, G: np.ndarray) -> None:
        self.model = model
        self.X, self.Y, self.G = X, Y, G
        self.a = model._a
        self.b = model.b
        self.m = model.m
        self.scale = 1.0 / math.sqrt(model.m)
        self.lr = math.nan
        self.timer = Timer()
        self.info: dict[str, Any] = {}

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        """r-major CSR ``(indptr, idx)`` of the fire sets of ``W(0)``."""
        raise NotImplementedError

    def ntk(self) -> np.ndarray | None:
        """The NTK matrix of ``W(0)`` if the method forms it (else ``None``)."""
        return None

    def step(self) -> dict[str, Any]:
        """One gradient step; returns the History row of the iteration."""
        raise NotImplementedError

    def final_loss(self) -> float:
        """Loss at the current weights (after the last step)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Write the current weights into the model."""

    def _loss(self, u: np.ndarray) -> tuple[np.ndarray, float]:
        err = u - self.Y
        return err, 0.5 * float(np.einsum("ik,ik->", err, err))


class TreeTrainer(Trainer):
    """What the paper's two trainers share: a correlation tree holding W and the products."""

    tree: Any  # CorrelationDTree or CorrelationWTree, built by the subclass

    def _outputs(self) -> np.ndarray:
        raise NotImplementedError

    def _gradient_step(self, fire_r: tuple[np.ndarray, np.ndarray], err: np.ndarray
                       ) -> np.ndarray:
        """Sparse gradient on the fired pairs (r-major fire sets), then the tree update
        for every neuron that moved (one batched ``update_many``).  Returns them."""
        from ._sparse import apply_sparse_gradient

        with self.timer("backward"):
            moved = apply_sparse_gradient(self.tree._W, *fire_r, self.X, self.a, err,
                                          self.lr * self.scale)
        with self.timer("update"):
            self.tree._apply(moved, self.tree._W[moved])
        return moved

    def final_loss(self) -> float:
        loss = self._loss(self._outputs())[1]
        self.timer.pop()
        return loss

    def finish(self) -> None:
        self.model._W[...] = self.tree._W
