"""Data sets: the paper's setting, data shipped with scikit-learn, and the user's files.

Every data set has unit-norm rows (the paper's assumption ``||x_i|| = 1``).
Real data comes from scikit-learn's own package files (no download).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._io import open_npz
from ._validation import check_positive_int
from .preprocessing import InputTransform, unit_rows

__all__ = [
    "Dataset",
    "Table",
    "accuracy",
    "breast_cancer",
    "digits",
    "image_patches",
    "load_file",
    "read_csv",
    "sphere",
    "unit_rows",
]


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
    transform : InputTransform or None
        How the inputs were made from the raw features (fitted on the training
        split), to apply to new points.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    task: str
    classes: np.ndarray | None = None
    transform: Any = None  # the InputTransform that made X from the raw features, if any

    @property
    def outputs(self) -> int:
        """Number of network outputs the targets need."""
        return 1 if self.y_train.ndim == 1 else self.y_train.shape[1]


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


def digits(test_size: float = 0.25, seed: int = 0, standardize: bool = False) -> Dataset:
    """scikit-learn's handwritten digits (1797 × 64, 10 classes), one-hot targets.

    Each image's pixel vector is scaled to unit norm, after standardizing every
    pixel with the training split's statistics if ``standardize`` (centred data
    is far less coherent: mean ``|cos|`` 0.2 instead of 0.8); the split is
    stratified and seeded (``test_size=0`` keeps all 1797 points for training).
    """
    from sklearn.datasets import load_digits

    test_size = _check_test_size(test_size)
    data = load_digits()
    classes = np.unique(data.target)
    Y = (data.target[:, None] == classes[None, :]).astype(np.float64)
    tr, te = _split(data.data, data.target, test_size, seed)
    transform = InputTransform.fit(data.data[tr], standardize=standardize, unit_rows=True)
    X = transform(data.data)
    name = "digits (standardized)" if standardize else "digits"
    return Dataset(name, X[tr], Y[tr], X[te], Y[te], "multiclass", classes, transform)


def image_patches(
    n: int = 2048, size: int = 16, seed: int = 0, n_test: int = 0, standardize: bool = True
) -> Dataset:
    """Natural-image patches: ``size×size×3`` crops of scikit-learn's two bundled sample
    photographs (a temple in China and a flower; no download), label ±1 = which photo.

    ``n + n_test`` crops are drawn at seeded random positions, half from each
    photo; pixels are scaled to [0, 1], standardized with the training crops'
    statistics (``standardize``) and every row scaled to unit norm.  Coherent,
    real data: neighbouring pixels agree, so a step moves many products at once.
    """
    from sklearn.datasets import load_sample_images

    n = check_positive_int("n", n)
    size = check_positive_int("size", size)
    n_test = check_positive_int("n_test", n_test, minimum=0)
    images = load_sample_images().images
    if size > min(min(im.shape[:2]) for im in images):
        raise ValueError(
            f"size must be at most {min(min(im.shape[:2]) for im in images)}, got {size}"
        )
    rng = np.random.default_rng(seed)
    total = n + n_test
    label = np.arange(total) % 2
    rng.shuffle(label)
    X = np.empty((total, size * size * 3))
    for k in range(total):
        im = images[label[k]]
        r = rng.integers(0, im.shape[0] - size + 1)
        c = rng.integers(0, im.shape[1] - size + 1)
        X[k] = im[r : r + size, c : c + size].reshape(-1) / 255.0
    y = np.where(label == 1, 1.0, -1.0)
    transform = InputTransform.fit(X[:n], standardize=standardize, unit_rows=True)
    X = transform(X)
    return Dataset(
        "image_patches", X[:n], y[:n], X[n:], y[n:], "binary", np.array([-1.0, 1.0]), transform
    )


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
    return Dataset("breast_cancer", X[tr], y[tr], X[te], y[te], "binary", np.array([-1.0, 1.0]))


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


def load_file(path: str | os.PathLike, header: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read a user's data file: ``.npz`` with arrays ``X`` and ``y``, or ``.csv``.

    A CSV file holds one point per row with the label in the last column
    (:func:`read_csv`); labels may be numbers or class names (strings).  Rows
    of ``X`` are returned as given (not normalized).

    Parameters
    ----------
    header : bool, optional
        CSV only: whether the first row is a header; ``None`` detects it
        (:func:`read_csv`).

    Raises
    ------
    ValueError
        If the file cannot be read or does not hold a finite numeric ``X``
        (2-D, non-empty) and a ``y`` with one label per row.
    """
    path = _data_path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with open_npz(path) as data:
                missing = {"X", "y"} - set(data.files)
                if missing:
                    raise ValueError(f"needs arrays X and y, missing {sorted(missing)}")
                X, y = np.asarray(data["X"]), np.asarray(data["y"])
        elif suffix == ".csv":
            table = read_csv(path, header)
            if table.values.shape[1] < 2:
                raise ValueError("needs at least two columns (features, then the label)")
            X, y = table.numeric(stop=-1), table.labels(-1)
        else:
            raise ValueError("unknown format (use .npz with X and y, or .csv)")
    except ValueError as exc:
        raise ValueError(f"cannot read data file {path}: {exc}") from exc
    except Exception as exc:  # corrupt archives raise many types
        raise ValueError(f"cannot read data file {path}: {type(exc).__name__}: {exc}") from exc
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X in {path} must be a non-empty 2-D array, got shape {X.shape}")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X in {path} must be numeric, got dtype {X.dtype}")
    if y.dtype.kind not in "biufUS":
        raise ValueError(f"y in {path} must hold numbers or class names, got dtype {y.dtype}")
    if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
        raise ValueError(
            f"y in {path} must have one row per point of X ({X.shape[0]}), got shape {y.shape}"
        )
    X = X.astype(np.float64)
    if y.dtype.kind in "biuf":
        y = y.astype(np.float64)
        if not np.isfinite(y).all():
            raise ValueError(f"y in {path} contains NaN or infinite values")
    elif y.ndim != 1:
        raise ValueError(f"class names in {path} need one label column, got shape {y.shape}")
    if not np.isfinite(X).all():
        raise ValueError(f"X in {path} contains NaN or infinite values")
    return X, y


