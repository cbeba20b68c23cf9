"""Data sets: the paper's setting, data shipped with scikit-learn, and the user's files.

Every data set has unit-norm rows (the paper's assumption ``||x_i|| = 1``).
Real data comes from scikit-learn's own package files (no download).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._validation import check_positive_int

__all__ = ["Dataset", "accuracy", "breast_cancer", "digits", "load_file", "sphere"]


@dataclass(frozen=True)
class Dataset:
    """A train/test split.

    Attributes
    ----------
    name : str
    X_train, y_train, X_test, y_test : ndarray
        Unit-norm inputs and targets: ``(n,)`` for regression and binary
        (±1) tasks, ``(n, K)`` one-hot for K-class tasks.
    task : str
        ``"regression"``, ``"binary"`` or ``"multiclass"``.
    classes : ndarray or None
        Class labels of the one-hot columns (multiclass) or of -1/+1 (binary).
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    task: str
    classes: np.ndarray | None = None

    @property
    def outputs(self) -> int:
        """Number of network outputs the targets need."""
        return 1 if self.y_train.ndim == 1 else self.y_train.shape[1]


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (zero rows stay zero)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def sphere(
    n: int = 1024, d: int = 784, outputs: int = 1, n_test: int = 0, seed: int = 0
) -> Dataset:
    """The paper's setting: ``x_i`` uniform on the unit sphere, labels uniform in [-1, 1].

    Parameters
    ----------
    n, d : int
        Training points and dimension.
    outputs : int
        Number of label columns ``K`` (``y`` is 1-D when ``K = 1``).
    n_test : int
        Extra points drawn the same way for a test set.
    seed : int
        Seed of ``numpy.random.default_rng``.
    """
    n = check_positive_int("n", n)
    d = check_positive_int("d", d)
    outputs = check_positive_int("outputs", outputs)
    n_test = check_positive_int("n_test", n_test, minimum=0)
    rng = np.random.default_rng(seed)
    X = unit_rows(rng.standard_normal((n + n_test, d)))
    y = rng.uniform(-1.0, 1.0, size=(n + n_test, outputs))
    if outputs == 1:
        y = y[:, 0]
    return Dataset("sphere", X[:n], y[:n], X[n:], y[n:], "regression")


def _split(X, labels, test_size, seed):
    if test_size == 0:
        return np.arange(len(labels)), np.arange(0)
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    return train_test_split(idx, test_size=test_size, random_state=seed, stratify=labels)


def _check_test_size(test_size: float) -> float:
    if not 0.0 <= float(test_size) < 1.0:
        raise ValueError(f"test_size must be in [0, 1), got {test_size}")
    return float(test_size)


def digits(test_size: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's handwritten digits (1797 × 64, 10 classes), one-hot targets.

    Each image's pixel vector is scaled to unit norm; the split is stratified
    and seeded (``test_size=0`` keeps all 1797 points for training).
    """
    from sklearn.datasets import load_digits

    test_size = _check_test_size(test_size)
    data = load_digits()
    X = unit_rows(data.data)
    classes = np.unique(data.target)
    Y = (data.target[:, None] == classes[None, :]).astype(np.float64)
    tr, te = _split(X, data.target, test_size, seed)
    return Dataset("digits", X[tr], Y[tr], X[te], Y[te], "multiclass", classes)


def breast_cancer(test_size: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's breast cancer data (569 × 30), labels ±1 (+1 = benign).

    Features are standardized with the training split's mean and deviation,
    then every row is scaled to unit norm.
    """
    from sklearn.datasets import load_breast_cancer

    test_size = _check_test_size(test_size)
    data = load_breast_cancer()
    y = np.where(data.target == 1, 1.0, -1.0)
    tr, te = _split(data.data, data.target, test_size, seed)
    mu = data.data[tr].mean(axis=0)
    sd = data.data[tr].std(axis=0)
    X = unit_rows((data.data - mu) / np.where(sd > 0, sd, 1.0))
    return Dataset("breast_cancer", X[tr], y[tr], X[te], y[te], "binary",
                   np.array([-1.0, 1.0]))


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Share of correct predictions.

    For 2-D targets (one-hot, K outputs) a prediction is correct when its
    largest output is the true class; for 1-D targets (±1) when its sign
    matches.
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has shape {y_true.shape} but y_pred has {y_pred.shape}")
    if y_true.size == 0:
        raise ValueError("accuracy of an empty set is undefined")
    if y_true.ndim == 2:
        return float(np.mean(y_true.argmax(axis=1) == y_pred.argmax(axis=1)))
    return float(np.mean(np.sign(y_true) == np.where(y_pred >= 0, 1.0, -1.0)))


def load_file(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read a user's data file: ``.npz`` with arrays ``X`` and ``y``, or ``.csv``.

    A CSV file holds one point per row with the label in the last column; a
    first row that is not numeric is taken as a header.  Rows of ``X`` are
    returned as given (not normalized).

    Raises
    ------
    ValueError
        If the file cannot be read or does not hold a finite numeric ``X``
        (2-D, non-empty) and a ``y`` with one label per row.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                missing = {"X", "y"} - set(data.files)
                if missing:
                    raise ValueError(f"needs arrays X and y, missing {sorted(missing)}")
                X, y = np.asarray(data["X"]), np.asarray(data["y"])
        elif suffix == ".csv":
            X, y = _read_csv(path)
        else:
            raise ValueError("unknown format (use .npz with X and y, or .csv)")
    except ValueError as exc:
        raise ValueError(f"cannot read data file {path}: {exc}") from exc
    except Exception as exc:  # corrupt archives raise many types
        raise ValueError(f"cannot read data file {path}: {type(exc).__name__}: {exc}") from exc
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X in {path} must be a non-empty 2-D array, got shape {X.shape}")
    if X.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise ValueError(f"X and y in {path} must be numeric")
    if y.shape[0] != X.shape[0] or y.ndim not in (1, 2):
        raise ValueError(f"y in {path} must have one row per point of X, got shape {y.shape}")
    X, y = X.astype(np.float64), y.astype(np.float64)
    if not (np.isfinite(X).all() and np.isfinite(y).all()):
        raise ValueError(f"{path} contains NaN or infinite values")
    return X, y


def _read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = [row for row in csv.reader(fh) if row and any(c.strip() for c in row)]
    if not rows:
        raise ValueError("the file is empty")

    def numeric(row):
        try:
            return [float(c) for c in row]
        except ValueError:
            return None

    if numeric(rows[0]) is None:
        rows = rows[1:]  # header
    values = []
    for k, row in enumerate(rows):
        vals = numeric(row)
        if vals is None:
            raise ValueError(f"row {k + 1} is not numeric: {row}")
        values.append(vals)
    if not values:
        raise ValueError("no data rows")
    width = len(values[0])
    if width < 2 or any(len(v) != width for v in values):
        raise ValueError("every row needs the same number (>= 2) of columns")
    arr = np.array(values)
    return arr[:, :-1], arr[:, -1]
