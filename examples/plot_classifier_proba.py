"""
Probabilities from the scikit-learn classifier
==============================================

:class:`corrtree.sklearn.CorrTreeClassifier` trains the logistic loss on two classes and
gives probabilities, so scikit-learn's metrics and calibration tools work with it as with
``LogisticRegression``. A reliability diagram on held-out breast-cancer points.
"""

import matplotlib.pyplot as plt
from sklearn.calibration import calibration_curve
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import train_test_split

from corrtree.sklearn import CorrTreeClassifier

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0)

models = {
    "corrtree": CorrTreeClassifier(width=4096, iters=60, random_state=0),
    "LogisticRegression": LogisticRegression(max_iter=5000),
}
fig, ax = plt.subplots(figsize=(5, 4))
ax.plot([0, 1], [0, 1], ":", color="grey")
for name, model in models.items():
    model.fit(X_train, y_train)
    proba = model.predict_proba(X_test)[:, 1]
    frac, mean = calibration_curve(y_test, proba, n_bins=6)
    ax.plot(mean, frac, "o-", label=name)
    print(
        f"{name:18s} log-loss {log_loss(y_test, proba):.3f}  "
        f"ROC AUC {roc_auc_score(y_test, proba):.4f}  accuracy {model.score(X_test, y_test):.3f}"
    )
ax.set_xlabel("predicted probability")
ax.set_ylabel("observed frequency")
ax.legend()
ax.set_title("breast cancer, held-out 30%")
fig.tight_layout()
