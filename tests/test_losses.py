"""The classification losses: every method against PyTorch autograd on the same 2NN(m, b),
full batch and mini-batch SGD, and what the loss touches around training (lr="auto",
checkpoints, labels, estimators, the command line)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import corrtree as ct
from corrtree.training import losses as L
from corrtree.training.optim import SGD, Optimizer

torch = pytest.importorskip("torch")
F = torch.nn.functional

METHODS = ("dense", "dtree", "wtree", "lazy", "kernel")


def _problem(loss: str, n: int = 60, d: int = 12, m: int = 1024, seed: int = 0):
    """Data, labels and a model: K = 1 for the logistic loss, K = 10 for cross-entropy."""
    K = 1 if loss == "logistic" else 10
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    if K == 1:
        labels = (X[:, 0] + 0.3 * rng.standard_normal(n) > 0).astype(np.int64)
    else:
        labels = np.arange(n) % K
        rng.shuffle(labels)
    model = ct.TwoLayerReLU.init(d=d, m=m, outputs=K, seed=seed)
    return X, labels, model


def _copy(model):
    return ct.TwoLayerReLU(model.W, model.a, model.b)


def reference(model, X, labels, loss, lr, iters, sgd: SGD | None = None):
    """``iters`` steps of ``torch.optim.SGD`` on ``W`` of the same network, the gradient
    by autograd of ``F.binary_cross_entropy_with_logits`` or ``F.cross_entropy`` summed
    over the step's points, with corrtree's batches and schedule factors.  Returns the
    final ``W`` and the loss of every step."""
    sgd = sgd or SGD()
    n = X.shape[0]
    W = torch.tensor(np.array(model.W), dtype=torch.float64, requires_grad=True)
    a = torch.tensor(np.array(model.output_weights), dtype=torch.float64)
    Xt = torch.tensor(X, dtype=torch.float64)
    y = torch.tensor(labels)
    opt = torch.optim.SGD(
        [W],
        lr=lr,
        momentum=sgd.momentum,
        weight_decay=sgd.weight_decay,
        nesterov=sgd.nesterov,
    )
    plan = Optimizer(sgd, n, lr, iters)
    out = []
    for t in range(iters):
        B = plan.batch(t)
        idx = torch.arange(n) if B is None else torch.tensor(B)
        U = Xt[idx] @ W.T - model.b
        f = torch.where(U >= 0, U, 0.0) @ a / np.sqrt(model.m)  # fires at >= b, as corrtree
        if loss == "logistic":
            value = F.binary_cross_entropy_with_logits(f[:, 0], y[idx].double(), reduction="sum")
        else:
            value = F.cross_entropy(f, y[idx], reduction="sum")
        out.append(value.item())
        opt.zero_grad()
        value.backward()
        for group in opt.param_groups:
            group["lr"] = lr * plan.factor(t)
        opt.step()
    return W.detach().numpy(), out


def _close(W, ref):
    return np.linalg.norm(W - ref) <= 1e-9 * np.linalg.norm(ref)


@pytest.mark.parametrize("method", [*METHODS, "auto"])
@pytest.mark.parametrize("loss", ["logistic", "cross_entropy"])
def test_full_batch_follows_pytorch_autograd(method, loss):
    X, labels, model = _problem(loss)
    W0 = _copy(model)
    hist = ct.train(model, X, labels, method=method, loss=loss, iters=12)
    W, losses = reference(W0, X, labels, loss, hist.lr, 12)
    assert _close(model.W, W), method
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
    assert hist.info["loss"] == loss and len(hist.accuracy) == 12
    final = ct.TwoLayerReLU(W, model.a, model.b).loss(X, labels, loss)
    assert abs(hist.final_loss - final) <= 1e-9 * final


@pytest.mark.parametrize("method", ["dense", "wtree", "lazy", "kernel"])
@pytest.mark.parametrize("loss", ["logistic", "cross_entropy"])
def test_sgd_with_momentum_weight_decay_and_a_schedule_follows_pytorch(method, loss):
    X, labels, model = _problem(loss, m=512)
    W0 = _copy(model)
    sgd = SGD(batch_size=16, momentum=0.9, weight_decay=1e-3, schedule="cosine", shuffle_seed=3)
    kw = dict(batch_size=16, momentum=0.9, weight_decay=1e-3, schedule="cosine", shuffle_seed=3)
    hist = ct.train(model, X, labels, method=method, loss=loss, lr=0.5, iters=10, **kw)
    W, losses = reference(W0, X, labels, loss, 0.5, 10, sgd)
    assert _close(model.W, W), method
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("loss", ["logistic", "cross_entropy"])
def test_errors_from_stale_outputs_break_the_trajectory(method, loss, monkeypatch):
    """The check above is sharp: errors computed from the previous step's outputs (as a
    trainer that kept ``err`` would) leave the autograd trajectory."""
    X, labels, model = _problem(loss)
    W0 = _copy(model)
    # the method's kernels loaded first: a cold process warms them up by tiny runs of
    # its own, which must not meet the stale errors below
    ct.train(_copy(model), X, labels, method=method, loss=loss, iters=1)
    real = Optimizer.errors
    previous = {}

    def stale(self, t, ub, Y):
        err, value, step = real(self, t, previous.get("u", ub), Y)
        previous["u"] = ub.copy()  # kept: a trainer may update its outputs in place
        return err, value, step

    monkeypatch.setattr(Optimizer, "errors", stale)
    hist = ct.train(model, X, labels, method=method, loss=loss, iters=8)
    W, _ = reference(W0, X, labels, loss, hist.lr, 8)
    assert np.linalg.norm(model.W - W) > 1e-6 * np.linalg.norm(W)


@pytest.mark.parametrize("loss", ["logistic", "cross_entropy"])
def test_sharded_device_and_implicit_runs_follow_dense(loss):
    X, labels, model = _problem(loss)
    dense = _copy(model)
    ref = ct.train(dense, X, labels, method="dense", loss=loss, iters=10)
    sharded = _copy(model)
    ct.train(sharded, X, labels, method="kernel", loss=loss, iters=10, shards=3)
    assert _close(sharded.W, dense.W)
    for method in ("dense", "lazy", "kernel"):
        on_device = _copy(model)
        hist = ct.train(on_device, X, labels, method=method, loss=loss, iters=10, device="cpu")
        assert _close(on_device.W, dense.W), method
        np.testing.assert_allclose(hist.loss, ref.loss, rtol=1e-9)
    K = model.outputs
    implicit = ct.TwoLayerReLU.init(d=X.shape[1], m=1024, outputs=K, seed=5, implicit=True)
    explicit = ct.TwoLayerReLU(implicit.weights(), implicit.a, implicit.b)
    ct.train(implicit, X, labels, method="kernel", loss=loss, iters=10)
    ct.train(explicit, X, labels, method="dense", loss=loss, iters=10)
    assert _close(implicit.weights(), explicit.W)


def test_lr_auto_divides_by_the_curvature_of_the_loss():
    X, labels, model = _problem("cross_entropy")
    onehot = np.eye(10)[labels]
    runs = {
        name: ct.train(_copy(model), X, onehot, method="dense", loss=name, iters=1).lr
        for name in ("squared", "cross_entropy")
    }
    assert runs["cross_entropy"] == pytest.approx(2.0 * runs["squared"], rel=1e-12)
    X, labels, model = _problem("logistic")
    sq = ct.train(_copy(model), X, 2.0 * labels - 1, method="dense", iters=1).lr
    lo = ct.train(_copy(model), X, labels, method="dense", loss="logistic", iters=1).lr
    assert lo == pytest.approx(4.0 * sq, rel=1e-12)


def test_checkpoints_record_the_loss_and_resume_with_it(tmp_path):
    X, labels, model = _problem("cross_entropy")
    whole = _copy(model)
    ct.train(whole, X, labels, method="kernel", loss="cross_entropy", iters=10)
    path = tmp_path / "run.npz"
    part = _copy(model)
    ct.train(
        part, X, labels, method="kernel", loss="cross_entropy", iters=4, checkpoint=path,
        checkpoint_every=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match="trains loss='cross_entropy'"):
        ct.resume(path, X, labels, iters=10, loss="squared")
    resumed, hist = ct.resume(path, X, labels, iters=10)
    assert np.array_equal(resumed.W, whole.W) and hist.info["loss"] == "cross_entropy"


@pytest.mark.parametrize(
    ("loss", "outputs", "y", "message"),
    [
        ("logistic", 1, np.arange(30) % 3, "two classes as 0/1 or -1/\\+1"),
        ("logistic", 1, np.zeros(30), "one class only"),
        ("logistic", 3, np.arange(30) % 2, "trains one output"),
        ("cross_entropy", 3, np.linspace(0, 1, 30), "integer class labels"),
        ("cross_entropy", 3, np.arange(30) % 5, "holds class 3, out of range 0..2"),
        ("cross_entropy", 3, np.ones(30), "one class only"),
        ("cross_entropy", 1, np.arange(30) % 2, "K >= 2 outputs"),
        ("cross_entropy", 3, np.full((30, 3), 0.5), "one-hot rows"),
        ("hinge", 1, np.arange(30) % 2, "loss must be one of"),
    ],
)
def test_labels_that_do_not_fit_the_loss_are_refused_in_one_line(loss, outputs, y, message):
    X = ct.datasets.sphere(n=30, d=5, seed=0).X_train
    model = ct.TwoLayerReLU.init(d=5, m=64, outputs=outputs)
    with pytest.raises(ValueError, match=message) as err:
        ct.train(model, X, y, loss=loss, iters=1)
    assert "\n" not in str(err.value)


def test_losses_are_stable_at_large_outputs():
    u = np.array([[1e3, -1e3, 0.0], [-800.0, 700.0, 700.0]])
    Y = np.eye(3)[[0, 1]]
    ce = L.LOSSES["cross_entropy"]
    assert ce.value(u, Y) == pytest.approx(np.log(2.0))  # the second row: two equal logits
    assert np.isfinite(ce.errors(u, Y)).all()
    np.testing.assert_allclose(ce.probabilities(u).sum(axis=1), 1.0)
    lo = L.LOSSES["logistic"]
    big = np.array([[1e4], [-1e4]])
    assert lo.value(big, np.array([[1.0], [0.0]])) == 0.0
    assert lo.value(big, np.array([[0.0], [1.0]])) == pytest.approx(2e4)
    np.testing.assert_array_equal(lo.errors(big, np.array([[1.0], [0.0]])), 0.0)
    ref = F.cross_entropy(torch.tensor(u), torch.tensor([0, 1]), reduction="sum").item()
    assert ce.value(u, Y) == pytest.approx(ref, rel=1e-12)


def test_the_classifier_gives_probabilities():
    from sklearn.metrics import log_loss

    from corrtree.sklearn import CorrTreeClassifier

    ds = ct.datasets.digits(test_size=0.3, seed=0)
    labels = ds.y_train.argmax(axis=1)
    clf = CorrTreeClassifier(width=2048, iters=20, random_state=0).fit(ds.X_train, labels)
    assert clf.history_.info["loss"] == "cross_entropy"
    proba = clf.predict_proba(ds.X_test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(ds.X_test)), proba, rtol=1e-12)
    np.testing.assert_array_equal(clf.predict(ds.X_test), proba.argmax(axis=1))
    assert log_loss(ds.y_test.argmax(axis=1), proba) < 0.5
    bc = ct.datasets.breast_cancer(seed=0)
    names = np.where(bc.y_train > 0, "malignant", "benign")
    binary = CorrTreeClassifier(width=1024, iters=20, random_state=0).fit(bc.X_train, names)
    assert binary.history_.info["loss"] == "logistic" and binary.model_.outputs == 1
    p = binary.predict_proba(bc.X_test)
    assert p.shape == (bc.X_test.shape[0], 2)
    np.testing.assert_array_equal(binary.predict(bc.X_test), binary.classes_[p.argmax(axis=1)])
    squared = CorrTreeClassifier(width=1024, iters=5, loss="squared", random_state=0)
    assert not hasattr(squared.fit(bc.X_train, names), "predict_proba")
    with pytest.raises(ValueError, match="loss='logistic' takes two classes"):
        CorrTreeClassifier(loss="logistic", iters=2).fit(ds.X_train, labels)


def test_cli_trains_the_loss_it_is_given(tmp_path):
    from test_cli import run

    out = tmp_path / "o"
    run("train", "--data", "digits", "--width", "1024", "--iters", "5", "--loss",
        "cross_entropy", "--quiet", "--out", out)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    history = json.loads((out / "history.json").read_text())
    assert summary["loss"] == "cross_entropy" and history["info"]["loss"] == "cross_entropy"
    assert len(history["accuracy"]) == 5
    refused = run("train", "--data", "sphere", "--loss", "logistic", "--out", out, check=False)
    assert refused.returncode == 1 and "needs class labels" in refused.stderr
    # the probabilities of the trained model: softmax of its outputs, on its own transform
    ds = ct.datasets.digits()
    np.savez(tmp_path / "x.npz", X=ds.X_test[:7])
    model = ct.TwoLayerReLU.load(out / "model.npz")
    from corrtree.preprocessing import load_transform

    u = model.predict(load_transform(out / "model.npz", model.d)(ds.X_test[:7]))
    shown = run("predict", "--model", out / "model.npz", "--data", tmp_path / "x.npz", "--proba")
    proba = np.array([[float(v) for v in line.split(",")] for line in shown.stdout.split()])
    want = np.exp(u - u.max(axis=1, keepdims=True))
    np.testing.assert_allclose(proba, want / want.sum(axis=1, keepdims=True), rtol=1e-8)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-8)
    # a model of the squared loss gives none: one line naming the loss
    summary["loss"] = "squared"
    (out / "summary.json").write_text(json.dumps(summary))
    args = ("predict", "--model", out / "model.npz", "--data", tmp_path / "x.npz", "--proba")
    refused = run(*args, check=False)
    assert refused.returncode == 1 and "squared loss" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
