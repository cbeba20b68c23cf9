"""The paper's model 2NN(m, b): a two-layer ReLU network with a threshold.

``f(x) = (1/sqrt m) · Σ_r a_r · max(<w_r, x> - b, 0)`` with trained hidden
weights ``W`` (m×d) and fixed output weights ``a`` in {±1}^m, or {±1}^(m×K)
for K outputs; the loss is ``½ Σ_i ||f(x_i) - y_i||²``.
"""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from . import _config, _validation
from ._io import atomic_savez
from ._validation import (
    as_matrix,
    check_memory,
    check_positive_int,
    check_real,
    check_shape_2d,
    readonly,
    widest_fitting,
)
from .preprocessing import InputTransform

__all__ = ["TwoLayerReLU", "default_threshold"]

_FORMAT = "corrtree.TwoLayerReLU/1"


def default_threshold(m: int) -> float:
    """The paper's threshold ``b = sqrt(0.4 · ln m)`` (so ~m^(4/5) neurons fire per point)."""
    m = check_positive_int("m", m)
    return math.sqrt(0.4 * math.log(m))


def as_targets(y: object, n: int, outputs: int, name: str = "y") -> np.ndarray:
    """Targets as a finite float64 array of shape ``(n, outputs)``."""
    arr = np.asarray(y)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
    if outputs == 1 and arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape != (n, outputs):
        want = f"({n},)" if outputs == 1 else f"({n}, {outputs})"
        raise ValueError(f"{name} must have shape {want} for this model, got {np.shape(y)}")
    out = np.array(arr, dtype=np.float64, order="C")
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return out


