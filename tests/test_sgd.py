"""Mini-batch SGD with momentum, weight decay and schedules: every method follows the
brute-force reference in ``naive.sgd`` and ``torch.optim.SGD`` on the same batches."""

import math

import numpy as np
import pytest
from naive import gradient_descent, sgd

import corrtree as ct

METHODS = ("dense", "dtree", "wtree", "lazy", "kernel")

OPTIMIZERS = {
    "plain": {},
    "momentum": {"momentum": 0.9},
    "nesterov+decay": {"momentum": 0.8, "nesterov": True, "weight_decay": 0.005},
    "decay+cosine": {"weight_decay": 0.1, "schedule": "cosine"},
    "momentum+step": {"momentum": 0.5, "schedule": "step"},
}


def _problem(n, m, d, outputs, seed, b_scale=0.7):
    ds = ct.datasets.sphere(n=n, d=d, outputs=outputs, seed=seed)
    model = ct.TwoLayerReLU.init(d=d, m=m, outputs=outputs, seed=seed + 1)
    return ds.X_train, ds.y_train, ct.TwoLayerReLU(model.W, model.a, model.b * b_scale)


def _batches(n, size, epochs, seed):
    """The documented batch order: slices of a permutation drawn from (seed, epoch)."""
    out = []
    for e in range(epochs):
        order = np.random.default_rng([seed, e]).permutation(n)
        out += [order[s : s + size] for s in range(0, n, size)]
    return out


