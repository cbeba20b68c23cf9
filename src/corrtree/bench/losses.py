"""The classification losses: whole runs beside the squared loss, and held-out quality.

**Speed.** The two workloads of :mod:`.workloads` whose labels are classes, W3 (digits,
K = 10) and W5 (breast cancer, two classes), each trained with the squared loss and with
its classification loss (cross-entropy over the ten outputs; the logistic loss of the one
output), by the same whole runs (:func:`.workloads.median_run`: set-up, ``lr="auto"``
and every iteration, each in a fresh process, dense numpy extrapolated from its first
iterations) and side by side in one session: the speed-up of the fastest exact method
over dense numpy with the same loss, for each loss.  Every method's first losses must
equal dense's (1e-9).

**Quality.** 5-fold stratified cross-validation on digits, breast cancer and wine:
accuracy and log-loss of :class:`~corrtree.sklearn.CorrTreeClassifier` (cross-entropy,
its default) beside scikit-learn's ``MLPClassifier`` (one hidden layer of the same width,
its defaults otherwise) and ``LogisticRegression``, each on standardized features.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import workloads
from ._util import in_child, print_table, save_result

__all__ = ["SIZES", "run"]

#: workload -> its classification loss
CLASSIFICATION = {"W3": "cross_entropy", "W5": "logistic"}
SIZES: dict[str, dict[str, Any]] = {
    # small: the kernel trainer left out (on all of digits its set-up alone takes ~20 s)
    "small": {
        "scale_m": 1 / 64,
        "iters": 12,
        "budget_s": 60.0,
        "measured": 4,
        "folds": 2,
        "methods": ("dense", "lazy"),
    },
    # the kernel trainer past 60 s is extrapolated (W3: lazy is the fastest by far)
    "large": {
        "scale_m": 1.0,
        "iters": None,
        "budget_s": 60.0,
        "measured": 5,
        "folds": 5,
        "methods": ("dense", "lazy", "kernel"),
    },
}
QUALITY_DATA = ("digits", "breast_cancer", "wine")


def _speed(p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, loss in CLASSIFICATION.items():
        w = workloads.WORKLOADS[name]
        m = max(256, int(w["m"] * p["scale_m"]))
        iters = p["iters"] or w["iters"]
        common = (w["data"], w["args"], 1.0, m, iters, p["measured"], p["budget_s"])
        for which in ("squared", loss):
            # dense first: its losses are the reference
            runs = {k: workloads.median_run(k, *common, None, which) for k in p["methods"]}
            ref = runs["dense"]["loss"]
            agree = all(
                np.allclose(r["loss"][: len(ref)], ref[: len(r["loss"])], rtol=1e-9, atol=0)
                for r in runs.values()
            )
            best = min(p["methods"][1:], key=lambda k: runs[k]["total_s"])
            dense = runs["dense"]["total_s"]
            out[f"{name} {which}"] = {
                "workload": name,
                "loss": which,
                "m": m,
                "iters": iters,
                "runs": runs,
                "best": best,
                "speedup_vs_dense": dense / runs[best]["total_s"],
                "losses_agree_with_dense": bool(agree),
            }
            print_table(
                f"{name} {which}: m={m}, {iters} iterations",
                ["method", "whole run (s)", "vs dense"],
                [[k, r["total_s"], dense / r["total_s"]] for k, r in runs.items()],
            )
        sq, cl = out[f"{name} squared"], out[f"{name} {loss}"]
        cl["vs_squared_speedup"] = cl["speedup_vs_dense"] / sq["speedup_vs_dense"]
    return out


def _dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets as skd

    load = {
        "digits": skd.load_digits,
        "breast_cancer": skd.load_breast_cancer,
        "wine": skd.load_wine,
    }[name]
    data = load()
    return data.data.astype(np.float64), data.target


def _quality(folds: int, width: int, iters: int) -> dict[str, Any]:
    """Cross-validated accuracy and log-loss of the three classifiers on each data set."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, log_loss
    from sklearn.model_selection import StratifiedKFold
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ..sklearn import CorrTreeClassifier

    models = {
        "corrtree (cross-entropy)": lambda: CorrTreeClassifier(
            width=width, iters=iters, random_state=0
        ),
        "MLPClassifier": lambda: make_pipeline(
            StandardScaler(), MLPClassifier(hidden_layer_sizes=(width,), random_state=0)
        ),
        "LogisticRegression": lambda: make_pipeline(
            StandardScaler(), LogisticRegression(max_iter=5000)
        ),
    }
    out: dict[str, Any] = {}
    for data in QUALITY_DATA:
        X, y = _dataset(data)
        split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=0)
        for label, make in models.items():
            acc, ll, secs = [], [], []
            for train, test in split.split(X, y):
                t0 = time.perf_counter()
                est = make().fit(X[train], y[train])
                secs.append(time.perf_counter() - t0)
                proba = est.predict_proba(X[test])
                acc.append(accuracy_score(y[test], est.predict(X[test])))
                ll.append(log_loss(y[test], proba, labels=np.unique(y)))
            out[f"{data} | {label}"] = {
                "data": data,
                "model": label,
                "n": int(X.shape[0]),
                "classes": int(np.unique(y).shape[0]),
                "accuracy_mean": float(np.mean(acc)),
                "accuracy_std": float(np.std(acc)),
                "log_loss_mean": float(np.mean(ll)),
                "log_loss_std": float(np.std(ll)),
                "fit_s_mean": float(np.mean(secs)),
            }
    print_table(
        f"{folds}-fold cross-validation",
        ["data", "model", "accuracy", "log-loss", "fit (s)"],
        [
            [r["data"], r["model"], r["accuracy_mean"], r["log_loss_mean"], r["fit_s_mean"]]
            for r in out.values()
        ],
    )
    return out


def run(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    """Speed beside the squared loss, then cross-validated quality; JSON to ``out_dir``."""
    p = SIZES[size]
    speed = _speed(p)
    save_result(out_dir, f"losses_{size}", {"size": size, "speed": speed})
    width, iters = (4096, 100) if size == "large" else (512, 20)
    quality = in_child(_quality, p["folds"], width, iters)
    result = {
        "size": size,
        "speed": speed,
        "quality": quality,
        "quality_settings": {"folds": p["folds"], "width": width, "iters": iters},
    }
    save_result(out_dir, f"losses_{size}", result)
    return result