def _data_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"data file {path} is a directory, not a .npz or .csv file")
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist")
    return path


@dataclass(frozen=True)
class Table:
    """The cells of a CSV file (strings), its header, and each row's line in the file."""

    values: np.ndarray  # (rows, columns) of str
    header: tuple[str, ...] | None
    lines: np.ndarray  # (rows,) 1-based line numbers

    def numeric(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Columns ``start:stop`` as floats; a non-number is reported by line and column."""
        cells = self.values[:, start:stop]
        out = np.empty(cells.shape)
        for (r, c), text in np.ndenumerate(cells):
            v = _number(text)
            if v is None:
                raise ValueError(
                    f"row {self.lines[r]} is not numeric: column {start + c + 1} holds "
                    f"{str(text)!r}"
                )
            out[r, c] = v
        return out

    def labels(self, column: int) -> np.ndarray:
        """One column as class names when no cell is a number, else as numbers (a cell
        that is not one is reported)."""
        cells = self.values[:, column]
        nums = [_number(t) for t in cells]
        if all(v is None for v in nums):
            return np.array([t.strip() for t in cells], dtype=str)
        column %= self.values.shape[1]
        return self.numeric(column, column + 1)[:, 0]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _kind(text: str) -> str:
    t = text.strip()
    if _number(t) is None:
        return "text"
    return "int" if t.lstrip("+-").isdigit() else "float"


def read_csv(path: str | os.PathLike, header: bool | None = None) -> Table:
    """Read a CSV file into a :class:`Table` (a UTF-8 byte-order mark is ignored).

    Blank lines are skipped (line numbers stay those of the file).  Every row
    must have the same number of cells.  ``header=None`` detects a header: a
    first row with text is one when, in most columns, the other rows share a
    kind (text, integer, decimal) that it does not have; a first row of numbers
    is one only when it numbers the columns (``0,1,2,...`` as pandas and numpy
    write, or ``1,2,3,...``) above a column of decimal numbers.  Otherwise
    the first row is data.  A file of one row has no header unless
    ``header=True``.
    """
    path = _data_path(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows, lines = [], []
        for line, row in enumerate(csv.reader(fh), start=1):
            if row and any(c.strip() for c in row):
                rows.append(row)
                lines.append(line)
    if not rows:
        raise ValueError("the file is empty")
    width = len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise ValueError(
                f"every row needs the same number of columns: row {line} has "
                f"{len(row)}, row {lines[0]} has {width}"
            )
    if header is None:
        header = _looks_like_header(rows)
    head = tuple(c.strip() for c in rows[0]) if header else None
    body, body_lines = (rows[1:], lines[1:]) if header else (rows, lines)
    if not body:
        raise ValueError("no data rows (only a header)")
    return Table(np.array(body, dtype=str), head, np.array(body_lines))


def _looks_like_header(rows: list[list[str]]) -> bool:
    if len(rows) < 2:
        return False
    first = [_kind(c) for c in rows[0]]
    shared = []
    for c in range(len(rows[0])):
        kinds = {_kind(row[c]) for row in rows[1:]}
        shared.append(
            kinds.pop() if len(kinds) == 1 else "float" if kinds == {"int", "float"} else None
        )
    if "text" in first:  # names: most columns of one kind that the name does not have
        votes = sum(1 if f != s else -1 for f, s in zip(first, shared, strict=True) if s)
        return votes > 0
    # all numbers: only the column numbers pandas and numpy write, over other kinds
    names = [c.strip() for c in rows[0]]
    numbered = names in (
        [str(k) for k in range(len(names))],
        [str(k + 1) for k in range(len(names))],
    )
    return numbered and any(s == "float" for s in shared)
