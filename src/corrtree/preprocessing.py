"""The input transform fitted on the training data and applied again at prediction.

:class:`InputTransform` standardizes each feature with the training statistics
(optional) and then scales every row to unit norm (optional), the paper's
setting for which the default threshold ``b`` is made.  The command line and
the scikit-learn estimators fit one on the training split, train on its
output, and keep it with the model (``model.npz`` holds its arrays), so that
``predict`` sees the same inputs as training.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from ._io import open_npz
from ._validation import as_matrix

__all__ = ["InputTransform", "load_transform", "unit_rows"]


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (zero rows stay zero).

    A row whose norm overflows (entries near the float64 limit, 1e308) or
    underflows is first divided by its largest absolute entry.
    """
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(X, axis=1, keepdims=True)
    bad = ~np.isfinite(norms[:, 0]) | ((norms[:, 0] == 0) & np.any(X != 0, axis=1))
    if bad.any():
        X = X.copy()
        X[bad] /= np.abs(X[bad]).max(axis=1, keepdims=True)
        norms[bad] = np.linalg.norm(X[bad], axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


@dataclass(frozen=True)
class InputTransform:
    """``x -> unit_rows((x / peak - mean) / std)`` (each step optional).

    ``peak`` is each feature's largest absolute training value: statistics
    are taken on ``x / peak``, so features near the float64 limit do not
    overflow.  Features that are constant in training get ``std = 1``.
    """

    peak: np.ndarray | None
    mean: np.ndarray | None
    std: np.ndarray | None
    unit_rows: bool

    @classmethod
    def fit(cls, X: np.ndarray, standardize: bool = True, unit_rows: bool = True) -> InputTransform:
        """The transform with the statistics of the training inputs ``X``.  O(nd)."""
        X = as_matrix("X", X, copy=False)
        if not standardize:
            return cls(None, None, None, bool(unit_rows))
        peak = np.abs(X).max(axis=0)
        peak = np.where(peak > 0, peak, 1.0)
        Z = X / peak
        std = Z.std(axis=0)
        return cls(peak, Z.mean(axis=0), np.where(std > 0, std, 1.0), bool(unit_rows))

    @property
    def standardize(self) -> bool:
        """Whether the features are standardized (``False``: rows are only scaled)."""
        return self.peak is not None

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """The network inputs for raw inputs ``X`` (a new array)."""
        X = as_matrix("X", X)
        if self.peak is not None and self.mean is not None and self.std is not None:
            if X.shape[1] != self.peak.shape[0]:
                raise ValueError(
                    f"X has {X.shape[1]} columns but the transform was fitted "
                    f"on {self.peak.shape[0]}"
                )
            X = (X / self.peak - self.mean) / self.std
        return unit_rows(X) if self.unit_rows else X

    def arrays(self) -> dict[str, np.ndarray]:
        """The transform as named arrays (stored in a model file)."""
        out = {"input_unit_rows": np.array(self.unit_rows)}
        if self.peak is not None and self.mean is not None and self.std is not None:
            out.update(input_peak=self.peak, input_mean=self.mean, input_std=self.std)
        return out

    @classmethod
    def from_arrays(cls, data: dict[str, np.ndarray], d: int) -> InputTransform | None:
        """Inverse of :meth:`arrays` (``None`` if ``data`` holds no transform)."""
        if "input_unit_rows" not in data:
            return None
        unit = np.asarray(data["input_unit_rows"])
        if unit.shape != () or unit.dtype != np.bool_:
            raise ValueError("input_unit_rows must be one boolean")
        names = ("input_peak", "input_mean", "input_std")
        if not any(k in data for k in names):
            return cls(None, None, None, bool(unit))
        stats = []
        for k in names:
            if k not in data:
                raise ValueError(f"{k} is missing")
            arr = np.asarray(data[k])
            if arr.shape != (d,) or arr.dtype.kind != "f" or not np.isfinite(arr).all():
                raise ValueError(f"{k} must be {d} finite numbers")
            stats.append(np.array(arr, dtype=np.float64))
        if (stats[0] <= 0).any() or (stats[2] <= 0).any():
            raise ValueError("input_peak and input_std must be > 0")
        return cls(stats[0], stats[1], stats[2], bool(unit))


def load_transform(path: str | os.PathLike, d: int) -> InputTransform | None:
    """The input transform stored in a model file (``None`` if it has none)."""
    try:
        with open_npz(path) as data:
            return InputTransform.from_arrays({k: data[k] for k in data.files}, d)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as exc:
        raise ValueError(f"cannot read the input transform of {path}: {exc}") from exc