class TwoLayerReLU:
    """The network 2NN(m, b) of the paper; only ``W`` is trained.

    Parameters
    ----------
    W : array_like, shape (m, d)
        Hidden weights.
    a : array_like, shape (m,) or (m, K)
        Output weights, each +1 or -1; a 2-D ``a`` gives ``K`` outputs.
    b : float, optional
        Threshold; default :func:`default_threshold` ``(m)``.
    copy : bool, default True
        Copy ``W``; ``False`` takes it as it is when it already is a C-contiguous
        float64 array (the model then shares it: do not change it elsewhere).

    Examples
    --------
    >>> import numpy as np, corrtree as ct
    >>> model = ct.TwoLayerReLU.init(d=3, m=64, seed=0)
    >>> model.predict(np.eye(3)).shape
    (3,)
    >>> round(model.b, 4)
    1.2899
    """

    def __init__(
        self, W: np.ndarray, a: np.ndarray, b: float | None = None, *, copy: bool = True
    ) -> None:
        m, _ = check_shape_2d("W", W)
        a_arr = np.asarray(a)
        if a_arr.ndim not in (1, 2) or a_arr.shape[0] != m:
            raise ValueError(f"a must have shape ({m},) or ({m}, K), got {a_arr.shape}")
        if a_arr.ndim == 2 and a_arr.shape[1] == 0:
            raise ValueError("a must have at least one output column")
        if a_arr.dtype.kind not in "biuf" or not np.isin(a_arr, (-1, 1)).all():
            raise ValueError("a must hold only +1 and -1")
        self._W = as_matrix("W", W, copy=copy)
        self._a = np.array(a_arr, dtype=np.float64).reshape(m, -1)
        self._squeeze = a_arr.ndim == 1
        self._b = default_threshold(m) if b is None else check_real("b", b)

    @classmethod
    def init(
        cls, d: int, m: int, b: float | None = None, outputs: int = 1, seed: int = 0
    ) -> TwoLayerReLU:
        """The paper's random initialization: ``w_r ~ N(0, I_d)``, ``a_r`` uniform on {±1}.

        ``outputs=1`` gives a 1-D ``a`` and 1-D predictions.
        """
        d = check_positive_int("d", d)
        m = check_positive_int("m", m)
        outputs = check_positive_int("outputs", outputs)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise ValueError(f"seed must be an integer, got {seed!r}")

        def need(width: int) -> float:
            return 8.0 * width * (d + outputs)

        if need(m) > _validation.available_memory():
            width = widest_fitting(need, m)
            check_memory(
                need(m),
                f"TwoLayerReLU.init(d={d}, m={m}) (W and a)",
                f"m={width} would fit" if width else "",
            )
        rng = np.random.default_rng(seed)
        W = np.empty((m, d))
        rng.standard_normal(out=W)  # in place: one m×d array at the peak, the same draws
        a = rng.choice(np.array([-1.0, 1.0]), size=(m, outputs))
        return cls(W, a[:, 0] if outputs == 1 else a, b, copy=False)

    # -- attributes ----------------------------------------------------------------
    @property
    def W(self) -> np.ndarray:
        """Hidden weights, shape ``(m, d)`` (read-only view; use :meth:`set_weights`)."""
        return readonly(self._W)

    @property
    def a(self) -> np.ndarray:
        """Output weights, shape ``(m,)`` or ``(m, K)`` (read-only)."""
        return readonly(self._a[:, 0] if self._squeeze else self._a)

    @property
    def output_weights(self) -> np.ndarray:
        """Output weights as an ``(m, K)`` array, also for one output (read-only)."""
        return readonly(self._a)

    @property
    def b(self) -> float:
        """Threshold of the ReLU."""
        return self._b

    @property
    def m(self) -> int:
        """Width (number of hidden neurons)."""
        return self._W.shape[0]

    @property
    def d(self) -> int:
        """Input dimension."""
        return self._W.shape[1]

    @property
    def outputs(self) -> int:
        """Number of outputs ``K``."""
        return self._a.shape[1]

    def __repr__(self) -> str:
        return f"TwoLayerReLU(m={self.m}, d={self.d}, outputs={self.outputs}, b={self.b:.6g})"

    def _writable_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the hidden weights, writable in place: training writes
        its result there (:func:`corrtree.training._train.write_weights`), finite by
        construction, without the copy and checks of :meth:`set_weights`."""
        return self._W[start:stop]

    def set_weights(self, W: np.ndarray, start: int | None = None) -> None:
        """Replace the hidden weights: all of them (``W`` of shape ``(m, d)``), or, with
        ``start``, those of neurons ``start .. start + len(W) - 1``."""
        rows, d = check_shape_2d("W", W)
        if start is None:
            if (rows, d) != self._W.shape:
                raise ValueError(f"W must have shape {self._W.shape}, got {np.shape(W)}")
            start = 0
        start = check_positive_int("start", start, minimum=0)
        if d != self.d or start + rows > self.m:
            raise ValueError(
                f"W must have shape (rows, {self.d}) with start + rows <= "
                f"m={self.m}, got {np.shape(W)} at start={start}"
            )
        self._W[start : start + rows] = as_matrix("W", W, copy=False)

    # -- evaluation ----------------------------------------------------------------
    def check_X(self, X: object, name: str = "X") -> np.ndarray:
        """``X`` as a finite C-contiguous float64 array with ``d`` columns, small enough
        that no product ``<w_r, x_i>`` overflows (:data:`~corrtree._config.MAX_ABS_INPUT`)."""
        _, d = check_shape_2d(name, X)
        if d != self.d:
            raise ValueError(f"{name} has {d} columns but the model has d={self.d}")
        X = as_matrix(name, X)
        peak = float(np.abs(X).max())
        if peak > _config.MAX_ABS_INPUT:
            raise ValueError(
                f"{name} holds values up to {peak:.3g}: products with the weights "
                f"would overflow; scale the data (e.g. rows to unit norm)"
            )
        return X

    def _blocks(self, n: int):
        """Neuron blocks whose products (block × n float64) take at most
        :data:`~corrtree._config.MODEL_BLOCK_BYTES`."""
        block = _config.block_rows(8 * n, self.m, _config.MODEL_BLOCK_BYTES)
        return range(0, self.m, block), block

    def _forward(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Outputs ``(n, K)`` and fire counts ``(n,)``, computed in neuron blocks."""
        n = X.shape[0]
        out = np.zeros((n, self.outputs))
        counts = np.zeros(n, dtype=np.int64)
        starts, block = self._blocks(n)
        for s in starts:
            U = self._W[s : s + block] @ X.T
            fire = U >= self._b
            counts += fire.sum(axis=0)
            U -= self._b
            np.maximum(U, 0.0, out=U)
            out += U.T @ self._a[s : s + block]
        out /= math.sqrt(self.m)
        return out, counts

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Network outputs, shape ``(n,)`` (one output) or ``(n, K)``.  O(nmd)."""
        out, _ = self._forward(self.check_X(X))
        return out[:, 0] if self._squeeze else out

    def loss(self, X: np.ndarray, y: np.ndarray) -> float:
        """``½ Σ_i ||f(x_i) - y_i||²``."""
        X = self.check_X(X)
        Y = as_targets(y, X.shape[0], self.outputs)
        out, _ = self._forward(X)
        return 0.5 * float(np.sum((out - Y) ** 2))

    def fire_counts(self, X: np.ndarray) -> np.ndarray:
        """``k_i = |{r : <w_r, x_i> >= b}|`` for every data point, int64 shape ``(n,)``."""
        _, counts = self._forward(self.check_X(X))
        return counts

    # -- persistence ---------------------------------------------------------------
    def save(self, path: str | os.PathLike, transform: InputTransform | None = None) -> None:
        """Write the model to an ``.npz`` file atomically (no pickled objects), with the
        input transform its training used, if any (:func:`~corrtree.preprocessing.load_transform`
        reads it back)."""
        atomic_savez(
            path,
            format=np.array(_FORMAT),
            W=self._W,
            a=self._a[:, 0] if self._squeeze else self._a,
            b=np.array(self._b),
            **(transform.arrays() if transform is not None else {}),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> TwoLayerReLU:
        """Read a model written by :meth:`save` (loaded with ``allow_pickle=False``).

        Raises ``ValueError`` if the file is not a valid model file.
        """
        try:
            with np.load(path, allow_pickle=False) as data:
                fmt = str(data["format"]) if "format" in data.files else ""
                if fmt != _FORMAT:
                    raise ValueError("not a corrtree model file")
                W, a, b = data["W"], data["a"], data["b"]
                if b.ndim != 0 or b.dtype.kind not in "biuf":
                    raise ValueError(f"b must be one number, got shape {b.shape}, dtype {b.dtype}")
            return cls(W, a, float(b))
        except FileNotFoundError:
            raise
        except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as exc:
            raise ValueError(f"cannot read model file {path}: {exc}") from exc