def _factors(schedule, steps, per_epoch, epochs):
    if schedule == "cosine":
        return [0.5 * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]
    if schedule == "step":
        marks = {epochs // 2, 3 * epochs // 4} - {0}
        return [0.1 ** sum(t // per_epoch >= k for k in marks) for t in range(steps)]
    return [1.0] * steps


def _train(model0, X, y, method, **kw):
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    hist = ct.train(model, X, y, method=method, **kw)
    return hist, model.W.copy()


def _close(W, ref):
    assert np.linalg.norm(W - ref) <= 1e-9 * np.linalg.norm(ref)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("outputs", [1, 3])
def test_every_method_follows_the_reference(method, name, outputs):
    n, m, d, size, epochs, lr = 50, 600, 10, 12, 4, 0.6
    X, y, model0 = _problem(n, m, d, outputs, seed=outputs)
    opt = OPTIMIZERS[name]
    batches = _batches(n, size, epochs, seed=7)
    factors = _factors(opt.get("schedule"), len(batches), len(batches) // epochs, epochs)
    kw = {k: v for k, v in opt.items() if k != "schedule"}
    W_ref, losses = sgd(model0.W, model0.a, model0.b, X, y, lr, batches, factors, **kw)
    hist, W = _train(
        model0, X, y, method, lr=lr, batch_size=size, epochs=epochs, shuffle_seed=7, **opt
    )
    assert len(hist) == len(batches) == epochs * hist.info["steps_per_epoch"]
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
    _close(W, W_ref)
    assert len(hist.epoch_loss) == epochs
    full = 0.5 * np.sum((ct.TwoLayerReLU(W, model0.a, model0.b).predict(X) - y) ** 2)
    assert hist.epoch_loss[-1] == pytest.approx(full, rel=1e-9)
    assert hist.final_loss == pytest.approx(full, rel=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_full_batch_with_momentum_and_decay(method):
    X, y, model0 = _problem(40, 500, 8, 2, seed=4)
    kw = {"momentum": 0.7, "weight_decay": 0.03}
    W_ref, losses = sgd(
        model0.W, model0.a, model0.b, X, y, 0.5, [np.arange(40)] * 12, [1.0] * 12, **kw
    )
    hist, W = _train(model0, X, y, method, lr=0.5, iters=12, **kw)
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
    _close(W, W_ref)


def test_one_batch_of_every_point_is_full_batch_gradient_descent():
    X, y, model0 = _problem(30, 400, 8, 1, seed=5)
    full, W_full = _train(model0, X, y, "lazy", lr=0.5, iters=6)
    hist, W = _train(model0, X, y, "lazy", lr=0.5, batch_size=30, epochs=6)
    assert hist.loss == full.loss and np.array_equal(W, W_full)
    W_ref, losses = gradient_descent(model0.W, model0.a, model0.b, X, y, 0.5, 6)
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
    _close(W, W_ref)


def test_a_callable_schedule_and_a_last_short_batch():
    X, y, model0 = _problem(23, 300, 6, 1, seed=6)
    batches = _batches(23, 10, 3, seed=0)
    assert [len(b) for b in batches[:3]] == [10, 10, 3]
    factors = [1.0 / (1 + t) for t in range(len(batches))]
    W_ref, losses = sgd(model0.W, model0.a, model0.b, X, y, 0.8, batches, factors, momentum=0.5)
    for method in ("dense", "kernel"):
        hist, W = _train(
            model0,
            X,
            y,
            method,
            lr=0.8,
            batch_size=10,
            epochs=3,
            momentum=0.5,
            schedule=lambda t: 1.0 / (1 + t),
        )
        np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
        _close(W, W_ref)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("outputs", "method"), [(1, "lazy"), (3, "kernel"), (2, "wtree")])
@pytest.mark.parametrize("nesterov", [False, True])
def test_same_weights_as_torch_optim_sgd(outputs, method, nesterov):
    n, m, d, size, epochs, lr = 40, 500, 10, 16, 3, 0.5
    mu, lam = 0.9, 0.01
    X, y, model0 = _problem(n, m, d, outputs, seed=outputs + 10)
    hist, W = _train(
        model0,
        X,
        y,
        method,
        lr=lr,
        batch_size=size,
        epochs=epochs,
        momentum=mu,
        nesterov=nesterov,
        weight_decay=lam,
        schedule="cosine",
        shuffle_seed=3,
    )
    Xt = torch.tensor(X, dtype=torch.float64)
    Yt = torch.tensor(y.reshape(n, -1), dtype=torch.float64)
    A = torch.tensor(model0.a.reshape(m, -1), dtype=torch.float64)
    Wt = torch.nn.Parameter(torch.tensor(model0.W, dtype=torch.float64))
    opt = torch.optim.SGD([Wt], lr=lr, momentum=mu, nesterov=nesterov, weight_decay=lam)
    batches = _batches(n, size, epochs, seed=3)
    steps = len(batches)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * t / steps))
    )
    losses = []
    for B in batches:
        Bt = torch.as_tensor(B)
        out = torch.relu(Xt[Bt] @ Wt.T - model0.b) @ A / math.sqrt(m)
        loss = 0.5 * ((out - Yt[Bt]) ** 2).sum()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-9)
    _close(W, Wt.detach().numpy())


@pytest.mark.parametrize("method", ["dense", "wtree", "lazy", "kernel"])
def test_resume_continues_the_optimizer_bit_for_bit(method, tmp_path):
    X, y, model0 = _problem(30, 400, 8, 2, seed=8)
    kw = {"lr": 0.5, "batch_size": 8, "epochs": 3, "momentum": 0.9, "weight_decay": 0.02}
    full, W_full = _train(model0, X, y, method, **kw)
    path = tmp_path / "run.ckpt"
    ct.train(  # stopped by the callback after step 6; the checkpoint holds step 5
        ct.TwoLayerReLU(model0.W, model0.a, model0.b),
        X,
        y,
        method=method,
        checkpoint=path,
        checkpoint_every=5,
        callback=lambda t, hist: t < 6,
        **kw,
    )
    resumed, hist = ct.resume(path, X, y)
    assert hist.loss == full.loss
    np.testing.assert_array_equal(resumed.W, W_full)


