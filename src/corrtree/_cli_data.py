"""The command line's data: built-in sets or the user's files, their targets, and
accuracy; the points ``corrtree predict`` reads, and the loss a saved model was trained
with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import datasets
from ._io import open_npz
from .model import TwoLayerReLU
from .preprocessing import InputTransform

__all__ = [
    "CliError",
    "accuracy_of",
    "load_data",
    "positive_float",
    "predict_inputs",
    "trained_loss",
]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


def load_data(
    spec: str,
    seed: int,
    test_size: float,
    normalize: bool,
    task: str = "auto",
    header: bool | None = None,
    standardize: bool = True,
) -> datasets.Dataset:
    """A built-in data set by name, or the user's ``.npz``/``.csv`` file.

    A file's features are standardized with the training split's statistics
    (``standardize``) and its rows scaled to unit norm (``normalize``): the
    :class:`~corrtree.preprocessing.InputTransform` kept in the dataset.
    """
    if spec == "digits":
        return datasets.digits(test_size=test_size, seed=seed, standardize=standardize)
    if spec == "breast_cancer":
        return datasets.breast_cancer(test_size=test_size, seed=seed)
    if spec == "sphere":
        return datasets.sphere(n=1024, d=784, n_test=256, seed=seed)
    X, y = datasets.load_file(spec, header)
    y, task, classes = _targets(y, task)
    n = X.shape[0]
    n_test = round(test_size * n) if n > 1 else 0
    perm = np.random.default_rng(seed).permutation(n)
    te, tr = perm[:n_test], perm[n_test:]
    transform = InputTransform.fit(X[tr], standardize=standardize, unit_rows=normalize)
    X = transform(X)
    return datasets.Dataset(Path(spec).name, X[tr], y[tr], X[te], y[te], task, classes, transform)


def _targets(y: np.ndarray, task: str) -> tuple[np.ndarray, str, np.ndarray | None]:
    """Targets for the network: regression values, ±1 (two classes) or one-hot.

    Class labels (numbers or names) are mapped to classes as scikit-learn
    does: sorted, the larger of two is +1.
    """
    names = y.dtype.kind in "US"
    if y.ndim == 2:
        if task == "classification" or names:
            raise CliError(
                f"--task classification needs one label column, but y has shape "
                f"{y.shape}; use --task regression for several targets"
            )
        return y, "regression", None
    if names and task == "regression":
        raise CliError("the labels are not numbers; use --task classification or auto")
    if task == "regression":
        return y, "regression", None
    classes = np.unique(y)
    integral = names or np.array_equal(y, np.round(y))
    if task == "auto" and not (integral and 2 <= len(classes) <= 20):
        if names:
            raise CliError(
                f"the labels are {len(classes)} class names; auto takes 2 to 20 "
                "classes (use --task classification)"
            )
        return y, "regression", None
    if len(classes) < 2:
        raise CliError("classification needs at least two distinct labels")
    if len(classes) == 2:
        return np.where(y == classes[1], 1.0, -1.0), "binary", classes
    return (y[:, None] == classes[None, :]).astype(np.float64), "multiclass", classes


def accuracy_of(
    ds: datasets.Dataset, X: np.ndarray, y: np.ndarray, model: TwoLayerReLU
) -> float | None:
    if ds.task == "regression" or len(y) == 0:
        return None
    return datasets.accuracy(y, model.predict(X))


def trained_loss(model_path: Path) -> str:
    """The loss a model written by ``corrtree train`` was trained with, if it gives
    probabilities (the ``summary.json`` beside it)."""
    summary = model_path.resolve().parent / "summary.json"
    try:
        loss = json.loads(summary.read_text())["loss"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CliError(
            f"--proba needs the loss {model_path} was trained with, from {summary} "
            "(written by corrtree train beside model.npz): it is missing or unreadable"
        ) from None
    if loss not in ("logistic", "cross_entropy"):
        raise CliError(
            f"--proba: {model_path} was trained with the {loss} loss, which gives no "
            "probabilities (train with --loss cross_entropy or logistic)"
        )
    return str(loss)


def predict_inputs(path: str, d: int, header: bool | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of ``d`` features from a .npz (X, optional y) or a .csv file (``d``
    columns, or ``d + 1`` with the label last)."""
    p = Path(path)
    if p.suffix.lower() == ".npz":
        if p.is_dir() or not p.is_file():
            raise CliError(f"data file {path} {'is a folder' if p.is_dir() else 'does not exist'}")
        try:
            with open_npz(p) as data:
                if "X" not in data.files:
                    raise CliError(f"{path} has no array X")
                X = np.asarray(data["X"])
                y = np.asarray(data["y"]) if "y" in data.files else None
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from exc
        if X.ndim != 2 or X.dtype.kind not in "biuf":
            raise CliError(
                f"X in {path} must be a 2-D numeric array (one row of {d} features "
                f"per point), got shape {X.shape} and dtype {X.dtype}"
            )
        if X.shape[1] != d:
            raise CliError(f"X in {path} has {X.shape[1]} features but the model expects {d}")
        if y is not None and (y.dtype.kind not in "biuf" or y.shape[:1] != X.shape[:1]):
            y = None
    elif p.suffix.lower() == ".csv":
        try:
            table = datasets.read_csv(p, header)
        except ValueError as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from None
        cols = table.values.shape[1]
        if cols not in (d, d + 1):
            raise CliError(
                f"{path} has {cols} columns; the model expects {d} features (or "
                f"{d + 1} columns with a label last)"
            )
        try:
            X = table.numeric(stop=d)
        except ValueError as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from None
        y = table.labels(d) if cols == d + 1 else None
    else:
        raise CliError(f"data file {path}: unknown format (use .npz or .csv)")
    X = X.astype(np.float64)
    if X.shape[0] == 0:
        raise CliError(f"{path} has no rows")
    if not np.isfinite(X).all():
        raise CliError(f"{path} contains NaN or infinite values")
    return X, None if y is None else y.astype(np.float64) if y.dtype.kind in "biuf" else y


def positive_float(text: str, name: str) -> float:
    """A flag's positive number (``--lr``, whose other value ``auto`` the caller takes)."""
    try:
        v = float(text)
    except ValueError:
        raise CliError(f"{name} must be 'auto' or a number, got {text!r}") from None
    if not np.isfinite(v) or v <= 0:
        raise CliError(f"{name} must be a positive number, got {text!r}")
    return v
