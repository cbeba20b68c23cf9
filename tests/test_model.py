"""TwoLayerReLU against the defining formulas."""

import math
import os

import numpy as np
import pytest
from naive import relu_net_outputs

import corrtree as ct
from corrtree import _config


def test_default_threshold_formula():
    for m in (1, 2, 1000, 2**20):
        assert ct.default_threshold(m) == pytest.approx(math.sqrt(0.4 * math.log(m)))
    with pytest.raises(ValueError, match="m must be >= 1"):
        ct.default_threshold(0)


@pytest.mark.parametrize("outputs", [1, 3])
def test_init(outputs):
    model = ct.TwoLayerReLU.init(d=5, m=300, outputs=outputs, seed=4)
    again = ct.TwoLayerReLU.init(d=5, m=300, outputs=outputs, seed=4)
    other = ct.TwoLayerReLU.init(d=5, m=300, outputs=outputs, seed=5)
    assert model.W.shape == (300, 5) and model.outputs == outputs
    assert model.a.shape == ((300,) if outputs == 1 else (300, outputs))
    assert set(np.unique(model.a)) == {-1.0, 1.0}
    assert model.b == ct.default_threshold(300)
    np.testing.assert_array_equal(model.W, again.W)
    assert not np.array_equal(model.W, other.W)
    # W ~ N(0, I): mean and variance within 6 standard errors
    assert abs(model.W.mean()) < 6 / math.sqrt(1500)
    assert abs(model.W.var() - 1) < 6 * math.sqrt(2 / 1500)


@pytest.mark.parametrize("outputs", [1, 2])
def test_predict_loss_fire_counts(outputs, monkeypatch):
    rng = np.random.default_rng(0)
    model = ct.TwoLayerReLU.init(d=6, m=97, outputs=outputs, seed=1, b=0.3)
    X = rng.standard_normal((11, 6))
    y = rng.standard_normal((11, outputs)) if outputs > 1 else rng.standard_normal(11)
    want = relu_net_outputs(model.W, model.a, 0.3, X)
    for block_bytes in (_config.MODEL_BLOCK_BYTES, 8 * 11 * 10):  # one block, ten
        monkeypatch.setattr(_config, "MODEL_BLOCK_BYTES", block_bytes)
        pred = model.predict(X)
        assert pred.shape == ((11,) if outputs == 1 else (11, outputs))
        np.testing.assert_allclose(pred.reshape(11, -1), want, rtol=1e-12, atol=1e-14)
        assert model.loss(X, y) == pytest.approx(0.5 * np.sum((want - y.reshape(11, -1)) ** 2))
        np.testing.assert_array_equal(model.fire_counts(X), (X @ model.W.T >= 0.3).sum(axis=1))


def test_save_load_roundtrip(tmp_path):
    model = ct.TwoLayerReLU.init(d=4, m=20, outputs=3, seed=2, b=0.7)
    path = tmp_path / "m.npz"
    model.save(path)
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]  # no temporary file left behind
    back = ct.TwoLayerReLU.load(path)
    np.testing.assert_array_equal(back.W, model.W)
    np.testing.assert_array_equal(back.a, model.a)
    assert back.b == 0.7 and back.outputs == 3
    one = ct.TwoLayerReLU.init(d=4, m=20, seed=2)
    one.save(path)
    assert ct.TwoLayerReLU.load(path).a.shape == (20,)


def test_load_rejects_bad_files(tmp_path):
    model = ct.TwoLayerReLU.init(d=4, m=20, seed=2)
    good = tmp_path / "good.npz"
    model.save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(ValueError, match="cannot read model file"):
        ct.TwoLayerReLU.load(truncated)
    pickled = tmp_path / "pickled.npz"
    np.savez(
        pickled,
        format=np.array("corrtree.TwoLayerReLU/1"),
        W=np.array([object()]),
        a=np.ones(1),
        b=np.array(0.0),
    )
    with pytest.raises(ValueError, match="cannot read model file"):
        ct.TwoLayerReLU.load(pickled)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.ones(3))
    with pytest.raises(ValueError, match="not a corrtree model file"):
        ct.TwoLayerReLU.load(other)
    with pytest.raises(FileNotFoundError):
        ct.TwoLayerReLU.load(tmp_path / "missing.npz")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d": 0, "m": 3}, "d must be >= 1"),
        ({"d": 2, "m": 0}, "m must be >= 1"),
        ({"d": 2, "m": 3, "outputs": 0}, "outputs must be >= 1"),
        ({"d": 2, "m": 3, "seed": 1.5}, "seed must be an integer"),
        ({"d": 2, "m": 3, "seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"d": 2, "m": 3, "b": float("nan")}, "b must be a finite"),
    ],
)
def test_bad_init(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ct.TwoLayerReLU.init(**kwargs)


def test_init_too_large():
    with pytest.raises(MemoryError, match=r"TwoLayerReLU\.init"):
        ct.TwoLayerReLU.init(d=10**6, m=10**8)


def test_bad_construction_and_calls():
    with pytest.raises(ValueError, match="a must hold only"):
        ct.TwoLayerReLU(np.ones((3, 2)), np.array([1.0, 0.5, -1.0]))
    with pytest.raises(ValueError, match=r"a must have shape \(3,\)"):
        ct.TwoLayerReLU(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="W contains NaN"):
        ct.TwoLayerReLU(np.full((3, 2), np.nan), np.ones(3))
    model = ct.TwoLayerReLU.init(d=3, m=5)
    with pytest.raises(ValueError, match="X has 2 columns but the model has d=3"):
        model.predict(np.ones((4, 2)))
    with pytest.raises(ValueError, match="X contains NaN"):
        model.predict(np.array([[np.nan, 0, 0]]))
    with pytest.raises(ValueError, match=r"y must have shape \(4,\)"):
        model.loss(np.ones((4, 3)), np.ones(5))
    with pytest.raises(ValueError, match="y contains NaN"):
        model.loss(np.ones((1, 3)), [np.inf])
    with pytest.raises(ValueError, match=r"W must have shape \(5, 3\)"):
        model.set_weights(np.ones((5, 2)))
    with pytest.raises(ValueError, match="read-only"):
        model.W[0, 0] = 1.0
