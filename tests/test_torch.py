"""Cross-check of the gradient steps with PyTorch autograd."""

import numpy as np
import pytest

import corrtree as ct

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("outputs", "method"), [(1, "dense"), (1, "wtree"), (3, "dtree")])
def test_same_weights_as_torch_autograd(outputs, method):
    ds = ct.datasets.sphere(n=30, d=12, outputs=outputs, seed=1)
    model = ct.TwoLayerReLU.init(d=12, m=800, outputs=outputs, seed=2)
    W0, a, b = model.W.copy(), model.a.reshape(800, -1), model.b
    lr, iters = 4.0, 8
    hist = ct.train(model, ds.X_train, ds.y_train, method=method, lr=lr, iters=iters)

    X = torch.tensor(ds.X_train, dtype=torch.float64)
    Y = torch.tensor(ds.y_train.reshape(30, -1), dtype=torch.float64)
    A = torch.tensor(a, dtype=torch.float64)
    W = torch.tensor(W0, dtype=torch.float64, requires_grad=True)
    losses = []
    for _ in range(iters):
        out = torch.relu(X @ W.T - b) @ A / np.sqrt(800)
        loss = 0.5 * ((out - Y) ** 2).sum()
        losses.append(loss.item())
        (grad,) = torch.autograd.grad(loss, W)
        with torch.no_grad():
            W -= lr * grad
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-10)
    np.testing.assert_allclose(model.W, W.detach().numpy(), rtol=1e-10, atol=1e-12)
