"""scikit-learn conformance of the estimators."""

import numpy as np
import pytest
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import corrtree as ct
from corrtree.sklearn import CorrTreeClassifier, CorrTreeRegressor


@parametrize_with_checks(
    [
        CorrTreeRegressor(width=256, iters=15, random_state=0),
        CorrTreeClassifier(width=256, iters=15, random_state=0),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_init_only_stores_parameters():
    est = CorrTreeRegressor(width=7, method="lazy", lr=0.5, iters=3, threshold=0.1, random_state=4)
    assert est.get_params() == {
        "width": 7,
        "method": "lazy",
        "lr": 0.5,
        "iters": 3,
        "threshold": 0.1,
        "normalize": True,
        "standardize": True,
        "random_state": 4,
        "batch_size": None,
        "epochs": None,
        "momentum": 0.0,
        "nesterov": False,
        "weight_decay": 0.0,
        "schedule": None,
        "implicit": False,
        "device": None,
    }
    assert not [k for k in vars(est) if k.endswith("_")]


def test_classifier_in_pipeline_and_cross_validation():
    ds = ct.datasets.digits(test_size=0.5, seed=0)
    X = ds.X_train
    y = ds.classes[ds.y_train.argmax(axis=1)]
    pipe = make_pipeline(StandardScaler(), CorrTreeClassifier(width=2048, iters=30, random_state=0))
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.mean() > 0.85  # chance is 0.1
    clf = CorrTreeClassifier(width=2048, iters=30, random_state=0, method="wtree").fit(X, y)
    assert set(clf.predict(X)) <= set(clf.classes_)
    assert clf.history_.method == "wtree" and clf.n_iter_ == 30
    assert clf.score(X, y) > 0.9


def test_regressor_fits_and_scores():
    ds = ct.datasets.sphere(n=80, d=8, outputs=2, seed=3)
    reg = CorrTreeRegressor(width=4096, iters=80, random_state=1).fit(ds.X_train, ds.y_train)
    assert reg.predict(ds.X_train).shape == (80, 2)
    assert reg.score(ds.X_train, ds.y_train) > 0.99  # over-parameterized: fits the data
    one = CorrTreeRegressor(width=512, iters=5, random_state=1).fit(ds.X_train, ds.y_train[:, 0])
    assert one.predict(ds.X_train).shape == (80,)


def test_bad_parameters():
    X, y = np.eye(3), np.arange(3.0)
    with pytest.raises(ValueError, match="width must be an integer >= 1"):
        CorrTreeRegressor(width=0).fit(X, y)
    with pytest.raises(ValueError, match="random_state must be an integer"):
        CorrTreeRegressor(random_state="x").fit(X, y)
    with pytest.raises(ValueError, match="method must be one of"):
        CorrTreeRegressor(method="magic").fit(X, y)


def test_estimators_train_with_sgd():
    ds = ct.datasets.sphere(n=90, d=8, seed=5)
    kw = {"width": 1024, "lr": 0.3, "random_state": 2, "batch_size": 16, "epochs": 3}
    kw.update(momentum=0.9, weight_decay=1e-3, schedule="cosine")
    dense = CorrTreeRegressor(method="dense", **kw).fit(ds.X_train, ds.y_train)
    lazy = CorrTreeRegressor(method="lazy", **kw).fit(ds.X_train, ds.y_train)
    assert dense.n_iter_ == lazy.n_iter_ == 3 * 6
    assert len(lazy.history_.epoch_loss) == 3
    W, W_ref = lazy.model_.W, dense.model_.W
    assert np.linalg.norm(W - W_ref) <= 1e-9 * np.linalg.norm(W_ref)
    with pytest.raises(ValueError, match="momentum must be"):
        CorrTreeRegressor(momentum=2.0).fit(ds.X_train, ds.y_train)
