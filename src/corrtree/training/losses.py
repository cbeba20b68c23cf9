"""The training losses: squared (the paper's), logistic and softmax cross-entropy.

Every method's step depends on the loss only through the error vector
``err = ∂L/∂u`` at the outputs ``u`` of the current weights: the gradient of
``w_r`` is ``(1/sqrt m)·Σ_{i: <w_r, x_i> >= b} a_r·err_i·x_i`` whatever the loss,
so the kernel trainer's recurrence ``u ← u − η·H·err`` (plus the flips'
corrections), the lazy trainer's coefficients and every certificate carry over,
with ``err`` computed from ``u`` at each step (:meth:`Loss.errors`).  Losses are
sums over the points (a mini-batch's loss: over its points), as PyTorch's
``reduction="sum"``:

- ``"squared"``: ``L = ½ Σ_i ||u_i − y_i||²`` and ``err = u − y`` (the paper's);
- ``"logistic"`` (one output, labels in {0, 1}):
  ``L = Σ_i log(1 + e^{u_i}) − y_i·u_i`` and ``err = σ(u) − y``;
- ``"cross_entropy"`` (``K >= 2`` outputs, one-hot ``y``):
  ``L = Σ_i logsumexp(u_i) − <y_i, u_i>`` and ``err = softmax(u) − y``.

Both are evaluated without overflow at any finite output (``log(1 + e^u)`` as
``logaddexp(0, u)``, softmax and log-sum-exp shifted by the row's maximum).
``lr="auto"`` is ``1/(c·λ_max)`` with ``λ_max`` the NTK matrix's largest eigenvalue
and ``c`` the largest eigenvalue of the loss's Hessian in ``u`` over all outputs:
1 for the squared loss, ``1/4`` for the logistic (``σ' <= 1/4``) and ``1/2`` for
cross-entropy (``diag(p) − ppᵀ`` has eigenvalues at most ``1/2``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["LOSSES", "Loss", "get_loss"]


def _sigmoid(u: np.ndarray) -> np.ndarray:
    # exp of a non-positive number only: no overflow
    e = np.exp(-np.abs(u))
    return np.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _softmax(u: np.ndarray) -> np.ndarray:
    z = np.exp(u - u.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


class Loss(NamedTuple):
    """A training loss by name (:data:`LOSSES`): its value and error at outputs ``u``
    ``(n, K)`` and targets ``Y`` ``(n, K)``, the targets it takes, its curvature bound
    (``lr="auto"``) and, for the classification losses, probabilities."""

    name: str
    #: the largest eigenvalue of ``∂²L/∂u²`` for any ``u`` (``lr="auto"`` divides by it)
    curvature: float
    #: whether outputs turn into class probabilities (:meth:`probabilities`)
    probabilistic: bool

    def value(self, u: np.ndarray, Y: np.ndarray) -> float:
        """``L(u, Y)``, summed over the points.  O(nK)."""
        if self.name == "squared":
            e = u - Y
            return 0.5 * float(np.einsum("ik,ik->", e, e))
        if self.name == "logistic":
            return float(np.sum(np.logaddexp(0.0, u) - Y * u))
        top = u.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(u - top).sum(axis=1))
        return float(np.sum(lse - np.einsum("ik,ik->i", Y, u)))

    def errors(self, u: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``∂L/∂u`` at ``u``: a new ``(n, K)`` array.  O(nK)."""
        if self.name == "squared":
            return u - Y
        if self.name == "logistic":
            return _sigmoid(u) - Y
        return _softmax(u) - Y

    def accuracy(self, u: np.ndarray, Y: np.ndarray) -> float:
        """The share of points whose most probable class (the sign of ``u`` for the
        logistic loss, its largest entry for cross-entropy) is their label's."""
        if self.name == "logistic":
            return float(np.mean((u[:, 0] > 0) == (Y[:, 0] > 0.5)))
        if self.name == "cross_entropy":
            return float(np.mean(u.argmax(axis=1) == Y.argmax(axis=1)))
        raise ValueError(f"loss={self.name!r} has no classes")

    def probabilities(self, u: np.ndarray) -> np.ndarray:
        """Class probabilities of outputs ``u`` ``(n, K)``: ``(n, 2)`` ``[1 − σ(u), σ(u)]``
        for the logistic loss, ``softmax(u)`` for cross-entropy."""
        if self.name == "logistic":
            p = _sigmoid(u[:, 0])
            return np.stack([1.0 - p, p], axis=1)
        if self.name == "cross_entropy":
            return _softmax(u)
        raise ValueError(f"loss={self.name!r} gives no probabilities")

    def targets(
        self, y: ArrayLike, n: int, outputs: int, name: str = "y", training: bool = True
    ) -> np.ndarray:
        """``y`` as the float64 ``(n, outputs)`` targets of this loss, or one line naming
        ``name`` when they do not fit it: the logistic loss takes labels in {0, 1} or
        {−1, +1} (both classes present) for one output; cross-entropy takes integer class
        labels ``0 … K−1`` or one-hot rows for ``K = outputs >= 2``; the squared loss any
        finite values.  ``training``: the labels must hold two classes at least (held-out
        labels may hold one)."""
        from ..model import as_targets

        if self.name == "squared":
            return as_targets(y, n, outputs, name)
        arr = np.asarray(y)
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
        if self.name == "logistic":
            if outputs != 1:
                raise ValueError(
                    f"loss='logistic' trains one output (two classes); the model has "
                    f"{outputs}: use loss='cross_entropy'"
                )
            Y = as_targets(arr, n, 1, name)
            labels = np.unique(Y)
            if not (set(labels) <= {0.0, 1.0} or set(labels) <= {-1.0, 1.0}):
                raise ValueError(
                    f"{name} must hold two classes as 0/1 or -1/+1 for loss='logistic', "
                    f"got values {_some(labels)}"
                )
            if training and labels.shape[0] < 2:
                raise ValueError(f"{name} holds one class only ({labels[0]:g}); it needs two")
            return (Y > 0).astype(np.float64)
        if outputs < 2:
            raise ValueError(
                "loss='cross_entropy' needs a model with K >= 2 outputs (one per class); "
                "for two classes and one output use loss='logistic'"
            )
        if arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1 and outputs > 1):
            labels = arr.reshape(-1)
            if labels.shape[0] != n:
                raise ValueError(f"{name} must have {n} labels, got {labels.shape[0]}")
            if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
                raise ValueError(
                    f"{name} must hold integer class labels 0..{outputs - 1} for "
                    f"loss='cross_entropy', got values {_some(np.unique(labels))}"
                )
            bad = labels[(labels < 0) | (labels >= outputs)]
            if bad.shape[0]:
                raise ValueError(
                    f"{name} holds class {int(bad[0])}, out of range 0..{outputs - 1} for a "
                    f"model with {outputs} outputs"
                )
            if training and np.unique(labels).shape[0] < 2:
                raise ValueError(f"{name} holds one class only ({int(labels[0])}); it needs two")
            Y = np.zeros((n, outputs))
            Y[np.arange(n), labels.astype(np.int64)] = 1.0
            return Y
        Y = as_targets(arr, n, outputs, name)
        if not (np.isin(Y, (0.0, 1.0)).all() and np.all(Y.sum(axis=1) == 1.0)):
            raise ValueError(
                f"{name} must be integer class labels or one-hot rows for "
                "loss='cross_entropy' (one 1 per row, zeros elsewhere)"
            )
        if training and np.unique(Y.argmax(axis=1)).shape[0] < 2:
            raise ValueError(f"{name} holds one class only; it needs two")
        return Y


def _some(values: np.ndarray, count: int = 4) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:count])
    return shown + (", ..." if values.shape[0] > count else "")


#: The losses by name.
LOSSES: dict[str, Loss] = {
    "squared": Loss("squared", 1.0, False),
    "logistic": Loss("logistic", 0.25, True),
    "cross_entropy": Loss("cross_entropy", 0.5, True),
}


def get_loss(name: object) -> Loss:
    """The :class:`Loss` named ``name``, or one line naming the losses there are."""
    if isinstance(name, Loss):
        return name
    if not isinstance(name, str) or name not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(map(repr, LOSSES))}; got {name!r}")
    return LOSSES[name]