def test_sharded_sgd_is_the_one_process_trajectory():
    X, y, model0 = _problem(30, 401, 8, 3, seed=9)
    kw = {"lr": 0.5, "batch_size": 7, "epochs": 2, "momentum": 0.9, "weight_decay": 0.01}
    for method in ("dense", "lazy", "kernel"):
        one, W_one = _train(model0, X, y, method, **kw)
        three, W_three = _train(model0, X, y, method, shards=3, **kw)
        np.testing.assert_allclose(three.loss, one.loss, rtol=1e-9)
        _close(W_three, W_one)
        np.testing.assert_allclose(three.epoch_loss, one.epoch_loss, rtol=1e-9)


def test_held_out_loss_after_every_epoch():
    X, y, model0 = _problem(40, 300, 8, 1, seed=11)
    ds = ct.datasets.sphere(n=15, d=8, seed=99)
    hist, W = _train(
        model0, X, y, "lazy", lr=0.5, batch_size=10, epochs=2, eval_set=(ds.X_train, ds.y_train)
    )
    model = ct.TwoLayerReLU(W, model0.a, model0.b)
    assert hist.epoch_test_loss[-1] == pytest.approx(model.loss(ds.X_train, ds.y_train), rel=1e-9)
    assert len(hist.epoch_test_loss) == 2
    assert ct.History.from_dict(hist.as_dict()).epoch_test_loss == hist.epoch_test_loss


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"momentum": 1.0}, "momentum must be"),
        ({"momentum": -0.1}, "momentum must be"),
        ({"weight_decay": float("nan")}, "weight_decay must be"),
        ({"nesterov": True}, "nesterov=True needs momentum"),
        ({"batch_size": 0}, "batch_size must be"),
        ({"epochs": 2, "iters": 3}, "iters or epochs"),
        ({"schedule": "linear"}, "schedule must be"),
        ({"shuffle_seed": -1}, "shuffle_seed must be"),
        ({"eval_set": (np.ones((3, 5)), np.ones(3))}, "columns"),
        ({"method": "lazy", "weight_decay": 10.0, "lr": 1.0}, "weight_decay=10.0"),
        ({"batch_size": 4, "epochs": 1, "schedule": lambda t: -1.0}, r"schedule\(0\)"),
    ],
)
def test_bad_optimizer_arguments(kw, match):
    X, y, model0 = _problem(20, 100, 8, 1, seed=12)
    kw = {"method": "dense", "lr": 0.5, **kw}
    with pytest.raises(ValueError, match=match):
        _train(model0, X, y, **kw)


def test_a_damaged_optimizer_state_is_refused(tmp_path):
    import json

    X, y, model0 = _problem(20, 200, 6, 1, seed=13)
    path = tmp_path / "c.npz"
    kw = {"lr": 0.5, "batch_size": 5, "epochs": 2, "momentum": 0.5, "checkpoint": path}
    _train(model0, X, y, "dense", checkpoint_every=3, callback=lambda t, h: t < 4, **kw)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    manifest = json.loads(str(arrays["manifest"]))
    manifest["meta"]["optimizer"] = {"alpha": -1.0, "beta": 0.0}
    from corrtree.training.checkpoint import digest_of

    arrays.pop("manifest")
    manifest["digest"] = digest_of(manifest, arrays)  # re-signed: only the schema can catch it
    np.savez(path, manifest=json.dumps(manifest), **arrays)
    with pytest.raises(ct.CheckpointError, match="optimizer state is damaged"):
        ct.resume(path, X, y)


def test_auto_counts_the_batch_for_dense_and_the_lazy_step_for_kernel():
    from corrtree.training._choice import choose_method
    from corrtree.training.optim import SGD

    X, _, model0 = _problem(300, 8192, 32, 1, seed=14, b_scale=1.0)
    G = X @ X.T
    full, costs = choose_method(X, G, model0, 20)
    batch, sgd_costs = choose_method(X, G, model0, 20, SGD(batch_size=15, momentum=0.9))
    assert sgd_costs["dense"] == pytest.approx(costs["dense"] * 15 / X.shape[0])
    assert sgd_costs["kernel"] >= sgd_costs["lazy"]
    assert full != "dense" and batch == "dense"
