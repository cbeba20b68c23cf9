"""scikit-learn estimators around :class:`~corrtree.TwoLayerReLU` and :func:`~corrtree.train`.

Needs scikit-learn (``pip install 'corrtree[sklearn]'``).
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _config
from .model import TwoLayerReLU
from .preprocessing import InputTransform
from .training import History, train
from .training.losses import get_loss

__all__ = ["CorrTreeClassifier", "CorrTreeRegressor"]


class _CorrTreeBase(BaseEstimator):
    """Shared fitting code; see the two public estimators."""

    def __init__(
        self,
        width: int = 4096,
        method: str = "auto",
        lr: float | str = "auto",
        iters: int = 100,
        threshold: float | None = None,
        normalize: bool = True,
        standardize: bool = True,
        random_state: int | None = None,
        batch_size: int | None = None,
        epochs: int | None = None,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        schedule: str | None = None,
        implicit: bool = False,
        device: str | None = None,
    ) -> None:
        self.width = width
        self.method = method
        self.lr = lr
        self.iters = iters
        self.threshold = threshold
        self.normalize = normalize
        self.standardize = standardize
        self.random_state = random_state
        self.batch_size = batch_size
        self.epochs = epochs
        self.momentum = momentum
        self.nesterov = nesterov
        self.weight_decay = weight_decay
        self.schedule = schedule
        self.implicit = implicit
        self.device = device

    def _fit(self, X: np.ndarray, Y: np.ndarray, loss: str = "squared") -> None:
        if (
            isinstance(self.width, bool)
            or not isinstance(self.width, numbers.Integral)
            or self.width < 1
        ):
            raise ValueError(f"width must be an integer >= 1, got {self.width!r}")
        seed = self.random_state
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        elif not isinstance(seed, numbers.Integral):
            raise ValueError(f"random_state must be an integer or None, got {seed!r}")
        if self.standardize and X.shape[0] < 2:
            raise ValueError("standardize=True needs at least 2 samples; got 1 sample")
        self.transform_: InputTransform = InputTransform.fit(
            X, bool(self.standardize), bool(self.normalize)
        )
        X = self.transform_(X)
        self.model_: TwoLayerReLU = TwoLayerReLU.init(
            d=X.shape[1],
            m=int(self.width),
            b=self.threshold,
            outputs=Y.shape[1],
            seed=int(seed),
            implicit=self.implicit,
        )
        self.history_: History = train(
            self.model_,
            X,
            Y,
            method=self.method,
            lr=self.lr,
            iters=None if self.epochs is not None else self.iters,
            lr_retries=_config.LR_RETRIES,
            batch_size=self.batch_size,
            epochs=self.epochs,
            momentum=self.momentum,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
            schedule=self.schedule,
            shuffle_seed=int(seed),
            device=self.device,
            loss=loss,
        )
        self.n_iter_ = len(self.history_)

    def _outputs(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        out = self.model_.predict(self.transform_(X))
        return out.reshape(X.shape[0], -1)


class CorrTreeRegressor(RegressorMixin, _CorrTreeBase):
    """Regression with 2NN(m, b) trained by exact gradient descent (full batch or SGD).

    Parameters
    ----------
    width : int, default 4096
        Number of hidden neurons ``m``.
    method : str, default "auto"
        Training method (see :func:`corrtree.train`).
    lr : float or "auto", default "auto"
        Learning rate.  ``"auto"``: ``1/λ_max`` of the NTK matrix at init,
        halved (up to 4 times) while training diverges, which happens for
        narrow networks whose fire sets change a lot.
    iters : int, default 100
        Gradient steps.
    threshold : float, optional
        ReLU threshold ``b`` (default ``sqrt(0.4 ln m)``).
    normalize : bool, default True
        Scale every input row to unit norm (the paper's setting, for which the
        default threshold is made), after standardizing.
    standardize : bool, default True
        Centre and scale every feature with the training data's mean and
        deviation first (``transform_``, applied again by ``predict``).
    random_state : int, optional
        Seed of the initialization and of the batch order.
    batch_size, epochs, momentum, nesterov, weight_decay, schedule
        Mini-batch SGD as :func:`corrtree.train` (default: full batch, ``iters``
        steps; with ``epochs``, ``iters`` is not used).
    implicit : bool, default False
        Regenerate ``W(0)`` from the seed instead of storing it
        (:meth:`corrtree.TwoLayerReLU.init`): widths beyond memory, trained by the lazy or
        kernel method; ``model_`` then stores only the coefficients of the pairs
        that ever fired.
    device : str, optional
        Train on this torch device (``train``'s ``device=``; ``corrtree[gpu]``).

    Attributes
    ----------
    model_ : TwoLayerReLU
    transform_ : InputTransform
    history_ : History
    n_iter_ : int
    n_features_in_ : int
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # one network output per target column
        return tags

    def fit(self, X: np.ndarray, y: np.ndarray) -> CorrTreeRegressor:
        X, y = validate_data(self, X, y, dtype=np.float64, multi_output=True, y_numeric=True)
        self._1d = y.ndim == 1
        self._fit(X, y.reshape(len(y), -1).astype(np.float64))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        out = self._outputs(X)
        return out[:, 0] if self._1d else out


class CorrTreeClassifier(ClassifierMixin, _CorrTreeBase):
    """Classification with 2NN(m, b) trained by exact gradient descent on a
    classification loss, with class probabilities.

    Parameters as :class:`CorrTreeRegressor`, plus:

    loss : {"cross_entropy", "logistic", "squared"}, default "cross_entropy"
        ``"cross_entropy"``: softmax over one output per class (for two classes, the
        same model with one output: the logistic loss); ``"logistic"``: two classes
        only, one output; ``"squared"``: the paper's ℓ2 loss on ±1 (two classes) or
        one-hot (more) targets, without probabilities.  ``lr="auto"`` takes the loss's
        curvature into account (:func:`corrtree.train`).

    Attributes as :class:`CorrTreeRegressor`, plus ``classes_``.  ``predict_proba``
    and ``predict_log_proba`` exist for the probabilistic losses.
    """

    def __init__(
        self,
        width: int = 4096,
        method: str = "auto",
        lr: float | str = "auto",
        iters: int = 100,
        threshold: float | None = None,
        normalize: bool = True,
        standardize: bool = True,
        random_state: int | None = None,
        batch_size: int | None = None,
        epochs: int | None = None,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        schedule: str | None = None,
        implicit: bool = False,
        device: str | None = None,
        loss: str = "cross_entropy",
    ) -> None:
        super().__init__(
            width=width,
            method=method,
            lr=lr,
            iters=iters,
            threshold=threshold,
            normalize=normalize,
            standardize=standardize,
            random_state=random_state,
            batch_size=batch_size,
            epochs=epochs,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            schedule=schedule,
            implicit=implicit,
            device=device,
        )
        self.loss = loss

    def fit(self, X: np.ndarray, y: np.ndarray) -> CorrTreeClassifier:
        if self.loss not in ("cross_entropy", "logistic", "squared"):
            raise ValueError(
                f"loss must be 'cross_entropy', 'logistic' or 'squared'; got {self.loss!r}"
            )
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("CorrTreeClassifier needs at least 2 classes in y; got one class")
        two = len(self.classes_) == 2
        if self.loss == "logistic" and not two:
            raise ValueError(
                f"loss='logistic' takes two classes; y has {len(self.classes_)}: "
                "use loss='cross_entropy'"
            )
        if self.loss == "squared":
            self._loss = "squared"
            targets = LabelBinarizer(neg_label=-1, pos_label=1).fit_transform(y)
        elif two:  # cross-entropy of two classes: the logistic loss of one output
            self._loss, targets = "logistic", codes[:, None]
        else:
            self._loss = "cross_entropy"
            targets = np.eye(len(self.classes_))[codes]
        self._fit(X, np.asarray(targets, dtype=np.float64), self._loss)
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Network outputs: shape ``(n,)`` for two classes (the logit of the second
        class, or the ±1 regression), ``(n, K)`` otherwise."""
        out = self._outputs(X)
        return out[:, 0] if len(self.classes_) == 2 else out

    def predict(self, X: np.ndarray) -> np.ndarray:
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    @available_if(lambda est: est.loss != "squared")
    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities, ``(n, len(classes_))``: ``softmax`` of the outputs
        (cross-entropy), ``[1 − σ(u), σ(u)]`` of the one output (two classes)."""
        u = self._outputs(X)  # checks that the estimator is fitted first
        return get_loss(self._loss).probabilities(u)

    @available_if(lambda est: est.loss != "squared")
    def predict_log_proba(self, X: np.ndarray) -> np.ndarray:
        """``log`` of :meth:`predict_proba`, computed without underflow."""
        u = self._outputs(X)
        if self._loss == "logistic":
            return np.stack([-np.logaddexp(0.0, u[:, 0]), -np.logaddexp(0.0, -u[:, 0])], axis=1)
        top = u.max(axis=1, keepdims=True)
        return u - top - np.log(np.exp(u - top).sum(axis=1, keepdims=True))
