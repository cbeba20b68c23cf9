"""The command line's data: built-in sets or the user's files, their targets, and
accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import datasets
from .model import TwoLayerReLU
from .preprocessing import InputTransform

__all__ = ["CliError", "accuracy_of", "load_data"]


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
