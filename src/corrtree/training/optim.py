"""Mini-batch SGD with momentum, weight decay and learning-rate schedules.

The optimizer follows ``torch.optim.SGD`` (dampening 0): with the batch
gradient ``g`` of the batch loss ``L_B = Σ_{i∈B} ℓ(f(x_i), y_i)`` (:mod:`.losses`; the
squared loss: ``½ Σ_{i∈B} ||f(x_i) - y_i||²``),

    d = g + λ·w,    v ← μ·v + d,    w ← w - η_t·(d + μ·v  if nesterov  else  v)

(``v = d`` on the first step, as PyTorch's ``buf = clone(d)``).  The batches
of epoch ``e`` are the consecutive slices of ``B`` points of a permutation
drawn from ``(shuffle_seed, e)``, the last one shorter when ``B`` does not
divide ``n``; every method sees the same batches.

Every such update is linear in ``(w, v)``, so (``docs/design.md``, "SGD")

    w_r(t) = α(t)·w_r(0) - Σ_l C_rl(t)·x_l,    v_r(t) = β(t)·w_r(0) + ...

with the scalars ``(α, β)`` following the same recurrence with no gradient:
``β' = μβ + λα``, ``α' = α - η(β' ...)``.  The explicit trainers (dense, the
trees) keep ``w`` and ``v``; the band trainers keep the coefficients, divided
by ``α(t)``, and compare with the threshold ``b/α(t)``.

Without momentum and weight decay a step is a gradient step whose error is
zero outside the batch and multiplied by the schedule's factor: every
trainer takes it as it takes a full-batch step.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from .losses import LOSSES, Loss

__all__ = ["SCHEDULES", "SGD", "LinearStep", "Optimizer", "explicit_update"]

SCHEDULES = ("constant", "step", "cosine")


class LinearStep(NamedTuple):
    """One step of a linear optimizer (momentum or weight decay), for the trainers."""

    eta: float  # η_t, the learning rate of this step
    mu: float  # momentum μ
    lam: float  # weight decay λ
    nesterov: bool
    alpha: float  # α(t): the factor of W(0) in w(t)
    alpha_next: float  # α(t+1)


@dataclass(frozen=True)
class SGD:
    """What a run's optimizer is (see the module docs); the defaults are full-batch GD.

    Parameters
    ----------
    batch_size : int, optional
        Points per step (``None``: all ``n``, full-batch gradient descent).
    epochs : int, optional
        Passes over the data; the run has ``epochs·ceil(n/batch_size)``
        steps.  ``None``: the number of steps is ``iters``.
    momentum : float
        ``μ`` in ``[0, 1)``.
    nesterov : bool
        Nesterov momentum (needs ``momentum > 0``).
    weight_decay : float
        ``λ >= 0`` (L2 penalty ``λ/2·||W||²``, added to the gradient).
    schedule : {None, "constant", "step", "cosine"} or callable
        Factor of ``lr`` at global step ``t``: ``"step"`` multiplies it by 0.1
        at half and at three quarters of the epochs; ``"cosine"`` is
        ``(1 + cos(π t / T))/2`` over the ``T`` steps; a callable
        ``schedule(t) -> float`` gives the factor itself (finite, ``>= 0``).
    shuffle_seed : int
        Seed of the batch permutations.
    """

    batch_size: int | None = None
    epochs: int | None = None
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: str | Callable[[int], float] | None = None
    shuffle_seed: int = 0

    def __post_init__(self) -> None:
        def integer(name: str, value: Any, low: int) -> None:
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low
            ):
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

        def number(name: str, value: Any, high: float) -> None:
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not 0.0 <= float(value) < high
            ):
                raise ValueError(f"{name} must be a number in [0, {high:g}), got {value!r}")

        integer("batch_size", self.batch_size, 1)
        integer("epochs", self.epochs, 0)
        integer("shuffle_seed", self.shuffle_seed, 0)
        number("momentum", self.momentum, 1.0)
        number("weight_decay", self.weight_decay, math.inf)
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov must be True or False, got {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0")
        if not (self.schedule is None or self.schedule in SCHEDULES or callable(self.schedule)):
            raise ValueError(
                f"schedule must be None, {', '.join(map(repr, SCHEDULES))} or a callable, "
                f"got {self.schedule!r}"
            )

    @property
    def linear(self) -> bool:
        """Whether steps need the trainers' linear update (momentum or weight decay)."""
        return self.momentum > 0 or self.weight_decay > 0

    @property
    def plain(self) -> bool:
        """Full-batch gradient descent at a constant rate: the paper's setting."""
        return self.batch_size is None and not self.linear and self.schedule in (None, "constant")

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready (a callable schedule is recorded as ``"callable"``)."""
        out = asdict(self)
        if callable(self.schedule):
            out["schedule"] = "callable"
        return out

    @classmethod
    def from_meta(cls, data: dict[str, Any], schedule: Callable[[int], float] | None) -> SGD:
        """Inverse of :meth:`to_meta`; ``schedule`` replaces a recorded callable."""
        data = dict(data)
        if data.get("schedule") == "callable":
            data["schedule"] = schedule
        return cls(**data)


class Optimizer:
    """An :class:`SGD` over ``n`` points for ``steps`` steps at base rate ``lr``, with the
    global state of the linear recurrence (``alpha``, ``beta``)."""

    def __init__(
        self, sgd: SGD, n: int, lr: float, steps: int, loss: Loss = LOSSES["squared"]
    ) -> None:
        self.sgd, self.n, self.lr, self.steps = sgd, n, float(lr), int(steps)
        self.loss = loss
        #: the accuracy of the last batch's outputs (classification losses)
        self.accuracy = math.nan
        self.size = n if sgd.batch_size is None else min(sgd.batch_size, n)
        self.per_epoch = -(-n // self.size)
        self.alpha, self.beta = 1.0, 0.0
        self._order: tuple[int, np.ndarray] | None = None

    def state(self) -> dict[str, float]:
        return {"alpha": self.alpha, "beta": self.beta}

    def restore(self, state: dict[str, Any]) -> None:
        alpha, beta = state.get("alpha"), state.get("beta")
        if not (
            isinstance(alpha, float)
            and isinstance(beta, float)
            and math.isfinite(alpha)
            and math.isfinite(beta)
            and alpha > 0
        ):
            raise ValueError(f"bad optimizer state {state!r}")
        self.alpha, self.beta = alpha, beta

    def epoch(self, t: int) -> int:
        return t // self.per_epoch

    def ends_epoch(self, t: int) -> bool:
        """Whether step ``t`` is the last of its epoch."""
        return (t + 1) % self.per_epoch == 0 or t + 1 == self.steps

    def batch(self, t: int) -> np.ndarray | None:
        """The points of step ``t`` (``None``: all of them)."""
        if self.size == self.n:
            return None
        e = self.epoch(t)
        if self._order is None or self._order[0] != e:
            rng = np.random.default_rng([self.sgd.shuffle_seed, e])
            self._order = (e, rng.permutation(self.n))
        k = t - e * self.per_epoch
        return self._order[1][k * self.size : (k + 1) * self.size]

    def factor(self, t: int) -> float:
        """The schedule's factor of ``lr`` at step ``t``."""
        s = self.sgd.schedule
        if s is None or s == "constant":
            return 1.0
        if s == "step":
            epochs = max(1, -(-self.steps // self.per_epoch))
            e = self.epoch(t)
            return 0.1 ** sum(e >= mark for mark in {epochs // 2, 3 * epochs // 4} if mark > 0)
        if s == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t / max(1, self.steps)))
        f = s(t) if callable(s) else None  # SGD checked the names
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 <= float(f) < math.inf:
            raise ValueError(f"schedule({t}) must be a finite number >= 0, got {f!r}")
        return float(f)

    def check_scaling(self, b: float, start: int) -> None:
        """The band trainers compare ``W(t)/α(t)`` with ``b/α(t)``: from step ``start`` on,
        ``α`` must stay positive and, for ``b > 0``, never grow (their certificates
        assume a threshold that does not fall).  A ValueError otherwise."""
        if self.sgd.weight_decay == 0:
            return
        if b < 0:
            raise ValueError("weight_decay with the lazy and kernel methods needs b >= 0")
        alpha, beta = self.alpha, self.beta
        for t in range(start, self.steps):
            nxt, beta = _scalars(self.sgd, alpha, beta, self.lr * self.factor(t))
            if nxt <= 0 or (b > 0 and nxt > alpha):
                raise ValueError(
                    f"weight_decay={self.sgd.weight_decay} with lr={self.lr:.6g} makes the "
                    f"factor of W(0) {'reach 0' if nxt <= 0 else 'grow'} at step {t}; the "
                    "lazy and kernel methods need it to decrease and stay > 0: use a "
                    "smaller weight_decay or lr"
                )
            alpha = nxt

    def errors(
        self, t: int, ub: np.ndarray, Y: np.ndarray
    ) -> tuple[np.ndarray, float, LinearStep | None]:
        """What the trainers take for step ``t`` from ``ub``, the outputs at
        :meth:`batch` ``(t)``: the error ``∂L/∂u`` of every point (zero outside the
        batch; times the schedule's factor unless the step is linear; the loss's
        :meth:`~.losses.Loss.errors`, computed from ``ub`` afresh), the batch loss, and
        the :class:`LinearStep` of a linear optimizer (which advances ``α, β``)."""
        B = self.batch(t)
        Yb = Y if B is None else Y[B]
        eb = self.loss.errors(ub, Yb)
        loss = self.loss.value(ub, Yb)
        if self.loss.probabilistic:
            self.accuracy = self.loss.accuracy(ub, Yb)
        if B is None:
            err = eb
        else:
            err = np.zeros((self.n, Y.shape[1]))
            err[B] = eb
        f = self.factor(t)
        if not self.sgd.linear:
            if f != 1.0:
                err *= f
            return err, loss, None
        eta = self.lr * f
        alpha_next, beta = _scalars(self.sgd, self.alpha, self.beta, eta)
        step = LinearStep(
            eta, self.sgd.momentum, self.sgd.weight_decay, self.sgd.nesterov, self.alpha, alpha_next
        )
        self.alpha, self.beta = alpha_next, beta
        return err, loss, step


def _scalars(sgd: SGD, alpha: float, beta: float, eta: float) -> tuple[float, float]:
    """``(α, β)`` after a step at rate ``eta``: the optimizer's recurrence without gradient."""
    mu, lam = sgd.momentum, sgd.weight_decay
    beta = mu * beta + lam * alpha
    if sgd.nesterov:
        return alpha - eta * (lam * alpha + mu * beta), beta
    return alpha - eta * beta, beta


def explicit_update(W: np.ndarray, V: np.ndarray, grad: np.ndarray, step: LinearStep) -> None:
    """``torch.optim.SGD`` on explicit rows, in place: ``grad`` (overwritten) is the
    batch gradient of the rows ``W``, ``V`` their momentum buffers."""
    if step.lam:
        grad += step.lam * W
    if step.mu:
        V *= step.mu
        V += grad
        if step.nesterov:
            grad += step.mu * V
        else:
            grad[...] = V
    grad *= step.eta
    W -= grad
