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
from numpy.typing import ArrayLike

from . import _config, _philox, _validation
from ._implicit import ImplicitWeights, StoredWeights, forward_rows
from ._io import atomic_savez, atomic_write_npy, digest_of, open_npz
from ._validation import (
    as_matrix,
    check_indices,
    check_memory,
    check_positive_int,
    check_real,
    check_shape_2d,
    format_bytes,
    readonly,
    widest_fitting,
)
from .preprocessing import InputTransform

__all__ = ["TwoLayerReLU", "default_threshold"]

_FORMAT = "corrtree.TwoLayerReLU/1"
_IMPLICIT_FORMAT = "corrtree.TwoLayerReLU.implicit/1"


def default_threshold(m: int) -> float:
    """The paper's threshold ``b = sqrt(0.4 · ln m)`` (so ~m^(4/5) neurons fire per point)."""
    m = check_positive_int("m", m)
    return math.sqrt(0.4 * math.log(m))


def as_targets(y: ArrayLike, n: int, outputs: int, name: str = "y") -> np.ndarray:
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

    An *explicit* model (this constructor, or :meth:`init`) stores ``W``; an *implicit*
    one (``init(..., implicit=True)``) stores none of it: its rows are regenerated from
    the seed and the coefficients of its training (``corrtree._implicit``), and
    :meth:`weights` materializes any block of them.

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
    >>> wide = ct.TwoLayerReLU.init(d=3, m=64, seed=0, implicit=True)
    >>> wide.implicit, wide.weights(0, 2).shape
    (True, (2, 3))
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
        self._W: np.ndarray | None = as_matrix("W", W, copy=copy)
        self._src: StoredWeights | ImplicitWeights = StoredWeights(self._W)
        self._a = np.array(a_arr, dtype=np.float64).reshape(m, -1)
        self._squeeze = a_arr.ndim == 1
        self._b = default_threshold(m) if b is None else check_real("b", b)

    @classmethod
    def _of_implicit(
        cls, src: ImplicitWeights, a: np.ndarray, b: float, squeeze: bool
    ) -> TwoLayerReLU:
        """A model over implicit weights ``src``; ``a`` (m, K) float64 of ±1."""
        model = cls.__new__(cls)
        model._W = None
        model._src = src
        model._a = a
        model._squeeze = squeeze
        model._b = float(b)
        return model

    @classmethod
    def init(
        cls,
        d: int,
        m: int,
        b: float | None = None,
        outputs: int = 1,
        seed: int = 0,
        implicit: bool = False,
    ) -> TwoLayerReLU:
        """The paper's random initialization: ``w_r ~ N(0, I_d)``, ``a_r`` uniform on {±1}.

        ``outputs=1`` gives a 1-D ``a`` and 1-D predictions.  ``implicit=False``
        draws ``W`` with numpy's generator and stores it (8·m·d bytes);
        ``implicit=True`` stores nothing of it: ``W(0)[r, c]`` is a pure function of
        ``(seed, r, c)`` through the counter-based generator of ``corrtree._philox``
        (Philox-4×32-10 and Box–Muller), regenerated by blocks where it is needed
        (:meth:`weights`), and ``a`` comes from the same generator.  The two give
        different draws for the same seed.
        """
        d = check_positive_int("d", d)
        m = check_positive_int("m", m)
        outputs = check_positive_int("outputs", outputs)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if not isinstance(implicit, bool | np.bool_):
            raise ValueError(f"implicit must be True or False, got {implicit!r}")
        if implicit and not 0 <= int(seed) < _philox.SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**64) for an implicit model, got {seed}")

        def need(width: int) -> float:
            return 8.0 * width * (outputs + (0 if implicit else d))

        if need(m) > _validation.available_memory():
            width = widest_fitting(need, m)
            check_memory(
                need(m),
                f"TwoLayerReLU.init(d={d}, m={m}) ({'a' if implicit else 'W and a'})",
                f"m={width} would fit" if width else "",
            )
        if implicit:
            a = _philox.sign_rows(int(seed), 0, np.empty((m, outputs)))
            src = ImplicitWeights(int(seed), m, d)
            b = default_threshold(m) if b is None else check_real("b", b)
            return cls._of_implicit(src, a, b, outputs == 1)
        rng = np.random.default_rng(seed)
        W = np.empty((m, d))
        rng.standard_normal(out=W)  # in place: one m×d array at the peak, the same draws
        a = rng.choice(np.array([-1.0, 1.0]), size=(m, outputs))
        return cls(W, a[:, 0] if outputs == 1 else a, b, copy=False)

    # -- attributes ----------------------------------------------------------------
    @property
    def W(self) -> np.ndarray:
        """Hidden weights, shape ``(m, d)`` (read-only view; use :meth:`set_weights`).
        An implicit model has no such array: see :meth:`weights`."""
        if self._W is None:
            size = format_bytes(8.0 * self.m * self.d)
            raise AttributeError(
                f"W: an implicit model stores no weight matrix (it would take {size}); "
                f"use model.weights(start, stop) for rows or model.to_explicit()"
            )
        return readonly(self._W)

    @property
    def implicit(self) -> bool:
        """Whether ``W`` is regenerated from a seed and coefficients instead of stored."""
        return self._src.implicit

    @property
    def seed(self) -> int | None:
        """The generator's seed of an implicit model (``None`` for an explicit one)."""
        return self._src.seed if isinstance(self._src, ImplicitWeights) else None

    @property
    def weight_source(self) -> StoredWeights | ImplicitWeights:
        """Where the rows of ``W`` come from: the stored matrix (``StoredWeights``) or the
        generator and coefficients of an implicit model (``ImplicitWeights``).

        Both answer ``rows(start, stop)`` and ``take(rows)`` (float64 rows of ``W``; O(d)
        a row, plus O(d) a coefficient for an implicit model) and ``arrays(prefix)`` (the
        weights as named arrays, as files store them).  The trainers read ``W(0)`` through
        it, so an implicit model is never materialized; treat it as read-only (the model
        changes it only through :meth:`set_weights` and :meth:`absorb_update`).
        """
        return self._src

    @property
    def implicit_weights(self) -> ImplicitWeights:
        """The :attr:`weight_source` of an implicit model, which also answers
        ``shard(start, stop)`` and ``pairs`` (coefficients stored); an explicit model
        raises ``ValueError``."""
        if not isinstance(self._src, ImplicitWeights):
            raise ValueError("implicit_weights: this model stores its weight matrix")
        return self._src

    def absorb_update(
        self,
        X: np.ndarray,
        indptr: np.ndarray,
        cols: np.ndarray,
        coef: np.ndarray,
        alpha: float,
    ) -> None:
        """Set an implicit model's weights to ``α·(W - C X)``: the end of a run that
        trained it, given the run's coefficients ``C`` as a CSR (``indptr`` int64
        ``(m+1,)``, ``cols`` int32, ``coef`` float64) over the training points ``X``.
        O(coefficients + n·d); no ``m×d`` array is formed.  Arguments that do not fit
        (shapes, NaN or infinite values, columns or pointers out of range) are refused in
        one line naming them, before anything changes."""
        src = self.implicit_weights
        X = as_matrix("X", X, copy=False)
        if X.shape[1] != self.d:
            raise ValueError(f"X must have d={self.d} columns, got {X.shape[1]}")
        ptr = check_indices("indptr", indptr, np.iinfo(np.int64).max)
        if ptr.shape[0] != self.m + 1 or ptr[0] != 0 or (np.diff(ptr) < 0).any():
            raise ValueError(f"indptr must be {self.m + 1} non-decreasing pointers from 0")
        cols = check_indices("cols", cols, X.shape[0])
        coef = np.asarray(coef, dtype=np.float64)
        if coef.shape != cols.shape or ptr[-1] != cols.shape[0]:
            raise ValueError(f"cols and coef must hold indptr[-1]={ptr[-1]} entries each")
        if not np.isfinite(coef).all():
            raise ValueError("coef contains NaN or infinite values")
        alpha = check_real("alpha", alpha)
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        self._src = src.absorb(X, ptr, cols.astype(np.int32), coef, alpha)

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the current hidden weights as a new float64 array
        (regenerated for an implicit model).  O((stop - start)·d), plus for an implicit
        model O(d) per coefficient of those rows."""
        for name, value in (("start", start), ("stop", stop)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | np.integer)
            ):
                raise ValueError(f"{name} must be an integer or None, got {value!r}")
        start, stop, _ = slice(start, stop).indices(self.m)
        stop = max(start, stop)
        if self._W is not None:
            return np.array(self._W[start:stop])
        return self._src.rows(start, stop)

    def to_explicit(self) -> TwoLayerReLU:
        """The same network with its weights stored (``m·d·8`` bytes, checked first)."""
        check_memory(8.0 * self.m * self.d, f"to_explicit() at m={self.m}, d={self.d}")
        W = np.empty((self.m, self.d))
        for s in range(0, self.m, self._row_block()):
            e = min(s + self._row_block(), self.m)
            W[s:e] = self.weights(s, e)
        return TwoLayerReLU(W, self.a, self.b, copy=False)

    def export_weights(self, path: str | os.PathLike) -> None:
        """Write ``W`` to a ``.npy`` file (``np.load(path, mmap_mode="r")`` reads it by
        rows) block by block, atomically, never holding more than a block.  A disk without
        room for the ``8·m·d`` bytes is refused first (``OSError`` naming ``path``); one
        that fills during the write leaves no file behind."""
        block = self._row_block()
        rows = (self.weights(s, min(s + block, self.m)) for s in range(0, self.m, block))
        atomic_write_npy(path, (self.m, self.d), rows)

    def _row_block(self) -> int:
        return _config.block_rows(8 * self.d, self.m, _config.MODEL_BLOCK_BYTES)

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
        return self._src.m

    @property
    def d(self) -> int:
        """Input dimension."""
        return self._src.d

    @property
    def outputs(self) -> int:
        """Number of outputs ``K``."""
        return self._a.shape[1]

    def __repr__(self) -> str:
        kind = ", implicit" if self.implicit else ""
        return f"TwoLayerReLU(m={self.m}, d={self.d}, outputs={self.outputs}, b={self.b:.6g}{kind})"

    def _writable_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the hidden weights, writable in place: training writes
        its result there (:func:`corrtree.training._train.write_weights`), finite by
        construction, without the copy and checks of :meth:`set_weights`."""
        if self._W is None:
            raise AttributeError("an implicit model has no stored rows to write")
        return self._W[start:stop]

    def set_weights(self, W: np.ndarray, start: int | None = None) -> None:
        """Replace the hidden weights: all of them (``W`` of shape ``(m, d)``), or, with
        ``start``, those of neurons ``start .. start + len(W) - 1``.  Explicit models
        only (an implicit one changes by training; see :meth:`to_explicit`)."""
        if self._W is None:
            raise ValueError("set_weights: an implicit model's weights change only by training")
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
        that no product ``<w_r, x_i>`` overflows (1e150)."""
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
        # float64 products and rows (float32 products and rows, a float64 copy)
        block = _config.block_rows(8 * (n + 2 * self.d), self.m, _config.MODEL_BLOCK_BYTES)
        return range(0, self.m, block), block

    def _forward(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Outputs ``(n, K)`` and fire counts ``(n,)``, computed in neuron blocks.

        An implicit model regenerates each block's rows and finds its firing pairs
        with a float32 GEMM, recomputing in float64 every product within the GEMM's
        error bound of ``b`` (:func:`~corrtree._implicit.forward_rows`): the firing set
        and float64 values of a float64 GEMM (up to its rounding: a product within an ulp
        or so of ``b`` may fall on either side), at about half its cost.
        """
        n = X.shape[0]
        out = np.zeros((n, self.outputs))
        counts = np.zeros(n, dtype=np.int64)
        starts, block = self._blocks(n)
        X32, R = None, 0.0
        if self.implicit:  # the float32 forward (rows regenerated anyway)
            X32 = X.astype(np.float32)
            R = float(np.sqrt(np.einsum("ij,ij->i", X, X)).max()) if n else 0.0
        for s in starts:
            rows = self._src.rows(s, min(s + block, self.m))
            a = self._a[s : s + block]
            if X32 is not None and forward_rows(rows, X, X32, R, a, self._b, out, counts):
                continue
            U = rows @ X.T
            fire = U >= self._b
            counts += fire.sum(axis=0)
            U -= self._b
            np.maximum(U, 0.0, out=U)
            out += U.T @ a
        out /= math.sqrt(self.m)
        return out, counts

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Network outputs, shape ``(n,)`` (one output) or ``(n, K)``.  O(nmd)."""
        out, _ = self._forward(self.check_X(X))
        return out[:, 0] if self._squeeze else out

    def loss(self, X: np.ndarray, y: np.ndarray, loss: str = "squared") -> float:
        """The training loss ``loss`` at ``(X, y)``, summed over the points: ``½ Σ_i
        ||f(x_i) - y_i||²`` for ``"squared"``; ``"logistic"`` and ``"cross_entropy"`` as
        :func:`corrtree.train` takes them."""
        from .training.losses import get_loss

        chosen = get_loss(loss)
        X = self.check_X(X)
        Y = chosen.targets(y, X.shape[0], self.outputs, training=False)
        out, _ = self._forward(X)
        return chosen.value(out, Y)

    def fire_counts(self, X: np.ndarray) -> np.ndarray:
        """``k_i = |{r : <w_r, x_i> >= b}|`` for every data point, int64 shape ``(n,)``."""
        _, counts = self._forward(self.check_X(X))
        return counts

    # -- persistence ---------------------------------------------------------------
    def save(self, path: str | os.PathLike, transform: InputTransform | None = None) -> None:
        """Write the model to an ``.npz`` file atomically (no pickled objects), with the
        input transform its training used, if any (:func:`~corrtree.preprocessing.load_transform`
        reads it back).

        An implicit model is written as its seed, output weights (int8), threshold and,
        once trained, the coefficients of the pairs that ever fired with the training
        points they refer to (12 bytes a pair plus 8 a neuron, no ``m×d`` matrix), under
        a BLAKE2 digest that :meth:`load` checks.
        """
        extra = transform.arrays() if transform is not None else {}
        if self._W is not None:
            atomic_savez(
                path,
                format=np.array(_FORMAT),
                W=self._W,
                a=self._a[:, 0] if self._squeeze else self._a,
                b=np.array(self._b),
                **extra,
            )
            return
        a = self._a.astype(np.int8)
        arrays = {
            "a": a[:, 0] if self._squeeze else a,
            "b": np.array(self._b),
            **self.implicit_weights.arrays("w_"),
            **extra,
        }
        manifest = {"format": _IMPLICIT_FORMAT}
        digest = digest_of(manifest, arrays)
        atomic_savez(path, format=np.array(_IMPLICIT_FORMAT), digest=np.array(digest), **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TwoLayerReLU:
        """Read a model written by :meth:`save` (loaded with ``allow_pickle=False``).

        Raises ``ValueError`` if the file is not a valid model file (for an implicit
        model, also if its digest does not match its contents).
        """
        try:
            with open_npz(path) as data:
                fmt = str(data["format"]) if "format" in data.files else ""
                if fmt == _IMPLICIT_FORMAT:
                    return cls._load_implicit(data)
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

    @classmethod
    def _load_implicit(cls, data) -> TwoLayerReLU:
        arrays = {k: np.array(data[k]) for k in data.files if k not in ("format", "digest")}
        digest = str(data["digest"]) if "digest" in data.files else ""
        if digest != digest_of({"format": _IMPLICIT_FORMAT}, arrays):
            raise ValueError("the file is damaged or altered (its digest does not match)")
        src = ImplicitWeights.from_arrays(arrays, "w_")
        a, b = arrays.get("a"), arrays.get("b")
        if a is None or b is None or b.ndim != 0 or b.dtype.kind != "f":
            raise ValueError("a and b are missing or malformed")
        if a.shape[0] != src.m or a.ndim not in (1, 2) or not np.isin(a, (-1, 1)).all():
            raise ValueError(f"a must hold ±1 for each of the m={src.m} neurons")
        return cls._of_implicit(src, a.astype(np.float64).reshape(src.m, -1), float(b), a.ndim == 1)
